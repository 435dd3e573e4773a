"""The scripted engine: a deterministic CPU test/demo engine with SGLang's HTTP API. Not a model.

It exists so the proxy, gateway and tests run on laptops and in CI exactly as they would against
SGLang. Replies come from regex rules over the prompt text (`policy.py`), tokens from a small
byte-level BPE with a ChatML template (`chat_format.py`), logprobs from a hash.

Routes: POST /generate (SGLang native, streaming or not; of SGLang's fields and sampling parameters
it refuses those it cannot honour, constrained decoding, logit bias and top logprobs among them,
and any SGLang does not know), POST /v1/chat/completions (OpenAI Chat
with tools, logprobs and SGLang's `return_token_ids`; in `chat.py`), GET /health,
GET /get_model_info, GET /v1/models, SGLang's weight-update routes (/pause_generation,
/update_weights_from_disk, /continue_generation; in `weights.py`) and GET /metrics (in
`weights.py`; not served with `metrics` off). With the environment
variable `security.ENGINE_KEY_ENV` set (the run's engine API key), every route but /health demands
it as `Authorization: Bearer`, like SGLang's `--api-key`. `serve(options)` blocks: it listens
(port 0: a free port), writes `{"url": ...}` to the ready file atomically, and returns after
SIGTERM/SIGINT. A bad rules file raises ConfigError before anything listens. It queues up to
`BACKLOG` connections not yet accepted, as SGLang's server does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from polar_hpc import procs
from polar_hpc.config import SCRIPTED_CONTEXT
from polar_hpc.engines.scripted.chat_format import ChatFormat
from polar_hpc.engines.scripted.policy import Policy
from polar_hpc.engines.scripted.chat import chat_completions
from polar_hpc.engines.scripted.http import (
    API_KEY, MODEL, get_bool, get_int, get_stop, json_errors, read_json, require_key, sse,
)
from polar_hpc.engines.scripted.model import BadRequest, Generation, SamplingParams, ScriptedModel
from polar_hpc.engines.scripted.weights import add_routes as add_weight_routes
from polar_hpc.engines.scripted.weights import ABORT_MESSAGE, decode, generation_gate
from polar_hpc.security import ENGINE_KEY_ENV

BACKLOG = 2048  # connections queued before they are accepted, as SGLang's server (uvicorn) has


@dataclass(frozen=True)
class ScriptedOptions:
    host: str = "127.0.0.1"
    port: int = 0
    ready_file: Path | None = None
    script: Path | None = None  # rules YAML; None: the built-in calculator rules
    weight_version: str = "v0"
    sample_log: Path | None = None
    token_delay_ms: float = 0.0
    update_load_ms: float = 0.0  # simulated load time of a weight update (weights.py)
    context_length: int = SCRIPTED_CONTEXT
    model_name: str = "polar-scripted"
    metrics: bool = True  # serve /metrics (weights.py); False: 404, as SGLang without --enable-metrics


def serve(options: ScriptedOptions) -> None:
    """Run the engine until SIGTERM/SIGINT."""
    model = ScriptedModel(
        ChatFormat(), Policy.load(options.script), weight_version=options.weight_version,
        context_length=options.context_length, model_name=options.model_name,
        token_delay_ms=options.token_delay_ms, sample_log=options.sample_log,
    )
    try:
        app = build_app(model, os.environ.get(ENGINE_KEY_ENV), options.update_load_ms, options.metrics)
        asyncio.run(_serve(options, app))
    finally:
        model.close()


def build_app(model: ScriptedModel, api_key: str | None = None, update_load_ms: float = 0.0,
              metrics: bool = True) -> web.Application:
    app = web.Application(middlewares=[json_errors, require_key, generation_gate], client_max_size=64 * 2**20)
    app[MODEL] = model
    if api_key:
        app[API_KEY] = api_key
    app.router.add_get("/health", health)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", chat_completions)
    add_weight_routes(app, update_load_ms, metrics)
    return app


async def _serve(options: ScriptedOptions, app: web.Application) -> None:
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, options.host, options.port, backlog=BACKLOG).start()
        url = f"http://{options.host}:{runner.addresses[0][1]}"
        if options.ready_file is not None:
            procs.write_ready(Path(options.ready_file), {"url": url})
        print(f"scripted engine listening on {url}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


async def health(request: web.Request) -> web.Response:
    return web.Response()


async def model_info(request: web.Request) -> web.Response:
    model = request.app[MODEL]
    return web.json_response({
        "model_path": model.model_name, "tokenizer_path": str(model.fmt.folder),
        "is_generation": True, "weight_version": model.weight_version,
    })


async def list_models(request: web.Request) -> web.Response:
    model = request.app[MODEL]
    card = {
        "id": model.model_name, "object": "model", "created": 0, "owned_by": "polar-hpc",
        "root": model.model_name, "max_model_len": model.context_length,
    }
    return web.json_response({"object": "list", "data": [card]})


async def generate(request: web.Request) -> web.StreamResponse:
    """SGLang's native /generate for one prompt (`text` or `input_ids`)."""
    started = time.perf_counter()
    model = request.app[MODEL]
    body = await read_json(request)
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise BadRequest("'sampling_params' must be an object", "sampling_params")
    refuse_unhonoured(body, sampling)
    stop_ids = sampling.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(type(i) is int for i in stop_ids):
        raise BadRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids")
    params = SamplingParams(
        max_new_tokens=get_int(sampling, "max_new_tokens", 128),
        stop=get_stop(sampling),
        stop_token_ids=frozenset(stop_ids),
        skip_special_tokens=get_bool(sampling, "skip_special_tokens", True),
    )
    rid = body.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise BadRequest("'rid' must be a string (one request per call)", "rid")
    with_logprobs, stream = get_bool(body, "return_logprob"), get_bool(body, "stream")
    gen = model.generate("/generate", rid, _prompt_ids(body, model.fmt), params, started)
    if not stream:
        k = await decode(request, gen, len(gen.output_ids))
        return web.json_response(_generate_body(model, gen, k, with_logprobs, k < len(gen.output_ids)))
    return await sse(request, _generate_chunks(request, gen, with_logprobs))


async def _generate_chunks(request: web.Request, gen: Generation, with_logprobs: bool) -> AsyncIterator[dict[str, Any]]:
    """One cumulative /generate body per output token (one in all if there is none), made as the
    token is sampled (its `weight_version` the one that sampled it); an aborted generation ends
    with a body of the tokens so far and finish_reason abort."""
    model = request.app[MODEL]
    for k in range(1, len(gen.output_ids) + 1) if gen.output_ids else [0]:
        if await decode(request, gen, k) < k:
            yield _generate_body(model, gen, k - 1, with_logprobs, aborted=True)
            return
        yield _generate_body(model, gen, k, with_logprobs)


# SGLang's /generate fields and sampling parameters the scripted engine honours. Its policy puts all
# mass on one reply, which temperature, top-p, top-k, min-p, the penalties and a seed leave as it is.
GENERATE_FIELDS = frozenset({"text", "input_ids", "sampling_params", "rid", "return_logprob", "stream",
                             "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs"})
SAMPLING_PARAMS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "skip_special_tokens", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "sampling_seed", "n",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
})
# SGLang's that it cannot honour: refused, never ignored
UNHONOURED = {"json_schema": "constrained decoding", "regex": "constrained decoding",
              "ebnf": "constrained decoding", "structural_tag": "constrained decoding",
              "logit_bias": "a logit bias", "min_new_tokens": "a minimum length", "ignore_eos": "ignoring eos",
              "custom_params": "custom logit processors"}


def refuse_unhonoured(body: dict[str, Any], sampling: dict[str, Any]) -> None:
    """BadRequest for a field SGLang takes that this engine cannot honour, or one SGLang lacks."""
    for key, value in sampling.items():
        if key in UNHONOURED and value not in (None, False, {}):
            raise BadRequest(f"the scripted engine cannot do {UNHONOURED[key]} ({key!r})", key)
        if key not in SAMPLING_PARAMS and key not in UNHONOURED:
            raise BadRequest(f"unknown sampling parameter {key!r}", key)
    if sampling.get("n", 1) not in (None, 1):
        raise BadRequest("the scripted engine samples one reply per request (n=1)", "n")
    for key in body:
        if key not in GENERATE_FIELDS:
            raise BadRequest(f"unknown /generate field {key!r}", key)
    if body.get("top_logprobs_num"):
        raise BadRequest("the scripted engine has no alternatives to return (top_logprobs_num)", "top_logprobs_num")


def _prompt_ids(body: dict[str, Any], fmt: ChatFormat) -> list[int]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("give exactly one of 'text' and 'input_ids'")
    if text is not None:
        if not isinstance(text, str):
            raise BadRequest("'text' must be a string (batches are not supported)", "text")
        ids = fmt.encode(text)
    elif not isinstance(ids, list) or not all(
        type(i) is int and 0 <= i < fmt.vocab_size for i in ids
    ):
        raise BadRequest(
            f"'input_ids' must be a list of token ids in [0, {fmt.vocab_size}) "
            "(batches are not supported)", "input_ids",
        )
    if not ids:
        raise BadRequest("the prompt is empty")
    return ids


def _generate_body(model: ScriptedModel, gen: Generation, k: int, with_logprobs: bool,
                   aborted: bool = False) -> dict:
    """The /generate response (or cumulative stream chunk) after k output tokens."""
    finish = gen.finish_reason if k == len(gen.output_ids) else None
    if aborted:
        finish = {"type": "abort", "message": ABORT_MESSAGE}
    meta: dict[str, Any] = {
        "id": gen.rid,
        "finish_reason": finish,
        "prompt_tokens": len(gen.prompt_ids),
        "completion_tokens": k,
        "cached_tokens": gen.cached_tokens,
        "weight_version": model.version_at(gen.times[k - 1]) if k else model.weight_version,
        "e2e_latency": time.perf_counter() - gen.started,
    }
    if with_logprobs:
        meta["output_token_logprobs"] = [
            [lp, token, None] for lp, token in zip(gen.logprobs[:k], gen.output_ids[:k])
        ]
    return {"text": gen.texts[k], "output_ids": gen.output_ids[:k], "meta_info": meta}
