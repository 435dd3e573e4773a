"""Anthropic Messages as the proxy serves it (POST /v1/messages).

- `parse(raw) -> (body, Call)`: `system` (a string or text blocks) and `messages` (string content,
  or `text` / `tool_use` / `tool_result` blocks; `thinking` blocks are skipped) become Chat
  messages (a user turn's tool results become `tool` messages; a `system` turn, as Claude Code
  sends mid-conversation, stays a system message); custom `tools` become Chat tools (server tools
  are refused), `tool_choice`, `output_config.format` and `thinking` the `Call`'s own form; image and document
  blocks, and fields `fields.ANTHROPIC` refuses or does not know, are a BadRequest; `max_tokens` is
  required, as Anthropic requires it.
- `response(outcome, body, model, call_id)`: the `message` object (`text` and `tool_use` blocks,
  `stop_reason` end_turn | tool_use | max_tokens, usage).
- `Events` (a `StreamEvents`): message_start, a text block streamed as `text_delta`s while
  sampled, one `tool_use` block per call as soon as it is complete (`content_block_start`, its
  input as one `input_json_delta`, `content_block_stop`), message_delta, message_stop; `error`.
- `error_body(status, message, kind)`: Anthropic's `{"type": "error", "error": {...}}`;
  `token(headers)`: `x-api-key`, else the Bearer key.
"""

from __future__ import annotations

import json
from typing import Any

from polar_hpc.proxy import fields
from polar_hpc.proxy.calls import (
    BadRequest, Call, Outcome, Reasoning, StreamEvents, ToolCall, array, controls, decode_object, not_text,
    number, sse, stops, text_of, usage,
)
from polar_hpc.proxy.openai_chat import token as bearer

API = "anthropic_messages"
PATH = "/v1/messages"

_TYPES = {
    "invalid_request": "invalid_request_error", "context_length": "invalid_request_error",
    "authentication": "authentication_error", "not_found": "not_found_error",
    "upstream": "api_error", "unavailable": "overloaded_error", "too_large": "request_too_large",
}
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def token(headers) -> str | None:
    return headers.get("x-api-key") or bearer(headers)


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _TYPES[kind], "message": message}}


def parse(raw: bytes) -> tuple[dict[str, Any], Call]:
    body = decode_object(raw)
    fields.check(fields.ANTHROPIC, body)
    max_tokens = number(body, "max_tokens", int)
    if max_tokens is None:
        raise BadRequest("max_tokens: Field required", "max_tokens")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequest("messages: must be a non-empty array", "messages")
    for i, turn in enumerate(turns):
        _add_turn(messages, turn, f"messages.{i}")
    chat_tools = []
    for i, t in enumerate(array(body, "tools")):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or not isinstance(t.get("name"), str) \
                or not isinstance(t.get("input_schema"), dict):
            raise BadRequest(f"tools.{i}: only custom tools (name, input_schema) are supported", f"tools.{i}")
        fn = {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}
        if t.get("strict") is True:
            fn["strict"] = True
        chat_tools.append({"type": "function", "function": fn})
    choice, one_call = _tool_choice(body.get("tool_choice"))
    call = Call(
        messages=messages, tools=chat_tools or None, max_tokens=max_tokens,
        stop=stops(body, "stop_sequences"), temperature=number(body, "temperature"),
        top_p=number(body, "top_p"), stream=bool(body.get("stream")), sampling=controls(body),
        tool_choice=choice, one_call=one_call, response_format=_output_format(body.get("output_config")),
        reasoning=_thinking(body.get("thinking"), max_tokens),
    )
    return body, call


def _tool_choice(value: Any) -> tuple[str | dict[str, str], bool]:
    """(the choice in the Call's form, whether parallel tool use is off)."""
    if value is None:
        return "auto", False
    kind = value.get("type") if isinstance(value, dict) else None
    one = value.get("disable_parallel_tool_use") is True if isinstance(value, dict) else False
    if kind in ("auto", "none"):
        return kind, one
    if kind == "any":
        return "required", one
    if kind == "tool" and isinstance(value.get("name"), str):
        return {"name": value["name"]}, one
    raise BadRequest("tool_choice: must be {type: auto | any | none} or {type: tool, name}", "tool_choice")


def _thinking(value: Any, max_tokens: int) -> Reasoning | None:
    """`thinking` in the Call's form: `enabled` (with `budget_tokens`, at least 1024 and under
    `max_tokens`, as Anthropic requires) or `disabled`; `adaptive` (the model decides) asks nothing.
    `display` may be `omitted` only: no thinking blocks are returned."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    keys = {"type", "budget_tokens", "display"} if kind == "enabled" else {"type", "display"}
    if kind not in ("enabled", "disabled", "adaptive") or set(value) - keys \
            or value.get("display") not in (None, "omitted") or kind == "disabled" and "display" in value:
        raise BadRequest("thinking: must be {type: enabled, budget_tokens}, {type: disabled} or {type: adaptive}, "
                         "with no display but omitted (no thinking blocks are returned)", "thinking")
    if kind == "adaptive":
        return None
    if kind == "disabled":
        return Reasoning("thinking", think=False)
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1024 <= budget < max_tokens:
        raise BadRequest("thinking.budget_tokens: must be an integer of at least 1024 and less than max_tokens",
                         "thinking.budget_tokens")
    return Reasoning("thinking", think=True, budget=budget)


def _output_format(config: Any) -> dict[str, Any] | None:
    """`output_config.format` in the Call's form; an `effort` other than the API's default `high` (which
    asks for nothing: the model spends what it spends) is refused."""
    if config is None:
        return None
    if not isinstance(config, dict) or config.get("effort") not in (None, "high") or set(config) - {"format", "effort"}:
        effort = config.get("effort") if isinstance(config, dict) else None
        raise BadRequest(f"output_config: only format and effort high (the default) are supported, not {effort!r}",
                         "output_config")
    f = config.get("format")
    if f is None:
        return None
    if not isinstance(f, dict) or f.get("type") != "json_schema" or not isinstance(f.get("schema"), dict):
        raise BadRequest("output_config.format: must be {type: json_schema, schema}", "output_config.format")
    return {"type": "json_schema", "schema": f["schema"]}


def _text(content: Any, where: str) -> str:
    if isinstance(content, (str, list)):
        return text_of(content, where)
    raise BadRequest(f"{where}: must be a string or an array of blocks", where)


def _add_turn(messages: list[dict[str, Any]], turn: Any, where: str) -> None:
    if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant", "system"):
        raise BadRequest(f"{where}.role: must be 'user', 'assistant' or 'system'", f"{where}.role")
    content = turn.get("content")
    if turn["role"] == "system":  # Claude Code sends system reminders as their own turns
        messages.append({"role": "system", "content": _text(content, f"{where}.content")})
        return
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise BadRequest(f"{where}.content: must be a string or an array of blocks", f"{where}.content")
    text, calls = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(_text([block], f"{where}.content.{j}.text"))
        elif kind == "tool_use" and turn["role"] == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise BadRequest(f"{where}.content.{j}: a tool_use block needs a string name and an "
                                 "object input", f"{where}.content.{j}")
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
        elif kind == "tool_result" and turn["role"] == "user":
            messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                             "content": _text(block.get("content", ""), f"{where}.content.{j}.content")})
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequest(f"{where}.content.{j}: {not_text(kind)} here", f"{where}.content.{j}.type")
    if turn["role"] == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
    elif text or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
        messages.append({"role": "user", "content": "".join(text)})


def _usage(outcome: Outcome) -> dict[str, Any]:
    prompt, sampled, cached = usage(outcome)
    return {"input_tokens": prompt - cached, "output_tokens": sampled,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _tool_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def _message(call_id: str, model: str, content: list, outcome: Outcome | None) -> dict[str, Any]:
    return {
        "id": f"msg_{call_id}", "type": "message", "role": "assistant", "model": model,
        "content": content,
        "stop_reason": _STOP.get(outcome.finish_reason, "end_turn") if outcome else None,
        "stop_sequence": None,
        "usage": _usage(outcome) if outcome else {"input_tokens": 0, "output_tokens": 0},
    }


def response(outcome: Outcome, body: dict[str, Any], model: str, call_id: str) -> dict[str, Any]:
    content = [{"type": "text", "text": outcome.content}] if outcome.content else []
    return _message(call_id, model, content + [_tool_block(c) for c in outcome.tool_calls], outcome)


class Events(StreamEvents):
    def __init__(self, call: Call, body: dict[str, Any], model: str) -> None:
        self._call_id, self._model = call.id, model
        self._open_text = False
        self._text_blocks = 0  # 1 once a text block was opened (it comes first)

    def start(self) -> bytes:
        return (sse({"type": "message_start", "message": _message(self._call_id, self._model, [], None)},
                    "message_start") + sse({"type": "ping"}, "ping"))

    def text(self, delta: str) -> bytes:
        out = b""
        if not self._open_text:
            self._open_text, self._text_blocks = True, 1
            out = sse({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}, "content_block_start")
        delta_block = {"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": delta}}
        return out + sse(delta_block, "content_block_delta")

    def _end_text(self) -> bytes:
        if not self._open_text:
            return b""
        self._open_text = False
        return sse({"type": "content_block_stop", "index": 0}, "content_block_stop")

    def tool_call(self, call: ToolCall, index: int) -> bytes:
        block, at = _tool_block(call), index + self._text_blocks
        partial = json.dumps(block["input"], ensure_ascii=False)
        return (self._end_text()
                + sse({"type": "content_block_start", "index": at,
                       "content_block": dict(block, input={})}, "content_block_start")
                + sse({"type": "content_block_delta", "index": at,
                       "delta": {"type": "input_json_delta", "partial_json": partial}},
                      "content_block_delta")
                + sse({"type": "content_block_stop", "index": at}, "content_block_stop"))

    def end(self, outcome: Outcome) -> bytes:
        out = self._end_text() + self.unsent(outcome)
        final = _message(self._call_id, self._model, [], outcome)
        out += sse({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                       "stop_sequence": None},
                    "usage": final["usage"]}, "message_delta")
        return out + sse({"type": "message_stop"}, "message_stop")

    def error(self, status: int, message: str, kind: str) -> bytes:
        return sse(error_body(status, message, kind), "error")
