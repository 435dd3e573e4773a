"""The scripted engine's weight updates, shaped like SGLang's: pause, load, continue.

- POST /pause_generation `{"mode": ...}`: new generation requests wait at the door until
  /continue_generation; requests already running finish (the scripted engine has no scheduler to
  freeze them in place, so every mode behaves like a drain).
- POST /update_weights_from_disk `{"model_path", "weight_version"}`: waits until no generation is
  running, then records the folder and the new version (no weights are read: this is not a model);
  answers `{"success": true, "message", "num_paused_requests"}`. Every call that starts afterwards
  reports the new `weight_version` in its meta_info.
- POST /continue_generation: lets the waiting requests in.

`generation_gate` is the middleware that holds /generate and /v1/chat/completions while paused and
counts them while they run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from polar_hpc.engines.scripted_http import MODEL, read_json
from polar_hpc.engines.scripted_model import BadRequest

GENERATION_PATHS = ("/generate", "/v1/chat/completions")


class Gate:
    """Open/closed door for generation requests, and a count of those inside."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.running = 0
        self.waiting = 0
        self.model_path: str | None = None


GATE = web.AppKey("gate", Gate)


@web.middleware
async def generation_gate(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path not in GENERATION_PATHS:
        return await handler(request)
    gate = request.app[GATE]
    gate.waiting += 1
    try:
        await gate.open.wait()
    finally:
        gate.waiting -= 1
    gate.running += 1
    gate.idle.clear()
    try:
        return await handler(request)
    finally:
        gate.running -= 1
        if gate.running == 0:
            gate.idle.set()


def add_routes(app: web.Application) -> None:
    app[GATE] = Gate()
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)


async def pause_generation(request: web.Request) -> web.Response:
    body = await read_json(request)
    mode = body.get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        raise BadRequest("'mode' must be abort, retract or in_place", "mode")
    request.app[GATE].open.clear()
    return web.json_response({"success": True})


async def continue_generation(request: web.Request) -> web.Response:
    request.app[GATE].open.set()
    return web.json_response({"success": True})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    body = await read_json(request)
    path, version = body.get("model_path"), body.get("weight_version")
    if not isinstance(path, str) or not path:
        raise BadRequest("'model_path' must be a non-empty string", "model_path")
    if version is not None and not isinstance(version, str):
        raise BadRequest("'weight_version' must be a string", "weight_version")
    gate, model = request.app[GATE], request.app[MODEL]
    await gate.idle.wait()
    gate.model_path = path
    if version is not None:
        model.weight_version = version
    message = f"loaded {path} as weight version {model.weight_version}"
    return web.json_response({"success": True, "message": message, "num_paused_requests": gate.waiting})
