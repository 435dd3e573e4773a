"""Weight updates on vLLM servers, from a checkpoint folder on disk, in one of two modes (`MODES`).

`update_engines(urls, model_path, version, mode, timeout_s, api_key)` has the contract of every
kind's (engines.updates): (the longest time an engine held generation in ms, ["URL: why"] for each
that failed). Each server: POST /pause?mode=MODE (`wait`: in-flight requests finish first, new ones
wait; `abort`: in-flight requests end at once with finish_reason `abort`), then /collective_rpc
`{"method": "reload_weights", "kwargs": {"weights_path": model_path}}` (every worker loads the
folder in place; the prefix cache was cleared by the pause), then /resume, always, even after a
failed load. A load that fails half-way leaves vLLM 0.32's layers on the meta device: the server
dies at its next step, its engine step exits 1 and is restarted (then given the newest weights).
So a `model_path` that is not a folder holding `*.safetensors` here (the orchestrator's node sees
the checkpoint as the engines do, on the shared filesystem) fails the update before any engine is
paused. vLLM's own version label (/update_weight_version) is not set: `version` is the
orchestrator's to record (EngineHello, the registry) and the proxy's to stamp on each call. That
is also why there is no `continue` mode here: `/pause?mode=keep` would freeze the calls in flight
and /resume continue them, but the route the proxy samples on (/v1/completions) reports no
version, so the proxy could not tell which of a call's tokens came before the update
(docs/service.md: vLLM's /inference/v1/generate would).
"""

from __future__ import annotations

import functools
from pathlib import Path

import aiohttp

from polar_hpc.engines.updates import check_mode, post, update_all

__all__ = ["MODES", "update_engines"]

MODES = ("wait", "abort")


async def update_engines(urls: list[str], model_path: str, version: str, mode: str,
                         timeout_s: float, api_key: str | None = None) -> tuple[float, list[str]]:
    check_mode(mode, MODES)
    folder = Path(model_path)
    if not folder.is_dir() or not any(folder.glob("*.safetensors")):
        return 0.0, [f"{url}: {model_path} is no folder holding *.safetensors" for url in urls]
    return await update_all(urls, functools.partial(_update_one, model_path=model_path, mode=mode), timeout_s, api_key)


async def _update_one(http: aiohttp.ClientSession, url: str, model_path: str, mode: str) -> None:
    try:  # resumed even when the pause itself failed half-way (a timeout while waiting for in-flight calls)
        await post(http, f"{url}/pause", params={"mode": mode})
        await post(http, f"{url}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": model_path}})
    finally:
        await post(http, f"{url}/resume")
