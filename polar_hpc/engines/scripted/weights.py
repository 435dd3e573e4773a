"""The scripted engine's weight updates, shaped like SGLang's: pause, load, continue.

- POST /pause_generation `{"mode": ...}`: new generation requests wait at the door until
  /continue_generation. `abort` also ends every generation in flight at once, as SGLang does:
  its answer (or last stream event) carries the tokens so far and finish_reason
  `{"type": "abort", "message": ...}` (`"abort"` on /v1/chat/completions). `retract` and
  `in_place` freeze the generations in flight, as SGLang's scheduler stops: a token not due at
  the pause is not sampled until /continue_generation, and from then on the rest come one every
  token delay (scheduled afresh, as a retracted request is; a policy pause among them is
  dropped). A token is sampled when it is due; its event carries the version serving then
  (`ScriptedModel.version_at`), also when it is written after a pause: so an event's
  `weight_version` is the one that sampled its new tokens, as SGLang's are.
- POST /update_weights_from_disk `{"model_path", "weight_version"}`: like SGLang's write lock,
  holds new requests at the door and waits until no generation is running (unless generation is
  frozen by a pause: then, as SGLang does while paused, it loads at once), then "loads" for the
  engine's set load time (`add_routes(app, load_ms)`, `polar-hpc engine --update-load-ms`: no
  weights are read, this is not a model, but a bench can tell that fixed time from what polar-hpc
  adds around it) and records the folder and the new version; answers `{"success": true,
  "message", "num_paused_requests"}`. Every call that starts afterwards reports the new version.
- POST /continue_generation: lets the waiting requests in.
- GET /metrics (unless `add_routes(..., metrics=False)`): SGLang's `sglang:num_running_reqs` and
  `sglang:num_queue_reqs` gauges (Prometheus text), from the door's counts, and its
  `sglang:prompt_tokens_total` / `sglang:cached_tokens_total` counters, from the model's simulated
  prefix cache.

`generation_gate` is the middleware that holds /generate and /v1/chat/completions while paused and
counts them while they run; `decode(request, gen, k)` waits until a generation's first k tokens
are sampled (paced, frozen while paused) and returns how many were, fewer when it was aborted.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

import time

from polar_hpc.engines.scripted.http import MODEL, first_set, pace, read_json
from polar_hpc.engines.scripted.model import BadRequest, Generation

GENERATION_PATHS = ("/generate", "/v1/chat/completions")
ABORT_MESSAGE = "aborted by /pause_generation (mode abort)"


class Gate:
    """Open/closed door for generation requests, a count of those inside, and their abort signal."""

    def __init__(self, load_s: float = 0.0) -> None:
        self.load_s = load_s  # an update's simulated load time, with the door closed
        self.open = asyncio.Event()
        self.open.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.paused = False
        self.loading = 0
        self.running = 0
        self.waiting = 0
        self.abort = asyncio.Event()  # set (then replaced) when the running generations are aborted
        self.freeze = asyncio.Event()  # set (then replaced) when they are frozen by a pause
        self.thawed = asyncio.Event()
        self.thawed.set()
        self.frozen_at: float | None = None  # when the freeze began (time.time()); None: not frozen
        self.model_path: str | None = None

    def reopen(self) -> None:
        if not self.paused and not self.loading:
            self.open.set()

    def abort_running(self) -> None:
        self.abort.set()
        self.abort = asyncio.Event()

    def freeze_running(self) -> None:
        if self.frozen_at is None:
            self.frozen_at = time.time()
            self.thawed.clear()
            self.freeze.set()

    def thaw(self) -> None:
        if self.frozen_at is not None:
            self.frozen_at = None
            self.freeze = asyncio.Event()
            self.thawed.set()


GATE = web.AppKey("gate", Gate)
_ABORT = "abort_signal"


async def decode(request: web.Request, gen: Generation, tokens: int) -> int:
    """Wait until the first `tokens` output tokens of `gen` are sampled; how many were sampled
    before the request was aborted (all of them when it was not)."""
    gate, abort = request.app[GATE], request.get(_ABORT)
    aborts = (abort,) if abort is not None else ()
    while True:
        if gate.frozen_at is not None:
            done = sum(t <= gate.frozen_at for t in gen.times[:tokens])
            if done == tokens:
                return tokens
            await first_set(gate.thawed, *aborts)
            if abort is not None and abort.is_set():
                return done
            start, delay = time.time(), request.app[MODEL].token_delay_s
            gen.times[done:] = [start + (i + 1) * delay for i in range(len(gen.times) - done)]
            continue
        if await pace(gen, tokens, gate.freeze, *aborts):
            return tokens
        if abort is not None and abort.is_set():
            return min(tokens - 1, sum(t <= time.time() for t in gen.times[:tokens]))


@web.middleware
async def generation_gate(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path not in GENERATION_PATHS:
        return await handler(request)
    gate = request.app[GATE]
    gate.waiting += 1
    try:
        while not gate.open.is_set():
            await gate.open.wait()
    finally:
        gate.waiting -= 1
    gate.running += 1
    gate.idle.clear()
    request[_ABORT] = gate.abort
    try:
        return await handler(request)
    finally:
        gate.running -= 1
        if gate.running == 0:
            gate.idle.set()


def add_routes(app: web.Application, load_ms: float = 0.0, metrics: bool = True) -> None:
    app[GATE] = Gate(load_ms / 1000)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    if metrics:
        app.router.add_get("/metrics", engine_metrics)


async def engine_metrics(request: web.Request) -> web.Response:
    """SGLang's request gauges and prompt-token counters, by SGLang's names: generations running,
    waiting at the door, prompt tokens and those of them the prefix cache held."""
    gate, model = request.app[GATE], request.app[MODEL]
    label = f"{{model_name={json.dumps(model.model_name)}}}"
    lines = [f"# TYPE sglang:{metric} {kind}\nsglang:{metric}{label} {value}" for metric, kind, value in (
        ("num_running_reqs", "gauge", gate.running), ("num_queue_reqs", "gauge", gate.waiting),
        ("prompt_tokens_total", "counter", model.prompt_tokens),
        ("cached_tokens_total", "counter", model.cached_tokens))]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def pause_generation(request: web.Request) -> web.Response:
    body = await read_json(request)
    mode = body.get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        raise BadRequest("'mode' must be abort, retract or in_place", "mode")
    gate = request.app[GATE]
    gate.paused = True
    gate.open.clear()
    if mode == "abort":
        gate.abort_running()
    else:
        gate.freeze_running()
    return web.json_response({"success": True})


async def continue_generation(request: web.Request) -> web.Response:
    gate = request.app[GATE]
    gate.paused = False
    gate.thaw()
    gate.reopen()
    return web.json_response({"success": True})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    body = await read_json(request)
    path, version = body.get("model_path"), body.get("weight_version")
    if not isinstance(path, str) or not path:
        raise BadRequest("'model_path' must be a non-empty string", "model_path")
    if version is not None and not isinstance(version, str):
        raise BadRequest("'weight_version' must be a string", "weight_version")
    gate, model = request.app[GATE], request.app[MODEL]
    gate.loading += 1
    gate.open.clear()
    try:
        if gate.frozen_at is None:
            await gate.idle.wait()
        await asyncio.sleep(gate.load_s)
        gate.model_path = path
        if version is not None:
            model.load(version)
        paused = gate.waiting
    finally:
        gate.loading -= 1
        gate.reopen()
    message = f"loaded {path} as weight version {model.weight_version}"
    return web.json_response({"success": True, "message": message, "num_paused_requests": paused})
