"""Weight updates on SGLang-API engines (SGLang, and the scripted engine, which speaks its routes).

`update_engines(urls, model_path, version, mode, timeout_s, api_key)` updates every engine at once
and returns (the longest time an engine held generation in ms, ["URL: why"] for each that failed);
`api_key` (the run's engine API key, None: none) is sent as `Authorization: Bearer`.

- `wait`: POST /update_weights_from_disk `{"model_path", "weight_version"}` alone. SGLang takes
  the model's write lock for it, so the load waits for the generations in flight and new ones wait
  for the load: nothing is lost, the pause lasts as long as the longest call still decoding.
- `abort`: POST /pause_generation `{"mode": "abort"}` (in-flight generations end at once with
  finish_reason `{"type": "abort"}`; the proxy turns that into a retryable error for the harness),
  /update_weights_from_disk, then /continue_generation (always, even after a failed load).
- `continue`: POST /pause_generation `{"mode": "retract"}` (SGLang stops scheduling and moves the
  running generations back to its waiting queue, their KV cache freed; nothing is sampled until
  /continue_generation), /update_weights_from_disk (while paused it does not wait for the
  generations in flight), then /continue_generation: the retracted generations are prefilled
  again and go on sampling on the new weights. Each streamed event's `meta_info.weight_version`
  is the version its new tokens were sampled by (the proxy's per-token versions).
"""

from __future__ import annotations

import functools

import aiohttp

from polar_hpc.engines.updates import MODES, UpdateFailed, check_mode, post, update_all

__all__ = ["MODES", "update_engines"]


async def update_engines(urls: list[str], model_path: str, version: str, mode: str,
                         timeout_s: float, api_key: str | None = None) -> tuple[float, list[str]]:
    check_mode(mode)
    one = functools.partial(_update_one, model_path=model_path, version=version, mode=mode)
    return await update_all(urls, one, timeout_s, api_key)


_PAUSE = {"abort": "abort", "continue": "retract"}  # our mode -> SGLang's pause_generation mode


async def _update_one(http: aiohttp.ClientSession, url: str, model_path: str, version: str, mode: str) -> None:
    if mode != "wait":
        await post(http, f"{url}/pause_generation", {"mode": _PAUSE[mode]})
    try:
        answer = await post(http, f"{url}/update_weights_from_disk", {"model_path": model_path, "weight_version": version})
        if not isinstance(answer, dict) or not answer.get("success", False):
            message = answer.get("message", answer) if isinstance(answer, dict) else answer
            raise UpdateFailed(f"update_weights_from_disk: {message}")
    finally:
        if mode != "wait":
            await post(http, f"{url}/continue_generation", {})
