"""Weight updates on vLLM servers, from a checkpoint folder on disk, in one of three modes (`MODES`).

`update_engines(urls, model_path, version, mode, timeout_s, api_key)` has the contract of every
kind's (engines.updates): (the longest time an engine held generation in ms, ["URL: why"] for each
that failed). Each server: POST /pause?mode=PAUSE (`wait`: in-flight requests finish first, new ones
wait; `abort`: in-flight requests end at once with finish_reason `abort`; `continue`: vLLM's `keep`,
in-flight requests frozen in place, nothing scheduled), then /collective_rpc
`{"method": "reload_weights", "kwargs": {"weights_path": model_path}}` (every worker loads the
folder in place; the prefix cache was cleared by the pause), then `label`: /update_weight_version
`{"new_version": version}` (vLLM stamps every later engine step's tokens with it: the spans the
proxy reads on /inference/v1/generate, engines/vllm/client.py), then /resume, always, even after a
failed load (the version is then left as it was). `continue`'s frozen requests go on sampling on
the new weights, their tokens after the pause under the new version. A load that fails half-way
leaves vLLM 0.32's layers on the meta device: the server dies at its next step, its engine step
exits 1 and is restarted (then given the newest weights). So a `model_path` that is not a folder
holding `*.safetensors` here (the orchestrator's node sees the checkpoint as the engines do, on
the shared filesystem) fails the update before any engine is paused.
"""

from __future__ import annotations

import functools
from pathlib import Path

import aiohttp

from polar_hpc.engines.updates import check_mode, post, update_all

__all__ = ["MODES", "label", "update_engines"]

MODES = ("wait", "abort", "continue")
_PAUSE = {"wait": "wait", "abort": "abort", "continue": "keep"}  # our mode -> vLLM's pause mode


async def update_engines(urls: list[str], model_path: str, version: str, mode: str,
                         timeout_s: float, api_key: str | None = None) -> tuple[float, list[str]]:
    check_mode(mode, MODES)
    folder = Path(model_path)
    if not folder.is_dir() or not any(folder.glob("*.safetensors")):
        return 0.0, [f"{url}: {model_path} is no folder holding *.safetensors" for url in urls]
    one = functools.partial(_update_one, model_path=model_path, version=version, mode=mode)
    return await update_all(urls, one, timeout_s, api_key)


async def _update_one(http: aiohttp.ClientSession, url: str, model_path: str, version: str, mode: str) -> None:
    try:  # resumed even when the pause itself failed half-way (a timeout while waiting for in-flight calls)
        await post(http, f"{url}/pause", params={"mode": _PAUSE[mode]})
        await post(http, f"{url}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": model_path}})
        await label(http, url, version)
    finally:
        await post(http, f"{url}/resume")


async def label(http: aiohttp.ClientSession, url: str, version: str) -> None:
    """Set the version vLLM stamps on what it samples from now on."""
    await post(http, f"{url}/update_weight_version", {"new_version": version})
