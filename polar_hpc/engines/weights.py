"""The client side of a weight update against SGLang-API engines, in one of two modes.

`update_engines(urls, model_path, version, mode, timeout_s, api_key)` updates every engine at once
and returns (the longest time an engine held generation in ms, ["URL: why"] for each that failed);
`api_key` (the run's engine API key, None: none) is sent as `Authorization: Bearer`.

- `wait`: POST /update_weights_from_disk `{"model_path", "weight_version"}` alone. SGLang takes
  the model's write lock for it, so the load waits for the generations in flight and new ones wait
  for the load: nothing is lost, the pause lasts as long as the longest call still decoding.
- `abort`: POST /pause_generation `{"mode": "abort"}` (in-flight generations end at once with
  finish_reason `{"type": "abort"}`; the proxy turns that into a retryable error for the harness),
  /update_weights_from_disk, then /continue_generation (always, even after a failed load).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

MODES = ("wait", "abort")


async def update_engines(urls: list[str], model_path: str, version: str, mode: str,
                         timeout_s: float, api_key: str | None = None) -> tuple[float, list[str]]:
    if mode not in MODES:
        raise ValueError(f"weight update mode {mode!r} is not known ({', '.join(MODES)})")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers) as http:
        results = await asyncio.gather(*(_update_one(http, url, model_path, version, mode) for url in urls))
    pauses = [pause for pause, _ in results]
    return max(pauses, default=0.0), [f"{url}: {err}" for url, (_, err) in zip(urls, results) if err]


async def _update_one(http: aiohttp.ClientSession, url: str, model_path: str, version: str,
                      mode: str) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    error = None
    try:
        if mode == "abort":
            await _post(http, f"{url}/pause_generation", {"mode": "abort"})
        try:
            answer = await _post(http, f"{url}/update_weights_from_disk",
                                 {"model_path": model_path, "weight_version": version})
            if not answer.get("success", False):
                error = f"update_weights_from_disk: {answer.get('message', answer)}"
        finally:
            if mode == "abort":
                await _post(http, f"{url}/continue_generation", {})
    except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as e:
        error = error or f"{type(e).__name__}: {e}"
    return (time.perf_counter() - t0) * 1000, error


async def _post(http: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with http.post(url, json=body) as response:
        if response.status >= 400:
            raise RuntimeError(f"{url} answered {response.status}: {(await response.text())[:300]}")
        return await response.json(content_type=None)
