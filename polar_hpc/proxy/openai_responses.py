"""OpenAI Responses as the proxy serves it (POST /v1/responses), stateless (`store` is ignored).

- `parse(raw) -> (body, Call)`: `instructions` and `input` (a string, or message /
  `function_call` / `function_call_output` items of text; `reasoning` items are skipped) become
  Chat messages, an assistant message and the function calls after it one assistant turn;
  `function` tools become Chat tools, those of a `namespace` group named `NAMESPACE.NAME` (other
  tool types are refused); `tool_choice`, `parallel_tool_calls`, `text.format` and
  `reasoning.effort` in the `Call`'s form; `top_logprobs` and `include` of
  `message.output_text.logprobs` ask for the reply's logprobs. Fields `fields.RESPONSES` refuses
  (`previous_response_id` among them: harnesses re-send their history, `store: false` as Codex
  does) or does not know are a BadRequest.
- `response(outcome, body, model, call_id)`: the `response` object (a `message` output item with
  `output_text`, its `logprobs` when asked; one `function_call` item per call, with its `namespace`
  when it is a namespaced tool's; usage; `incomplete` on max_output_tokens).
- `Events` (a `StreamEvents`): `response.created` / `in_progress`, `output_text.delta` as tokens
  arrive, the message's `*.done` events once it ends, each function call as soon as it is complete
  as `output_item.added` / `function_call_arguments.delta` / `.done` / `output_item.done`, then
  `response.completed` (or `response.incomplete`, `response.failed`).
- `error_body`, `token`: OpenAI's error shape and Bearer key (as `openai_chat`).
"""

from __future__ import annotations

import time
from typing import Any

from polar_hpc.proxy import fields
from polar_hpc.proxy.calls import (
    BadRequest, Call, Outcome, Reasoning, StreamEvents, ToolCall, array, controls, decode_object, effort,
    number, sse, text_of, usage,
)
from polar_hpc.proxy.openai_chat import error_body, token  # noqa: F401  (same shapes as Chat)
from polar_hpc.proxy.openai_chat import logprob_entries, top_logprobs

API = "openai_responses"
PATH = "/v1/responses"
LOGPROBS = "message.output_text.logprobs"  # the `include` that asks for the reply's logprobs
INCLUDABLE = ("reasoning.encrypted_content", LOGPROBS)


def parse(raw: bytes) -> tuple[dict[str, Any], Call]:
    body = decode_object(raw)
    fields.check(fields.RESPONSES, body)
    include = body.get("include") or []
    if not isinstance(include, list) or any(i not in INCLUDABLE for i in include):
        raise BadRequest(f"'include' may only name {' and '.join(INCLUDABLE)}", "include")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' is required: a string or a non-empty array of items", "input")
    for i, item in enumerate(items):
        _add_item(messages, item, f"input[{i}]")
    chat_tools = []
    for i, t in enumerate(array(body, "tools")):
        if isinstance(t, dict) and t.get("type") == "namespace":
            chat_tools += _namespace(t, f"tools[{i}]")
        else:
            chat_tools.append(_function_tool(t, f"tools[{i}]"))
    call = Call(
        messages=messages, tools=chat_tools or None, max_tokens=number(body, "max_output_tokens", int),
        temperature=number(body, "temperature"), top_p=number(body, "top_p"),
        stream=bool(body.get("stream")), sampling=controls(body),
        tool_choice=_tool_choice(body.get("tool_choice")), one_call=body.get("parallel_tool_calls") is False,
        response_format=_text_format(body.get("text")), reasoning=_reasoning(body.get("reasoning")),
        top_logprobs=top_logprobs(body), logprobs=_logprobs_asked(body),
    )
    return body, call


def _logprobs_asked(body: dict[str, Any]) -> bool:
    """Whether the reply's text carries its tokens' logprobs: `include` names them, or
    `top_logprobs` asks for alternatives."""
    return LOGPROBS in (body.get("include") or []) or bool(body.get("top_logprobs"))


def _function_tool(t: Any, where: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Chat tool for a Responses function tool; inside a namespace, named `NAMESPACE.NAME` (a
    name OpenAI's own tool names, without dots, cannot clash with) and described after it."""
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
        kind = t.get("type") if isinstance(t, dict) else None
        raise BadRequest(f"{where}: only function and namespace tools (with a name) are supported, not {kind!r}",
                         where)
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    if namespace is not None:
        if "." in t["name"]:
            raise BadRequest(f"{where}.name: a namespaced tool's name may not contain '.'", f"{where}.name")
        fn["name"] = f"{namespace['name']}.{t['name']}"
        fn["description"] = "\n\n".join(d for d in (namespace.get("description"), t.get("description")) if d)
    return {"type": "function", "function": fn}


def _namespace(t: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The Chat tools of a `namespace` tool group."""
    if not isinstance(t.get("name"), str) or "." in t["name"] or not isinstance(t.get("tools"), list):
        raise BadRequest(f"{where}: a namespace needs a name without '.' and an array of tools", where)
    return [_function_tool(inner, f"{where}.tools[{j}]", t) for j, inner in enumerate(t["tools"])]


def _namespaced(body: dict[str, Any]) -> set[str]:
    """The Chat names (`NAMESPACE.NAME`) of the body's namespaced tools."""
    return {f"{t['name']}.{inner.get('name')}" for t in body.get("tools") or []
            if isinstance(t, dict) and t.get("type") == "namespace" for inner in t["tools"]}


def _reasoning(value: Any) -> Reasoning | None:
    """`reasoning.effort` for the chat template; a summary, context or mode other than the default
    (`auto`, `standard`) is refused (no reasoning items are returned, which `auto` allows)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"effort", "summary", "generate_summary", "context", "mode"} \
            or any(value.get(k) not in (None, "auto") for k in ("summary", "generate_summary", "context")) \
            or value.get("mode") not in (None, "standard"):
        raise BadRequest("'reasoning' may hold an effort, and a summary, context and mode only at their "
                         "defaults (auto, standard): no reasoning items are returned", "reasoning")
    return effort(value.get("effort"), "reasoning.effort")


def _tool_choice(value: Any) -> str | dict[str, str]:
    if value is None or value in ("auto", "none", "required"):
        return value or "auto"
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"name": value["name"]}
    raise BadRequest("'tool_choice' must be auto, none, required or {type: function, name}", "tool_choice")


def _text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` in the Call's form; `text.verbosity` other than medium refused."""
    if text is None:
        return None
    if not isinstance(text, dict) or text.get("verbosity") not in (None, "medium") or set(text) - {"format", "verbosity"}:
        raise BadRequest("'text' may hold a format, and no verbosity but medium", "text")
    f = text.get("format")
    kind = f.get("type") if isinstance(f, dict) else None
    if f is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(f.get("schema", {}), dict):
        return {"type": "json_schema", "schema": f.get("schema") or {"type": "object"}}
    raise BadRequest("'text.format' must be {type: text}, {type: json_object} or "
                     "{type: json_schema, name, schema}", "text.format")


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise BadRequest(f"{where} must be an object", where)
    kind = item.get("type", "message")
    last = messages[-1] if messages else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(f"{where}.role must be user, assistant, system or developer", f"{where}.role")
        content = item.get("content")
        if not isinstance(content, (str, list)):
            raise BadRequest(f"{where}.content must be a string or an array of parts", f"{where}.content")
        text = text_of(content, f"{where}.content", ("input_text", "output_text", "text"))
        messages.append({"role": "system" if role == "developer" else role, "content": text})
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise BadRequest(f"{where}.{key} must be a string", f"{where}.{key}")
        namespace = item.get("namespace")
        if not isinstance(namespace, (str, type(None))):
            raise BadRequest(f"{where}.namespace must be a string", f"{where}.namespace")
        name = item["name"] if namespace is None else f"{namespace}.{item['name']}"
        call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, (str, list)):
            raise BadRequest(f"{where}.output must be a string or an array", f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": text_of(output, f"{where}.output", ("input_text",))})
    elif kind != "reasoning":
        raise BadRequest(f"{where}: input items of type {kind!r} are not supported", f"{where}.type")


def _usage(outcome: Outcome) -> dict[str, Any]:
    prompt, sampled, cached = usage(outcome)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": sampled, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + sampled}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _message_item(call_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [_text_part(text, logprobs)] if status == "completed" or text else []
    return {"type": "message", "id": f"msg_{call_id}", "status": status, "role": "assistant",
            "content": content}


def _function_item(call: ToolCall, namespaced: set[str]) -> dict[str, Any]:
    item = {"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}
    if call.name in namespaced:
        item["namespace"], item["name"] = call.name.split(".", 1)
    return item


def _logprobs(outcome: Outcome, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The reply's tokens' logprobs as the `output_text` part carries them, when asked."""
    return logprob_entries(outcome, top_logprobs(body)) if _logprobs_asked(body) else None


def _event_logprobs(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Logprobs as the text events carry them (no bytes)."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": a["token"], "logprob": a["logprob"]} for a in e["top_logprobs"]]}
            for e in entries or []]


def _shell(body: dict[str, Any], model: str, call_id: str, status: str) -> dict[str, Any]:
    return {
        "id": f"resp_{call_id}", "object": "response", "created_at": int(time.time()),
        "status": status, "model": model, "output": [], "usage": None, "error": None,
        "incomplete_details": None, "instructions": body.get("instructions"),
        "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "temperature": body.get("temperature"),
        "top_p": body.get("top_p"), "metadata": body.get("metadata") or {},
        "max_output_tokens": body.get("max_output_tokens"),
    }


def response(outcome: Outcome, body: dict[str, Any], model: str, call_id: str) -> dict[str, Any]:
    cut = outcome.finish_reason == "length"
    out = _shell(body, model, call_id, "incomplete" if cut else "completed")
    if outcome.content:
        out["output"].append(_message_item(call_id, outcome.content, "completed", _logprobs(outcome, body)))
    out["output"] += [_function_item(c, _namespaced(body)) for c in outcome.tool_calls]
    out["usage"] = _usage(outcome)
    if cut:
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    return out


class Events(StreamEvents):
    def __init__(self, call: Call, body: dict[str, Any], model: str) -> None:
        self._call_id, self._body, self._model = call.id, body, model
        self._n = 0
        self._text: str | None = None  # None until a message item is open
        self._text_done = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._n, **fields}
        self._n += 1
        return sse(data, kind)

    def start(self) -> bytes:
        shell = _shell(self._body, self._model, self._call_id, "in_progress")
        return (self._event("response.created", response=shell)
                + self._event("response.in_progress", response=shell))

    def text(self, delta: str) -> bytes:
        out = b""
        item_id = f"msg_{self._call_id}"
        if self._text is None:
            self._text = ""
            out += self._event("response.output_item.added", output_index=0,
                               item=_message_item(self._call_id, "", "in_progress"))
            out += self._event("response.content_part.added", item_id=item_id, output_index=0,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        self._text += delta
        return out + self._event("response.output_text.delta", item_id=item_id, output_index=0,
                                 content_index=0, delta=delta, logprobs=[])

    def _end_text(self, outcome: Outcome | None = None) -> bytes:
        """Close the message item, if one is open (calls follow it; its logprobs, when asked, are
        known once the reply is over: `outcome`)."""
        if self._text is None or self._text_done:
            return b""
        self._text_done = True
        item_id = f"msg_{self._call_id}"
        logprobs = _logprobs(outcome, self._body) if outcome is not None else None
        return (self._event("response.output_text.done", item_id=item_id, output_index=0,
                            content_index=0, text=self._text, logprobs=_event_logprobs(logprobs))
                + self._event("response.content_part.done", item_id=item_id, output_index=0,
                              content_index=0, part=_text_part(self._text, logprobs))
                + self._event("response.output_item.done", output_index=0,
                              item=_message_item(self._call_id, self._text, "completed", logprobs)))

    def tool_call(self, call: ToolCall, index: int) -> bytes:
        out = self._end_text()
        item, at = _function_item(call, _namespaced(self._body)), index + (0 if self._text is None else 1)
        out += self._event("response.output_item.added", output_index=at,
                           item=dict(item, arguments="", status="in_progress"))
        out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                           output_index=at, delta=item["arguments"])
        out += self._event("response.function_call_arguments.done", item_id=item["id"],
                           output_index=at, arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=at, item=item)

    def end(self, outcome: Outcome) -> bytes:
        out = self._end_text(outcome) + self.unsent(outcome)
        final = response(outcome, self._body, self._model, self._call_id)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=final)

    def error(self, status: int, message: str, kind: str) -> bytes:
        failed = _shell(self._body, self._model, self._call_id, "failed")
        failed["error"] = {"code": "server_error" if status >= 500 else "invalid_prompt", "message": message}
        return self._event("response.failed", response=failed)
