"""OpenAI Chat Completions as the proxy serves it in passthrough capture mode (pure functions).

- `parse_request(raw)`: the harness's JSON body; `BadRequest` (-> HTTP 400) when it is not a JSON
  object with a non-empty `messages` array (and an object `stream_options`, if any), or
  asks for more than one choice.
- `engine_request(request, model)`: the body to POST to the engine's `ENGINE_PATH`: the harness's
  body with `model` set to the served model, `stream: false`, `return_token_ids` and `logprobs` on.
- `capture(answer)`: prompt ids, sampled ids (end-of-turn token included), their logprobs, finish
  reason and weight version from an SGLang-shaped answer; `EngineError` (502) if any is missing.
- `harness_response(answer, request)`: the answer without our extras (token ids, `metadata`, and
  `logprobs` unless the harness asked for them): exactly what the harness is sent.
- `sse_events(response, request)`: that same response as `chat.completion.chunk` Server-Sent
  Events (role, other message fields, content, one delta per tool call, finish reason, usage when
  `stream_options.include_usage`, `[DONE]`), which OpenAI SDKs assemble back into the message.
- `error_body(message, type, code, param)`: OpenAI's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from polar_hpc.proxy.engine_client import EngineError

API = "openai_chat"
ENGINE_PATH = "/v1/chat/completions"

_EXTRA_CHOICE_KEYS = ("prompt_token_ids", "response_token_ids")
_STREAMED_APART = ("role", "content", "tool_calls")


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Capture:
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    weight_version: str


def error_body(
    message: str,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def parse_request(raw: bytes) -> dict[str, Any]:
    try:
        request = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(request, dict):
        raise BadRequest("request body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array", "messages")
    if request.get("n") not in (None, 1):
        raise BadRequest("only n=1 is supported", "n")
    if not isinstance(request.get("stream_options") or {}, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    return request


def engine_request(request: dict[str, Any], model: str) -> dict[str, Any]:
    body = {k: v for k, v in request.items() if k != "stream_options"}
    body.update(model=model, stream=False, return_token_ids=True, logprobs=True)
    return body


def capture(answer: dict[str, Any]) -> Capture:
    try:
        choice = answer["choices"][0]
        found = Capture(
            prompt_ids=msgspec.convert(choice["prompt_token_ids"], list[int]),
            output_ids=msgspec.convert(choice["response_token_ids"], list[int]),
            output_logprobs=[
                msgspec.convert(entry["logprob"], float) for entry in choice["logprobs"]["content"]
            ],
            finish_reason=msgspec.convert(choice["finish_reason"], str),
            weight_version=msgspec.convert(answer["metadata"]["weight_version"], str),
        )
    except (KeyError, IndexError, TypeError, msgspec.ValidationError) as e:
        problem = f"{type(e).__name__}: {e}"
        raise EngineError(502, f"engine answer lacks capture fields ({problem})") from None
    n_logprobs, n_ids = len(found.output_logprobs), len(found.output_ids)
    if n_logprobs != n_ids:
        raise EngineError(502, f"engine returned {n_logprobs} logprobs for {n_ids} tokens")
    return found


def harness_response(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    keep_logprobs = bool(request.get("logprobs"))
    response = {k: v for k, v in answer.items() if k != "metadata"}
    response["choices"] = [
        {
            **{k: v for k, v in choice.items() if k not in _EXTRA_CHOICE_KEYS},
            "logprobs": choice.get("logprobs") if keep_logprobs else None,
        }
        for choice in answer["choices"]
    ]
    return response


def sse_events(response: dict[str, Any], request: dict[str, Any]) -> bytes:
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    head: dict[str, Any] = {
        "id": response.get("id"),
        "object": "chat.completion.chunk",
        "created": response.get("created"),
        "model": response.get("model"),
    }
    if "system_fingerprint" in response:
        head["system_fingerprint"] = response["system_fingerprint"]
    if include_usage:
        head["usage"] = None
    chunks = []
    for choice in response["choices"]:
        for delta, extra in _choice_deltas(choice):
            piece = {"index": choice["index"], "delta": delta, **extra}
            chunks.append({**head, "choices": [piece]})
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response.get("usage")})
    events = [b"data: " + msgspec.json.encode(chunk) + b"\n\n" for chunk in chunks]
    return b"".join(events) + b"data: [DONE]\n\n"


def _choice_deltas(choice: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(delta, other choice fields) for each chunk of one choice, in stream order."""
    message = choice["message"]
    content = message.get("content")
    first: dict[str, Any] = {"role": message.get("role", "assistant")}
    if isinstance(content, str):
        first["content"] = ""
    deltas = [(first, {"logprobs": choice.get("logprobs"), "finish_reason": None})]
    none = {"logprobs": None, "finish_reason": None}
    for key, value in message.items():
        if key not in _STREAMED_APART and value is not None:
            deltas.append(({key: value}, none))
    if content:
        deltas.append(({"content": content}, none))
    for i, call in enumerate(message.get("tool_calls") or []):
        delta_call = {
            "index": i,
            "id": call.get("id"),
            "type": call.get("type", "function"),
            "function": call.get("function"),
        }
        deltas.append(({"tool_calls": [delta_call]}, none))
    deltas.append(({}, {"logprobs": None, "finish_reason": choice.get("finish_reason")}))
    return deltas
