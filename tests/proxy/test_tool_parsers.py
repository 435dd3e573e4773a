"""Tool-call formats the proxy parses in tito mode, and what may stream before a call is complete."""

from __future__ import annotations

import json

import pytest

from polar_hpc.proxy.tool_parsers import parser_for

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


def test_safe_prefix_holds_back_call_markers():
    hermes, qwen = parser_for("hermes", None), parser_for("qwen3_coder", None)
    assert hermes.safe_prefix("Hello wor") == 9
    assert hermes.safe_prefix("Hello <tool_") == 6  # a marker may be arriving
    assert hermes.safe_prefix("Hello\n<tool_call>\n{") == 5  # content ends before the newline
    assert hermes.safe_prefix("a\n\n") == 1
    assert qwen.safe_prefix("Hi <function=ed") == 3
    assert hermes.safe_prefix("Hi <function=ed") == 15
    with pytest.raises(ValueError, match="unknown tool parser"):
        parser_for("xml", None)
