"""Calls the engine aborted (a weight update in `abort` mode) become a retryable error for the harness.

- `check(result, version, url)`: the engine client's `Sampled` (`engines.capture`), stamped with
  the engine's weight version as the proxy knew it when the call started if the engine reports
  none (vLLM); `Aborted` when it ended with finish abort; a malformed answer is `EngineError`
  502 (`checked(url)` turns `BadAnswer` into it around any reading of an answer).
- `answer(api, error, stream, events)`: nothing streamed yet (`stream` None): HTTP 503 with
  `Retry-After: 1` and `x-should-retry: true`, the body in the API's error shape (the openai and
  anthropic SDKs retry it). The stream began: the API's own error event, then the end of the
  stream.
- An aborted attempt leaves no record; `summary(attempts)` ((weight version, seconds) of each) is
  what the session's next record carries in meta["aborted_attempts"]: `{"count": n, "versions":
  [weight version of each], "seconds": the time from their calls' starts to their aborts, summed}`
  (the engine time they took for nothing; observe.trajectories sums it over accepted trajectories).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from aiohttp import web

from polar_hpc.errors import PolarError
from polar_hpc.engines.capture import BadAnswer, Sampled
from polar_hpc.proxy.engine_client import EngineError

RETRY_HEADERS = {"Retry-After": "1", "x-should-retry": "true"}


class Aborted(PolarError):
    def __init__(self, message: str, weight_version: str) -> None:
        super().__init__(message)
        self.message, self.weight_version = message, weight_version


def check(result: Callable[[], Sampled], version: str, url: str) -> Sampled:
    """The engine's `Sampled` (`result()`), its weight version `version` (the engine's as the
    proxy knew it when the call started) when the engine reports none; `Aborted` when it was
    aborted, `EngineError` (502) when it lacks capture fields."""
    with checked(url):
        sampled = result()
    if sampled.weight_version is None:
        sampled.weight_version = version
    if sampled.finish == "abort":
        raise Aborted(_message(sampled.message), sampled.weight_version)
    return sampled


@contextlib.contextmanager
def checked(url: str) -> Iterator[None]:
    """Reading an engine's answer: `BadAnswer` becomes `EngineError` (502, not to be retried)."""
    try:
        yield
    except BadAnswer as e:
        raise EngineError(502, f"engine at {url}: {e}", True) from None


def _message(detail: Any) -> str:
    why = f" ({detail})" if detail else ""
    return f"the engine aborted this call for a weight update{why}; retry it"


async def answer(api, error: Aborted, stream: web.StreamResponse | None, events) -> web.StreamResponse:
    if stream is None:
        body = msgspec.json.encode(api.error_body(503, error.message, "unavailable"))
        return web.Response(status=503, body=body, content_type="application/json", headers=RETRY_HEADERS)
    await stream.write(events.error(503, error.message, "unavailable"))
    await stream.write_eof()
    return stream


def summary(attempts: list[tuple[str, float]]) -> dict[str, Any]:
    return {"count": len(attempts), "versions": [v for v, _ in attempts],
            "seconds": round(sum(s for _, s in attempts), 3)}
