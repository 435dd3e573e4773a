"""Constrained decoding: what a call asks for, and the engine's own constraint that honours it.

The API adapters put each API's fields into the `calls.Call` in one form: `tool_choice` (auto |
none | required | {"name": NAME}), a tool's `strict: true` (in its Chat `function`), `one_call`
(parallel tool calls off) and `response_format` ({"type": "json_object"} or {"type": "json_schema",
"schema": ...}). `reasons(call)` lists what constrains a call's decoding ([] when nothing does): the
record's `meta["constrained"]` in both capture modes. `constraint(call, parser)` is, for tito, the
`engines.capture.Constraint` the engine decodes under (its own structured-output support: xgrammar
on vLLM and SGLang; the proxy writes no grammar engine):
- tool calls (`required`, a named tool, strict tools): an xgrammar structural tag describing the
  calls exactly as the tool parser reads them (`tool_parsers`: hermes `<tool_call>{"name": ...,
  "arguments": ...}</tool_call>`), each call's arguments under its tool's schema when the tool is
  strict; `required` and a named tool allow nothing but calls, strict tools under `auto` allow text
  until `<tool_call>`; `one_call` stops after the first;
- `response_format` alone: its JSON schema (`{"type": "object"}` for json_object); with tools
  under `auto`, either calls or that JSON.
The tool parser stays the one reader of the calls in the reply. Formats whose calls cannot be
described so (qwen3_coder) refuse constrained tool calls (BadRequest naming `tool_choice`/`tools`).
"""

from __future__ import annotations

import json
from typing import Any

from polar_hpc.engines.capture import Constraint
from polar_hpc.proxy.calls import BadRequest, Call
from polar_hpc.proxy.tool_parsers import ToolParser


def strict_tools(call: Call) -> list[str]:
    return [t["function"]["name"] for t in call.tools or []
            if isinstance(t.get("function"), dict) and t["function"].get("strict") is True]


def reasons(call: Call) -> list[str]:
    """Why the call's decoding is constrained ([]: it is not)."""
    out = []
    if call.tools and call.tool_choice == "required":
        out.append("tool_choice required")
    elif call.tools and isinstance(call.tool_choice, dict):
        out.append(f"tool_choice {call.tool_choice['name']}")
    elif call.tools and call.tool_choice != "none" and strict_tools(call):
        out.append("strict tools " + ", ".join(strict_tools(call)))
    if call.response_format is not None:
        out.append(f"response_format {call.response_format['type']}")
    return out


def marks(call: Call, by: Constraint | None) -> dict[str, Any] | None:
    """The record's `meta["constrained"]`: why decoding was constrained and by what (the engine
    constraint's kind in tito; the engine's chat route in passthrough), or None."""
    why = reasons(call)
    return {"reasons": why, "by": by.kind if by is not None else "engine chat route"} if why else None


def constraint(call: Call, parser: ToolParser) -> Constraint | None:
    """The engine constraint that honours the call's asks, or None when nothing is asked."""
    choice, answer = call.tool_choice, _answer_schema(call)
    forced = bool(call.tools) and (choice == "required" or isinstance(choice, dict))
    strict = strict_tools(call) if call.tools and choice != "none" else []
    may_call = bool(call.tools) and choice == "auto"
    if not forced and not strict and not (answer is not None and may_call):
        return None if answer is None else Constraint("json_schema", json.dumps(answer))
    tags = _tags(call, parser, forced, strict)
    calls = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
             "stop_after_first": call.one_call}
    if forced:
        form: dict[str, Any] = calls
    elif answer is not None:  # auto with a response format: calls, or the JSON answer
        form = {"type": "or", "elements": [calls, {"type": "json_schema", "json_schema": answer}]}
    else:  # strict tools under auto: any text until a call begins
        form = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags,
                "at_least_one": False, "stop_after_first": call.one_call}
    return _structural(form)


def _structural(form: dict[str, Any]) -> Constraint:
    return Constraint("structural_tag", json.dumps({"type": "structural_tag", "format": form}))


def _answer_schema(call: Call) -> dict[str, Any] | None:
    f = call.response_format
    if f is None:
        return None
    return f.get("schema") or {"type": "object"}


def _tags(call: Call, parser: ToolParser, forced: bool, strict: list[str]) -> list[dict[str, Any]]:
    """One structural-tag `tag` per callable tool, in the parser's format: its arguments under the
    tool's schema when the tool is strict or a call is forced (as vLLM's `required` does), else any
    JSON object."""
    if parser.name != "hermes":
        raise BadRequest(f"tool calls cannot be constrained in the {parser.name} tool format "
                         "(tool_choice required or named, strict tools, tools with response_format)",
                         "tool_choice")
    choice, tags = call.tool_choice, []
    for tool in call.tools or []:
        fn = tool.get("function") or {}
        name = fn.get("name")
        if isinstance(choice, dict) and name != choice["name"]:
            continue
        schema = fn.get("parameters") if forced or name in strict else None
        tags.append({"type": "tag", "begin": '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": ',
                     "content": {"type": "json_schema", "json_schema": schema or {"type": "object"}},
                     "end": "}\n</tool_call>"})
    if not tags:
        raise BadRequest(f"tool_choice names no offered tool: {choice}", "tool_choice")
    return tags
