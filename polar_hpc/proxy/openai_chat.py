"""OpenAI Chat Completions as the proxy serves it (POST /v1/chat/completions).

- `parse(raw) -> (body, Call)`: `BadRequest` unless the body is a JSON object with a non-empty
  `messages` array of text, well-typed limits and controls, and only the fields `fields.CHAT`
  honours or lets pass; `tool_choice`, `parallel_tool_calls` and `response_format` in the `Call`'s
  own form (`constraints`), `reasoning_effort` a `Reasoning`. `top_logprobs(body)` reads OpenAI's `top_logprobs`;
  `logprob_entries(outcome)` is the reply's tokens' logprobs in OpenAI's shape.
- `response(outcome, body, model)`: the `chat.completion` object (logprobs, with the engine's top
  alternatives, only when asked; one choice per sample when n > 1, `Outcome.choices`).
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

from polar_hpc.proxy import fields
from polar_hpc.proxy.calls import (
    BadRequest, Call, Outcome, StreamEvents, ToolCall, array, assistant_message, check_messages,
    controls, decode_object, effort, number, sse, stops, usage,
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
    fields.check(fields.CHAT, body)
    if not isinstance(body.get("stream_options") or {}, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    tools = array(body, "tools")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise BadRequest(f"tools[{i}]: only function tools are supported", f"tools[{i}]")
    limit = number(body, "max_completion_tokens", int)
    n = number(body, "n", int) or 1
    if n > MAX_N or n > 1 and body.get("stream"):
        raise BadRequest(f"'n' may be 1 to {MAX_N}, and only 1 when streaming", "n")
    call = Call(
        messages=messages, tools=tools or None,
        max_tokens=limit if limit is not None else number(body, "max_tokens", int),
        stop=stops(body, "stop"), temperature=number(body, "temperature"),
        top_p=number(body, "top_p"), stream=bool(body.get("stream")),
        logprobs=bool(body.get("logprobs")), top_logprobs=top_logprobs(body),
        sampling=controls(body), tool_choice=_tool_choice(body.get("tool_choice")),
        one_call=body.get("parallel_tool_calls") is False,
        response_format=_response_format(body.get("response_format")), n=n, chat_body=body,
        reasoning=effort(body.get("reasoning_effort"), "reasoning_effort"),
    )
    return body, call


def top_logprobs(body: dict[str, Any]) -> int:
    """The `top_logprobs` asked (0-20, OpenAI's range), or BadRequest."""
    value = body.get("top_logprobs") or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 20:
        raise BadRequest("'top_logprobs' must be an integer from 0 to 20", "top_logprobs")
    return value


def _tool_choice(value: Any) -> str | dict[str, str]:
    if value is None or value in ("auto", "none", "required"):
        return value or "auto"
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return {"name": fn["name"]}
    raise BadRequest("'tool_choice' must be auto, none, required or {type: function, function: {name}}",
                     "tool_choice")


def _response_format(value: Any) -> dict[str, Any] | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    spec = value.get("json_schema") if kind == "json_schema" else None
    if isinstance(spec, dict) and isinstance(spec.get("schema", {}), dict):
        return {"type": "json_schema", "schema": spec.get("schema") or {"type": "object"}}
    raise BadRequest("'response_format' must be {type: text}, {type: json_object} or "
                     "{type: json_schema, json_schema: {name, schema}}", "response_format")


MAX_N = 16  # choices one call may ask for


def _usage(outcome: Outcome) -> dict[str, Any]:
    prompt, sampled, cached = usage(outcome)
    sampled += sum(len(c.output_ids) for c in outcome.choices)
    return {"prompt_tokens": prompt, "completion_tokens": sampled,
            "total_tokens": prompt + sampled, "prompt_tokens_details": {"cached_tokens": cached}}


def logprob_entries(outcome: Outcome, k: int) -> list[dict[str, Any]]:
    """Each sampled token's `{token, logprob, bytes, top_logprobs}`, as OpenAI's APIs give them: the
    `k` most likely alternatives, most likely first (vLLM adds the sampled token to its k when it is
    not among them)."""
    texts = outcome.token_texts or [""] * len(outcome.output_ids)
    tops = outcome.top_logprobs or [[]] * len(texts)
    return [
        {"token": t, "logprob": lp, "bytes": list(t.encode()),
         "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())}
                          for a, alp in sorted(top, key=lambda alt: -alt[1])[:k]]}
        for t, lp, top in zip(texts, outcome.output_logprobs, tops)
    ]


def _logprobs(outcome: Outcome, body: dict[str, Any]) -> dict[str, Any]:
    return {"content": logprob_entries(outcome, top_logprobs(body))}


def response(outcome: Outcome, body: dict[str, Any], model: str, call_id: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{call_id}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": i, "message": assistant_message(choice),
            "logprobs": _logprobs(choice, body) if body.get("logprobs") else None,
            "finish_reason": choice.finish_reason,
        } for i, choice in enumerate([outcome, *outcome.choices])],
        "usage": _usage(outcome),
    }


class Events(StreamEvents):
    def __init__(self, call: Call, body: dict[str, Any], model: str) -> None:
        self._head = {"id": f"chatcmpl-{call.id}", "object": "chat.completion.chunk",
                      "created": int(time.time()), "model": model}
        self._usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._body = body
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
        logprobs = _logprobs(outcome, self._body) if self._body.get("logprobs") else None
        out.append(self._chunk({}, outcome.finish_reason, logprobs))
        if self._usage:
            out.append(sse({**self._head, "choices": [], "usage": _usage(outcome)}))
        return b"".join(out) + b"data: [DONE]\n\n"

    def error(self, status: int, message: str, kind: str) -> bytes:
        return sse(error_body(status, message, kind)) + b"data: [DONE]\n\n"
