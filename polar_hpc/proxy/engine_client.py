"""The proxy's one pooled HTTP client to its inference engine.

`EngineClient(base_url)` must be created inside the running event loop and closed with `close()`.
`get_json(path)` GETs and `post_json(path, body)` POSTs JSON to `base_url + path` over keep-alive connections and returns the
decoded JSON object, or raises `EngineError`: `status` 400 when the engine rejected the request
(its message passed on), 502 for anything else (unreachable, 5xx, not JSON). `stream_json(path,
body)` POSTs a streaming request and yields each Server-Sent Event's decoded JSON `data` until
`[DONE]`, with the same errors (`started` is False while nothing was received, which is when a
call may still be retried elsewhere). Cancelling a call aborts its upstream request (the
connection is dropped, which SGLang treats as an abort).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec


class EngineError(Exception):
    """The engine did not produce an answer; `status` is what the harness should get."""

    def __init__(self, status: int, message: str, started: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.started = started


class EngineClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )

    async def close(self) -> None:
        await self._http.close()

    async def get_json(self, path: str) -> dict[str, Any]:
        try:
            async with self._http.get(self.base_url + path) as resp:
                raw, status = await resp.read(), resp.status
        except (aiohttp.ClientError, OSError) as e:
            raise self._unreachable(e) from None
        return _answer(status, raw)

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self._post(path, body) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, OSError) as e:
            raise self._unreachable(e) from None
        return _answer(status, raw)

    async def stream_json(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        started = False
        try:
            async with self._post(path, body) as resp:
                if resp.status != 200:
                    _answer(resp.status, await resp.read())
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    started = True
                    try:
                        event = msgspec.json.decode(data)
                    except msgspec.DecodeError:
                        raise EngineError(502, f"engine sent a bad event: {data[:200]!r}", True) from None
                    yield event
        except (aiohttp.ClientError, OSError) as e:
            error = self._unreachable(e)
            error.started = started
            raise error from None
        raise EngineError(502, f"engine at {self.base_url} ended the stream early", started)

    def _post(self, path: str, body: dict[str, Any]):
        return self._http.post(
            self.base_url + path, data=msgspec.json.encode(body),
            headers={"Content-Type": "application/json"},
        )

    def _unreachable(self, e: Exception) -> EngineError:
        return EngineError(502, f"engine at {self.base_url} unreachable: {e}")


def _answer(status: int, raw: bytes) -> dict[str, Any]:
    """The decoded JSON object of a 200 answer; else the EngineError it stands for."""
    try:
        answer = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        answer = None
    if status == 200 and isinstance(answer, dict):
        return answer
    if status == 400:
        raise EngineError(400, _message(answer) or raw.decode(errors="replace"))
    detail = _message(answer) or raw[:200].decode(errors="replace")
    raise EngineError(502, f"engine answered HTTP {status}: {detail}")


def _message(answer: Any) -> str | None:
    """The error message in an OpenAI-style (`{"error": {...}}`) or SGLang-style error body."""
    if not isinstance(answer, dict):
        return None
    inner = answer.get("error")
    if isinstance(inner, dict):
        answer = inner
    message = answer.get("message")
    return message if isinstance(message, str) else None
