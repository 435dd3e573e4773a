"""Tool calls in sampled text, in the formats models write them (tito mode parses them itself).

`parser_for(name, chat_template)` returns a `ToolParser`: `hermes` (`<tool_call>{"name", "arguments"}
</tool_call>`, JSON), `qwen3_coder` (`<tool_call><function=NAME><parameter=P>VALUE</parameter>
</function></tool_call>`, values typed by the tool's JSON schema) or `auto` (qwen3_coder when the
template writes `<function=`, else hermes).

- `parse(text, tools) -> (content or None, [(name, arguments JSON string)])`: content is the text
  before the first call, less one trailing newline. Text whose call blocks do not parse is all
  content (the harness sees what the model wrote).
- `safe_prefix(text)`: how much of a growing text may be streamed as content already: everything
  before a (possibly still partial) call marker, holding back trailing newlines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from polar_hpc.engines.chat_format import parse_tool_calls

PARSERS = ("auto", "hermes", "qwen3_coder")

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ToolParser:
    name: str
    markers: tuple[str, ...]

    def parse(
        self, text: str, tools: list[dict[str, Any]] | None
    ) -> tuple[str | None, list[tuple[str, str]]]:
        if self.name == "hermes":
            content, calls = parse_tool_calls(text)
            return content, [(c["name"], c["arguments"]) for c in calls]
        found = _parse_qwen3_coder(text, tools)
        if found is None:
            return text, []
        start, calls = found
        content = text[:start]
        content = content[:-1] if content.endswith("\n") else content
        return content or None, calls

    def safe_prefix(self, text: str) -> int:
        end = len(text)
        for marker in self.markers:
            at = text.find(marker)
            if at >= 0:
                end = min(end, at)
            for k in range(len(marker) - 1, 0, -1):  # a marker may be arriving
                if text.endswith(marker[:k]):
                    end = min(end, len(text) - k)
                    break
        while end > 0 and text[end - 1] == "\n":
            end -= 1
        return end


def parser_for(name: str, chat_template: str | None) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool parser {name!r} (known: {', '.join(PARSERS)})")
    if name == "auto":
        name = "qwen3_coder" if "<function=" in (chat_template or "") else "hermes"
    markers = ("<tool_call>",) if name == "hermes" else ("<tool_call>", "<function=")
    return ToolParser(name, markers)


def _parse_qwen3_coder(
    text: str, tools: list[dict[str, Any]] | None
) -> tuple[int, list[tuple[str, str]]] | None:
    functions = list(_FUNCTION.finditer(text))
    if not functions:
        return None
    calls = []
    for function in functions:
        name = function.group(1).strip()
        schema = _properties(tools, name)
        arguments = {
            p.group(1).strip(): _typed(p.group(2), schema.get(p.group(1).strip(), {}))
            for p in _PARAMETER.finditer(function.group(2))
        }
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    first = functions[0].start()
    wrapper = text.rfind("<tool_call>", 0, first)
    return (wrapper if wrapper >= 0 and not text[wrapper + 11 : first].strip() else first), calls


def _properties(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    for tool in tools or []:
        fn = tool.get("function") or {}
        if fn.get("name") == name:
            return (fn.get("parameters") or {}).get("properties") or {}
    return {}


def _typed(value: str, schema: dict[str, Any]) -> Any:
    """A parameter's text as its schema's type (text that does not convert stays a string)."""
    kind = schema.get("type")
    if kind in (None, "string") or isinstance(kind, list):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    ok = {"integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
    wanted = ok.get(kind)
    return parsed if wanted is not None and isinstance(parsed, wanted) else value
