"""The proxy's one pooled HTTP client to its inference engine.

`EngineClient(base_url)` must be created inside the running event loop and closed with `close()`.
`post_json(path, body)` POSTs JSON to `base_url + path` over keep-alive connections and returns the
decoded JSON object, or raises `EngineError`: `status` 400 when the engine rejected the request
(its message passed on), 502 for anything else (unreachable, 5xx, not JSON). Cancelling a call
aborts its upstream request (the connection is dropped, which SGLang treats as an abort).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec


class EngineError(Exception):
    """The engine did not produce an answer; `status` is what the harness should get."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class EngineClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )

    async def close(self) -> None:
        await self._http.close()

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        try:
            async with self._http.post(
                url, data=msgspec.json.encode(body), headers={"Content-Type": "application/json"}
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, OSError) as e:
            raise EngineError(502, f"engine at {self.base_url} unreachable: {e}") from None
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
