"""HTTP plumbing shared by the scripted engine's routes: app keys, API key, JSON errors, body fields, SSE.

`require_key`: an app with an API key (`API_KEY`, the run's engine key, as SGLang's `--api-key`)
answers 401 to any request but GET /health that lacks `Authorization: Bearer <key>`, before its
body is read. Every refused request gets SGLang/OpenAI's error body `{"object": "error", "message", "type",
"param", "code"}`: 400 `BadRequestError` for malformed JSON or fields, the HTTP reason for other
HTTP errors (`NotFoundError`...), 500 `InternalServerError` for a bug.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from polar_hpc.engines.scripted.model import BadRequest, Generation, ScriptedModel

MODEL = web.AppKey("model", ScriptedModel)
API_KEY = web.AppKey("api_key", str)


def error_response(status: int, kind: str, message: str, param: str | None = None) -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": param, "code": status}
    return web.json_response(body, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as e:
        return error_response(400, "BadRequestError", str(e), e.param)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, e.reason.replace(" ", "") + "Error", e.reason)
    except Exception as e:  # a bug: answer like a server would, and leave a trace in the log
        print(f"scripted engine: {request.path}: {type(e).__name__}: {e}", file=sys.stderr)
        return error_response(500, "InternalServerError", f"{type(e).__name__}: {e}")


@web.middleware
async def require_key(request: web.Request, handler: Any) -> web.StreamResponse:
    key = request.app.get(API_KEY)
    if key and request.path != "/health":
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, f"Bearer {key}".encode()):
            return error_response(401, "UnauthorizedError", "this engine takes calls only with the run's API key")
    return await handler(request)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the JSON body must be an object")
    return body


def get_int(body: dict[str, Any], key: str, default: int | None, minimum: int = 0) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if type(value) is not int or value < minimum:
        raise BadRequest(f"{key!r} must be an integer >= {minimum}", key)
    return value


def get_bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{key!r} must be true or false", key)
    return value


def get_stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("'stop' must be a non-empty string or a list of them", "stop")
    return tuple(stops)


async def sse(request: web.Request, events: AsyncIterator[dict[str, Any]]) -> web.StreamResponse:
    """Send each event as `data: JSON` then `data: [DONE]`; stop quietly if the client leaves."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        async for event in events:
            await response.write(f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        pass
    return response


async def pace(gen: Generation, tokens: int, *signals: asyncio.Event) -> bool:
    """Wait until the first `tokens` output tokens are due (simulated decoding time) or one of
    `signals` is set; whether they became due first."""
    if tokens <= 0:
        return True
    if any(s.is_set() for s in signals):
        return False
    wait = gen.times[tokens - 1] - time.time()
    if wait <= 0:
        return True
    if not signals:
        await asyncio.sleep(wait)
        return True
    try:
        await asyncio.wait_for(first_set(*signals), wait)
    except asyncio.TimeoutError:
        return True
    return False


async def first_set(*events: asyncio.Event) -> None:
    """Return once one of `events` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
