"""OpenAI Chat Completions as the proxy serves it (POST /v1/chat/completions).

- `parse(raw) -> (body, Call)`: `BadRequest` unless the body is a JSON object with a non-empty
  `messages` array, n=1, and well-typed limits.
- `response(outcome, body, model)`: the `chat.completion` object (logprobs only when asked).
- `Events(call, body, model)`: the same answer as `chat.completion.chunk` events while it is
  sampled (a `StreamEvents`): `start()` (the role), `text(delta)` (content as it arrives),
  `tool_call(call, index)` (one `delta.tool_calls` entry with id, name and all the arguments, once
  the call is complete), `end(outcome)` (calls not streamed yet, the finish reason, usage when
  `stream_options.include_usage`, `[DONE]`), `error(...)` (an error event once the stream began).
- `error_body(status, message, kind)`: OpenAI's error shape; `token(headers)`: the Bearer key.
"""

from __future__ import annotations

import time
from typing import Any

from polar_hpc.proxy.calls import (
    BadRequest, Call, Outcome, StreamEvents, ToolCall, array, assistant_message, check_messages,
    decode_object, number, sse, stops, usage,
)

API = "openai_chat"
PATH = "/v1/chat/completions"

_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "not_found": ("invalid_request_error", "model_not_found"),
    "upstream": ("upstream_error", None),
    "unavailable": ("server_error", None),
    "too_large": ("invalid_request_error", "request_too_large"),
}


def token(headers) -> str | None:
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    type_, code = _TYPES[kind]
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def parse(raw: bytes) -> tuple[dict[str, Any], Call]:
    body = decode_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array of objects", "messages")
    check_messages(messages)
    if body.get("n") not in (None, 1):
        raise BadRequest("only n=1 is supported", "n")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    tools = array(body, "tools")
    if not all(isinstance(t, dict) for t in tools):
        raise BadRequest("'tools' must be an array of objects", "tools")
    limit = number(body, "max_completion_tokens", int)
    call = Call(
        messages=messages, tools=tools or None,
        max_tokens=limit if limit is not None else number(body, "max_tokens", int),
        stop=stops(body, "stop"), temperature=number(body, "temperature"),
        top_p=number(body, "top_p"), stream=bool(body.get("stream")),
        logprobs=bool(body.get("logprobs")), chat_body=body,
    )
    return body, call


def _usage(outcome: Outcome) -> dict[str, Any]:
    prompt, sampled, cached = usage(outcome)
    return {"prompt_tokens": prompt, "completion_tokens": sampled,
            "total_tokens": prompt + sampled, "prompt_tokens_details": {"cached_tokens": cached}}


def _logprobs(outcome: Outcome) -> dict[str, Any]:
    texts = outcome.token_texts or [""] * len(outcome.output_ids)
    return {"content": [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(texts, outcome.output_logprobs)
    ]}


def response(outcome: Outcome, body: dict[str, Any], model: str, call_id: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{call_id}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0, "message": assistant_message(outcome),
            "logprobs": _logprobs(outcome) if body.get("logprobs") else None,
            "finish_reason": outcome.finish_reason,
        }],
        "usage": _usage(outcome),
    }


class Events(StreamEvents):
    def __init__(self, call: Call, body: dict[str, Any], model: str) -> None:
        self._head = {"id": f"chatcmpl-{call.id}", "object": "chat.completion.chunk",
                      "created": int(time.time()), "model": model}
        self._usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._logprobs = bool(body.get("logprobs"))
        if self._usage:
            self._head["usage"] = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs=None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse({**self._head, "choices": [choice]})

    def start(self) -> bytes:
        return self._chunk({"role": "assistant"})

    def text(self, delta: str) -> bytes:
        return self._chunk({"content": delta})

    def tool_call(self, call: ToolCall, index: int) -> bytes:
        return self._chunk({"tool_calls": [{
            "index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }]})

    def end(self, outcome: Outcome) -> bytes:
        out = [self.unsent(outcome)]
        logprobs = _logprobs(outcome) if self._logprobs else None
        out.append(self._chunk({}, outcome.finish_reason, logprobs))
        if self._usage:
            out.append(sse({**self._head, "choices": [], "usage": _usage(outcome)}))
        return b"".join(out) + b"data: [DONE]\n\n"

    def error(self, status: int, message: str, kind: str) -> bytes:
        return sse(error_body(status, message, kind)) + b"data: [DONE]\n\n"
