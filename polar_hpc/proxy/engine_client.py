"""The proxy's HTTP/1.1 keep-alive client to one inference engine (`http://HOST:PORT[/PREFIX]`).

`EngineClient(base_url)` must be created inside the running event loop and closed with `close()`.
It keeps a pool of idle keep-alive connections (as many as calls were in flight at once); a call
takes one or opens one (`connect_timeout_s`), and gives it back once the answer was read whole.
Answers may be framed by Content-Length, chunked, or end with the connection. A pooled
connection the engine closed or reset meanwhile is replaced by a fresh one, once, before anything
was read.

`get_json(path)` GETs and `post_json(path, body)` POSTs JSON to `base_url + path` and return the
decoded JSON object, or raise `EngineError`: `status` 400 when the engine rejected the request
(its message passed on), 502 for anything else (unreachable, 5xx, not JSON, not HTTP).
`find_json(path)` is `get_json`, or None where the engine has no such route (404).
`get_text(path, max_bytes)` GETs the first `max_bytes` of a 200 answer's body as text (the
connection is closed when more was coming), with the same errors.
`stream_json(path, body)` POSTs a streaming request and yields each Server-Sent Event's decoded
JSON `data` line until `[DONE]`, with the same errors (`started` is False while nothing was
received, which is when a call may still be retried elsewhere). Every call carries the run's engine
API key (`Authorization: Bearer`, from the environment variable `security.ENGINE_KEY_ENV`, which
the gateway sets for its proxy alone) when there is one. Cancelling a call closes its
connection, which SGLang treats as an abort. There is no read timeout: sampling may take long.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import urlsplit

import msgspec

from polar_hpc.errors import PolarError
from polar_hpc.security import ENGINE_KEY_ENV

_LINE_LIMIT = 1 << 20  # the longest status, header or chunk-size line accepted
_PIECE = 1 << 16


class EngineError(PolarError):
    """The engine did not produce an answer; `status` is what the harness should get."""

    def __init__(self, status: int, message: str, started: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.started = started


class _BadAnswer(PolarError):
    """What the engine sent is not HTTP/1.x."""


_FAILURES = (OSError, EOFError, asyncio.TimeoutError, asyncio.LimitOverrunError, _BadAnswer)


class _Connection:
    """One TCP connection; `answer()` reads a response's head, `piece()` its body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.status = 0
        self.keep_alive = False
        self.done = True  # the last body was read to its end
        self._chunked = False
        self._left: int | None = None  # body bytes still to come; None: until the connection ends

    async def answer(self) -> None:
        line = await self.reader.readline()
        if not line:
            raise ConnectionResetError("connection closed before an answer")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise _BadAnswer(f"bad status line {line[:100]!r}")
        self.status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b"\n"):
            if not line:
                raise ConnectionResetError("connection closed in the middle of the answer's head")
            name, colon, value = line.partition(b":")
            if not colon:
                raise _BadAnswer(f"bad header line {line[:100]!r}")
            headers[name.strip().lower()] = value.strip().lower()
        connection = headers.get(b"connection", b"")
        self.keep_alive = connection != b"close" and (parts[0] == b"HTTP/1.1" or connection == b"keep-alive")
        self._chunked = b"chunked" in headers.get(b"transfer-encoding", b"")
        length = headers.get(b"content-length")
        if self._chunked:
            self._left = None  # chunk sizes frame the body
        elif length is not None:
            if not length.isdigit():
                raise _BadAnswer(f"bad Content-Length {length[:50]!r}")
            self._left = int(length)
        elif self.status in (204, 304):
            self._left = 0
        else:  # the body ends with the connection
            self._left, self.keep_alive = None, False
        self.done = not self._chunked and self._left == 0

    async def piece(self) -> bytes:
        """The next bytes of the body as they arrive; b"" at its end."""
        if self.done:
            return b""
        if self._chunked:
            size_line = await self.reader.readline()
            try:
                size = int(size_line.split(b";")[0], 16)
            except ValueError:
                raise _BadAnswer(f"bad chunk size line {size_line[:100]!r}") from None
            if size == 0:
                while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self.done = True
                return b""
            return (await self.reader.readexactly(size + 2))[:-2]
        data = await self.reader.read(_PIECE if self._left is None else min(self._left, _PIECE))
        if self._left is None:
            self.done = not data
        elif not data:
            raise ConnectionResetError("connection closed in the middle of the answer")
        else:
            self._left -= len(data)
            self.done = self._left == 0
        return data

    async def body(self) -> bytes:
        if self._left and not self._chunked:
            data = await self.reader.readexactly(self._left)
            self._left, self.done = 0, True
            return data
        pieces = []
        while piece := await self.piece():
            pieces.append(piece)
        return b"".join(pieces)

    def close(self) -> None:
        self.writer.close()


class EngineClient:
    def __init__(self, base_url: str, connect_timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        url = urlsplit(self.base_url)
        self._host, self._prefix, self._authority = url.hostname or "", url.path, url.netloc
        try:
            self._port = url.port or 80
        except ValueError:  # reported as unreachable by the first call
            self._port = -1
        self.connect_timeout_s = connect_timeout_s
        key = os.environ.get(ENGINE_KEY_ENV)
        self._auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self._idle: list[_Connection] = []

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def get_json(self, path: str) -> dict[str, Any]:
        return await self._call("GET", path, b"")

    async def find_json(self, path: str) -> dict[str, Any] | None:
        status, raw = await self._exchange("GET", path, b"")
        return None if status == 404 else _answer(status, raw)

    async def get_text(self, path: str, max_bytes: int) -> str:
        conn: _Connection | None = None
        pieces: list[bytes] = []
        size = 0
        try:
            conn = await self._send("GET", path, b"")
            while size < max_bytes and (piece := await conn.piece()):
                pieces.append(piece)
                size += len(piece)
        except _FAILURES as e:
            raise self._failed(e) from None
        finally:
            self._release(conn)
        raw = b"".join(pieces)[:max_bytes]
        if conn is not None and conn.status != 200:
            _answer(conn.status, raw)
        return raw.decode(errors="replace")

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", path, msgspec.json.encode(body))

    async def stream_json(self, path: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        started, conn = False, None
        try:
            conn = await self._send("POST", path, msgspec.json.encode(body))
            if conn.status != 200:
                _answer(conn.status, await conn.body())
            buffer, seen = bytearray(), 0
            while piece := await conn.piece():
                buffer += piece
                while (end := buffer.find(b"\n", seen)) >= 0:
                    line, seen = bytes(buffer[:end]), 0
                    del buffer[: end + 1]
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        await conn.body()  # its end, so the connection can be reused
                        return
                    started = True
                    try:
                        event = msgspec.json.decode(data)
                    except msgspec.DecodeError:
                        raise EngineError(502, f"engine sent a bad event: {data[:200]!r}", True) from None
                    yield event
                seen = len(buffer)
        except _FAILURES as e:
            error = self._failed(e)
            error.started = started
            raise error from None
        finally:
            self._release(conn)
        raise EngineError(502, f"engine at {self.base_url} ended the stream early", started)

    async def _call(self, method: str, path: str, payload: bytes) -> dict[str, Any]:
        return _answer(*await self._exchange(method, path, payload))

    async def _exchange(self, method: str, path: str, payload: bytes) -> tuple[int, bytes]:
        """The answer's status and body."""
        conn = None
        try:
            conn = await self._send(method, path, payload)
            raw = await conn.body()
        except _FAILURES as e:
            raise self._failed(e) from None
        finally:
            self._release(conn)
        return conn.status, raw

    async def _send(self, method: str, path: str, payload: bytes) -> _Connection:
        """A connection whose answer's head has been read."""
        head = (
            f"{method} {self._prefix}{path} HTTP/1.1\r\nHost: {self._authority}\r\n{self._auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            if reused and conn.writer.is_closing():  # the engine reset it while idle (uvloop: writing raises)
                conn.close()
                continue
            try:
                conn.writer.write(head + payload)
                await conn.answer()
                return conn
            except (ConnectionResetError, BrokenPipeError):
                conn.close()
                if not reused:
                    raise
            except BaseException:
                conn.close()
                raise

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self._host, self._port, limit=_LINE_LIMIT), self.connect_timeout_s
        )
        return _Connection(reader, writer)

    def _release(self, conn: _Connection | None) -> None:
        """Pool a connection whose answer was read whole; close any other."""
        if conn is None:
            return
        if conn.done and conn.keep_alive and not conn.reader.at_eof():
            self._idle.append(conn)
        else:
            conn.close()

    def _failed(self, e: BaseException) -> EngineError:
        what = "sent a bad answer" if isinstance(e, (_BadAnswer, asyncio.LimitOverrunError)) else "unreachable"
        return EngineError(502, f"engine at {self.base_url} {what}: {str(e) or type(e).__name__}")


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
