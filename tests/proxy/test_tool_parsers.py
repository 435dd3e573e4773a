"""Tool-call formats the proxy parses in tito mode, read whole or as the reply streams."""

from __future__ import annotations

import json
import random

import pytest

from polar_hpc.proxy.tool_parsers import CallReader, parser_for

TOOLS = [{"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "force": {"type": "boolean"},
    "spec": {"type": "object"}}}}}]

QWEN3_CODER = """Let me edit it.
<tool_call>
<function=edit>
<parameter=path>
src/a.py
</parameter>
<parameter=line>
12
</parameter>
<parameter=force>
true
</parameter>
<parameter=spec>
{"mode": "x"}
</parameter>
</function>
</tool_call>
<tool_call>
<function=edit>
<parameter=path>
two
lines
</parameter>
<parameter=line>
not a number
</parameter>
</function>
</tool_call>"""


def test_qwen3_coder_calls_typed_by_schema():
    content, calls = parser_for("qwen3_coder", None).parse(QWEN3_CODER, TOOLS)
    assert content == "Let me edit it."
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("edit", {"path": "src/a.py", "line": 12, "force": True, "spec": {"mode": "x"}}),
        ("edit", {"path": "two\nlines", "line": "not a number"}),  # kept as written
    ]


def test_hermes_calls_and_malformed_blocks():
    hermes = parser_for("hermes", None)
    text = 'ok\n<tool_call>\n{"name": "edit", "arguments": {"line": 3}}\n</tool_call>'
    assert hermes.parse(text, TOOLS) == ("ok", [("edit", '{"line": 3}')])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert hermes.parse(broken, TOOLS) == (broken, [])  # the harness sees what the model wrote


@pytest.mark.parametrize("template, name", [
    ("{{ '<tool_call>' }}", "hermes"), ("<function={{ name }}>", "qwen3_coder"), (None, "hermes"),
])
def test_auto_picks_the_format_the_template_writes(template, name):
    assert parser_for("auto", template).name == name


def test_unknown_parser():
    with pytest.raises(ValueError, match="unknown tool parser"):
        parser_for("xml", None)


HERMES = ('I will compute.\n\n<tool_call>\n{"name": "calc", "arguments": {"x": "1 < 2"}}\n</tool_call>'
          '\n<tool_call>\n{"name": "calc", "arguments": {"x": 3}}\n</tool_call>')
SAMPLES = [
    ("hermes", HERMES),
    ("hermes", "plain <tool text\n\n with <tool_call>{broken}</tool_call> then\n<tool_call>"),
    ("hermes", '<tool_call>{bad}</tool_call>\n<tool_call>{"name": "a"}</tool_call>x<tool_call>{z}'),
    ("qwen3_coder", QWEN3_CODER),
    ("qwen3_coder", "a <tool_call>x <function=f>\n<parameter=line>\n5\n</parameter>\n</function> z"),
    ("qwen3_coder", "<tool_call>\n<function=bad\nname></function>\n<function=edit></function>"),
]


def _read(name: str, pieces: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    reader = CallReader(parser_for(name, None), TOOLS)
    text, calls = [], []
    for piece in pieces:
        t, c = reader.feed(piece)
        text.append(t)
        calls += c
    text.append(reader.finish())
    return "".join(text) or None, calls


@pytest.mark.parametrize("name, text", SAMPLES)
def test_any_split_reads_like_the_whole_text(name, text):
    whole = parser_for(name, None).parse(text, TOOLS)
    assert _read(name, list(text)) == whole  # one character at a time
    for i in range(len(text) + 1):
        assert _read(name, [text[:i], text[i:]]) == whole, i
    rng = random.Random(7)
    for _ in range(300):
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(1, 12)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert _read(name, pieces) == whole, cuts


def test_hermes_reader_gives_content_early_and_each_call_at_its_closing_tag():
    reader = CallReader(parser_for("hermes", None), TOOLS)
    assert reader.feed("I will compute.\n\n<tool") == ("I will compute.", [])  # newlines held
    assert reader.feed('_call>\n{"name": "calc", "arguments": {"x": "1 < 2"}}\n</tool_cal') == ("", [])
    assert reader.feed("l>\n") == ("\n", [("calc", '{"x": "1 < 2"}')])
    assert reader.feed('<tool_call>{"name": "calc"}</tool_call> ignored') == ("", [("calc", "{}")])
    assert reader.finish() == ""
    assert reader.n_calls == 2


def test_qwen3_coder_reader_gives_a_call_at_its_function_end():
    reader = CallReader(parser_for("qwen3_coder", None), TOOLS)
    assert reader.feed("Hi <tool_call>\n<func") == ("Hi ", [])
    assert reader.feed("tion=edit>\n<parameter=line>\n12\n</parameter>\n") == ("", [])
    assert reader.feed("</function>") == ("", [("edit", '{"line": 12}')])
    reader = CallReader(parser_for("qwen3_coder", None), TOOLS)  # a wrapper with no function
    assert reader.feed("<tool_call>\n{") == ("<tool_call>\n{", [])


def test_a_cut_off_or_broken_first_call_is_content():
    hermes = parser_for("hermes", None)
    assert hermes.parse("a\n<tool_call>\n{\"na", TOOLS) == ("a\n<tool_call>\n{\"na", [])
    assert hermes.parse("a\n\n", TOOLS) == ("a\n\n", [])
    assert hermes.parse("", TOOLS) == (None, [])
