"""Calls the engine aborted (a weight update in `abort` mode) become a retryable error for the harness.

- `check_generate(answer)` / `check_chat(answer)`: raise `Aborted` when an engine answer (SGLang
  /generate, or its last stream event; /v1/chat/completions) ends with finish_reason abort.
- `answer(api, error, stream, events)`: nothing streamed yet (`stream` None): HTTP 503 with
  `Retry-After: 1` and `x-should-retry: true`, the body in the API's error shape (the openai and
  anthropic SDKs retry it). The stream began: the API's own error event, then the end of the
  stream.
- An aborted attempt leaves no record; `summary(versions)` is what the session's next record
  carries in meta["aborted_attempts"]: `{"count": n, "versions": [weight version of each]}`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

RETRY_HEADERS = {"Retry-After": "1", "x-should-retry": "true"}


class Aborted(Exception):
    def __init__(self, message: str, weight_version: str) -> None:
        super().__init__(message)
        self.message, self.weight_version = message, weight_version


def check_generate(answer: dict[str, Any]) -> None:
    meta = answer.get("meta_info") or {}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise Aborted(_message(finish.get("message")), str(meta.get("weight_version", "")))


def check_chat(answer: dict[str, Any]) -> None:
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            and choices[0].get("finish_reason") == "abort":
        version = (answer.get("metadata") or {}).get("weight_version", "")
        raise Aborted(_message(None), str(version))


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


def summary(versions: list[str]) -> dict[str, Any]:
    return {"count": len(versions), "versions": list(versions)}
