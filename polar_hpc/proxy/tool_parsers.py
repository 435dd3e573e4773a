"""Tool calls in sampled text, in the formats models write them (tito mode parses them itself).

`parser_for(name, chat_template)` returns a `ToolParser`: `hermes` (`<tool_call>{"name", "arguments"}
</tool_call>`, JSON), `qwen3_coder` (`<tool_call><function=NAME><parameter=P>VALUE</parameter>
</function></tool_call>`, values typed by the tool's JSON schema) or `auto` (qwen3_coder when the
template writes `<function=`, else hermes).

`NO_CALLS` reads no calls at all (the whole text is content: tool_choice none).

`CallReader(parser, tools)` reads a reply as it streams: `feed(piece) -> (text, calls)` gives the
content that may be shown now and each tool call (name, arguments JSON string) as soon as its
closing tag (`</tool_call>`, or `</function>` for qwen3_coder) has arrived; `finish()` gives the
content still held back. Content is held back only while it may still turn out to be a call (a
marker, or a marker's beginning, at its end) and for trailing newlines. The result does not
depend on how the text is cut into pieces, and `ToolParser.parse(text, tools) -> (content or
None, calls)` is one reader fed the whole text:

- content is the text before the first call, less one trailing newline;
- after the first call only further calls are read (other text is dropped, as chat templates
  render content before calls);
- a call block that does not parse (or is cut off) before the first call is content (the harness
  sees what the model wrote); after it, it is dropped.

`parse_tool_calls(text)` is the whole-reply hermes reader the scripted engine answers with: all
blocks must parse, else the reply is plain content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, get_args

from polar_hpc.wire import ToolParserName

PARSERS: tuple[str, ...] = get_args(ToolParserName)

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolParser:
    name: str  # hermes | qwen3_coder

    def parse(
        self, text: str, tools: list[dict[str, Any]] | None
    ) -> tuple[str | None, list[tuple[str, str]]]:
        reader = CallReader(self, tools)
        content, calls = reader.feed(text)
        content += reader.finish()
        return content or None, calls


NO_CALLS = ToolParser("none")  # reads no calls: the whole reply is content (tool_choice none)


def parser_for(name: str, chat_template: str | None) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool parser {name!r} (known: {', '.join(PARSERS)})")
    if name == "auto":
        name = "qwen3_coder" if _FUNCTION_OPEN in (chat_template or "") else "hermes"
    return ToolParser(name)


class CallReader:
    """One reply's content and tool calls, read piece by piece."""

    def __init__(self, parser: ToolParser, tools: list[dict[str, Any]] | None) -> None:
        self._qwen, self._none = parser.name == "qwen3_coder", parser is NO_CALLS
        self._tools = tools
        self._buf = ""  # text not yet given out, from the first character that may be a call
        self._newlines = ""  # content's trailing newlines, held back
        self.n_calls = 0

    def feed(self, piece: str) -> tuple[str, list[tuple[str, str]]]:
        self._buf += piece
        out: list[str] = []
        calls: list[tuple[str, str]] = []
        while True:
            at = self._next_marker()
            if at is None:  # no marker: all but a possible marker's beginning is plain text
                keep = _partial_marker(self._buf, self._markers())
                self._plain(out, self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                break
            self._plain(out, self._buf[:at])
            self._buf = self._buf[at:]
            step = self._block()
            if step is None:  # the block is still arriving
                break
            length, call = step
            if call is not None:
                if not self.n_calls:  # content ends here, less one trailing newline
                    out.append(self._newlines[:-1])
                    self._newlines = ""
                calls.append(call)
                self.n_calls += 1
            else:
                self._plain(out, self._buf[:length])
            self._buf = self._buf[length:]
        return "".join(out), calls

    def finish(self) -> str:
        """The content still held back (nothing more will come)."""
        rest = self._newlines + self._buf if not self.n_calls else ""
        self._buf = self._newlines = ""
        return rest

    def _markers(self) -> tuple[str, ...]:
        if self._none:
            return ()
        return (_OPEN, _FUNCTION_OPEN) if self._qwen else (_OPEN,)

    def _next_marker(self) -> int | None:
        found = [i for i in (self._buf.find(m) for m in self._markers()) if i >= 0]
        return min(found) if found else None

    def _plain(self, out: list[str], text: str) -> None:
        """Text that is not a call: content before the first call, else dropped."""
        if self.n_calls or not text:
            return
        stripped = text.rstrip("\n")
        if stripped:
            out.append(self._newlines + stripped)
            self._newlines = ""
        self._newlines += text[len(stripped):]

    def _block(self) -> tuple[int, tuple[str, str] | None] | None:
        """At a marker at the start of the buffer: (its length, the call or None if it is plain
        text), or None while it cannot be told yet."""
        if not self._qwen:
            end = self._buf.find(_CLOSE)
            if end < 0:
                return None
            end += len(_CLOSE)
            _, found = parse_tool_calls(self._buf[:end])
            return end, ((found[0]["name"], found[0]["arguments"]) if found else None)
        start = 0
        if self._buf.startswith(_OPEN):  # a wrapper: part of the call if a function follows
            after = self._buf[len(_OPEN):].lstrip()
            if _FUNCTION_OPEN.startswith(after):
                return None
            if not after.startswith(_FUNCTION_OPEN):
                return len(_OPEN), None
            start = len(self._buf) - len(after)
        end = self._buf.find(_FUNCTION_CLOSE, start)
        if end < 0:
            return None
        end += len(_FUNCTION_CLOSE)
        return end, self._function(self._buf[start:end])

    def _function(self, block: str) -> tuple[str, str] | None:
        match = _FUNCTION.fullmatch(block)
        if match is None:
            return None
        name = match.group(1).strip()
        schema = _properties(self._tools, name)
        arguments = {
            p.group(1).strip(): _typed(p.group(2), schema.get(p.group(1).strip(), {}))
            for p in _PARAMETER.finditer(match.group(2))
        }
        return name, json.dumps(arguments, ensure_ascii=False)


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of text may be the beginning of a marker."""
    return max(
        (k for m in markers for k in range(len(m) - 1, 0, -1) if text.endswith(m[:k])), default=0
    )


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
    ok: dict[str, type | tuple[type, ...]] = {
        "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
    }
    wanted = ok.get(kind) if isinstance(kind, str) else None
    return parsed if wanted is not None and isinstance(parsed, wanted) else value


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, str]]]:
    """Split a reply into (content or None, [{"name", "arguments" (a JSON string)}]).

    Content is the text before the first `<tool_call>` block, less one trailing newline. A reply
    with no block, or with a block that is not a JSON object with a string "name", is plain
    content: (text, []).
    """
    blocks = list(_TOOL_CALL.finditer(text))
    calls = []
    for block in blocks:
        try:
            call = json.loads(block.group(1))
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append({"name": call["name"], "arguments": arguments})
    if not calls:
        return text, []
    content = text[: blocks[0].start()]
    content = content[:-1] if content.endswith("\n") else content
    return content or None, calls
