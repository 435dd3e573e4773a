"""The fan-out of a weight update over engines, shared by every kind's `weights.update_engines`.

`update_all(urls, update_one, timeout_s, api_key)` runs `update_one(http, url)` for every engine at
once over one HTTP session (`api_key`, None: none, sent as `Authorization: Bearer`; `timeout_s`
bounds the whole update) and returns (the longest time an engine held generation in ms,
["URL: why"] for each that failed). `update_one` raises `UpdateFailed` (or an HTTP error) when its
engine did not load the weights; `post` raises `UpdateFailed` on an HTTP error status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from polar_hpc.errors import PolarError

MODES = ("wait", "abort", "continue")  # every mode of some kind; each kind's weights.MODES has its own


class UpdateFailed(PolarError):
    """An engine answered, but did not do what was asked."""


def check_mode(mode: str, modes: tuple[str, ...] = MODES) -> None:
    if mode not in modes:
        raise ValueError(f"weight update mode {mode!r} is not known ({', '.join(modes)})")


async def update_all(urls: list[str], update_one: Callable[[aiohttp.ClientSession, str], Awaitable[None]],
                     timeout_s: float, api_key: str | None) -> tuple[float, list[str]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    # a connection per request: a server that failed a request may close its connection under the next one
    # (vLLM after a failed load), and the resume that must follow may not be lost on it
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers,
                                     connector=connector) as http:
        results = await asyncio.gather(*(_timed(update_one, http, url) for url in urls))
    return max((pause for pause, _ in results), default=0.0), [f"{u}: {err}" for u, (_, err) in zip(urls, results) if err]


async def _timed(update_one: Callable[[aiohttp.ClientSession, str], Awaitable[None]], http: aiohttp.ClientSession,
                 url: str) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        await update_one(http, url)
        error = None
    except (aiohttp.ClientError, asyncio.TimeoutError, UpdateFailed) as e:
        error = f"{type(e).__name__}: {e}" if not isinstance(e, UpdateFailed) else str(e)
    return (time.perf_counter() - t0) * 1000, error


async def post(http: aiohttp.ClientSession, url: str, body: dict | None = None,
               params: dict[str, str] | None = None) -> Any:
    """POST JSON `body` to `url`; the answer's JSON (None: an empty body)."""
    async with http.post(url, json=body if body is not None else {}, params=params) as response:
        text = await response.text()
        if response.status >= 400:
            raise UpdateFailed(f"{url} answered {response.status}: {text[:300]}")
        return await response.json(content_type=None) if text.strip() else None
