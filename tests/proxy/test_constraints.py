"""What the proxy asks the engine to constrain decoding to (`proxy.constraints`): the structural
tag describes the calls exactly as the tool parser reads them, so the parser stays the one reader of
a constrained reply; a call with nothing to constrain asks for nothing. (The engine honouring it:
tests/vllm/test_constrained.py.)"""

from __future__ import annotations

import json

import pytest

from polar_hpc.proxy.calls import BadRequest, Call
from polar_hpc.proxy.constraints import constraint, marks, reasons
from polar_hpc.proxy.tool_parsers import parser_for

from proxy.helpers import CALCULATOR

HERMES = parser_for("hermes", None)
WEATHER = {"name": "weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TOOLS = [{"type": "function", "function": CALCULATOR}, {"type": "function", "function": WEATHER}]
ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def form(call: Call) -> dict:
    c = constraint(call, HERMES)
    assert c is not None and c.kind == "structural_tag"
    tag = json.loads(c.spec)
    assert tag["type"] == "structural_tag"
    return tag["format"]


def written(tag: dict, arguments: dict) -> str:
    """What a model decoding under `tag` writes for these arguments."""
    return tag["begin"] + json.dumps(arguments) + tag["end"]


def test_required_allows_only_calls_each_read_by_the_parser():
    f = form(Call(ASK, TOOLS, tool_choice="required"))
    assert f["type"] == "tags_with_separator" and f["at_least_one"] and not f["stop_after_first"]
    by_name = {json.loads(t["begin"].split("\n", 1)[1] + "0}")["name"]: t for t in f["tags"]}
    assert set(by_name) == {"calculator", "weather"}
    assert by_name["weather"]["content"] == {"type": "json_schema", "json_schema": WEATHER["parameters"]}
    text = written(by_name["calculator"], {"expression": "2+2"}) + f["separator"] + written(
        by_name["weather"], {"city": "Oslo"})
    content, calls = HERMES.parse(text, TOOLS)
    assert content is None
    assert calls == [("calculator", '{"expression": "2+2"}'), ("weather", '{"city": "Oslo"}')]


def test_a_named_tool_and_one_call():
    f = form(Call(ASK, TOOLS, tool_choice={"name": "weather"}, one_call=True))
    assert [t["begin"] for t in f["tags"]] == ['<tool_call>\n{"name": "weather", "arguments": ']
    assert f["stop_after_first"]
    with pytest.raises(BadRequest) as e:
        constraint(Call(ASK, TOOLS, tool_choice={"name": "nope"}), HERMES)
    assert e.value.param == "tool_choice"


def test_strict_tools_under_auto_leave_text_free_until_a_call():
    strict = [TOOLS[0], {"type": "function", "function": dict(WEATHER, strict=True)}]
    f = form(Call(ASK, strict))
    assert f["type"] == "triggered_tags" and f["triggers"] == ["<tool_call>"] and not f["at_least_one"]
    schemas = [t["content"]["json_schema"] for t in f["tags"]]
    assert schemas == [{"type": "object"}, WEATHER["parameters"]]  # only the strict tool's schema binds
    assert all(t["begin"].startswith(f["triggers"][0]) for t in f["tags"])
    assert reasons(Call(ASK, strict)) == ["strict tools weather"]


def test_response_formats():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    c = constraint(Call(ASK, response_format={"type": "json_schema", "schema": schema}), HERMES)
    assert c is not None and (c.kind, json.loads(c.spec)) == ("json_schema", schema)
    c = constraint(Call(ASK, response_format={"type": "json_object"}), HERMES)
    assert c is not None and json.loads(c.spec) == {"type": "object"}
    f = form(Call(ASK, TOOLS, response_format={"type": "json_schema", "schema": schema}))
    assert f["type"] == "or"  # calls, or the answer in JSON
    assert f["elements"][1] == {"type": "json_schema", "json_schema": schema}
    c = constraint(Call(ASK, TOOLS, tool_choice="none", response_format={"type": "json_object"}), HERMES)
    assert c is not None and c.kind == "json_schema"


def test_nothing_asked_nothing_constrained():
    for call in (Call(ASK), Call(ASK, TOOLS), Call(ASK, TOOLS, tool_choice="none"), Call(ASK, tool_choice="required")):
        assert constraint(call, HERMES) is None and reasons(call) == [] and marks(call, None) is None


def test_a_format_that_cannot_be_described_is_refused():
    with pytest.raises(BadRequest) as e:
        constraint(Call(ASK, TOOLS, tool_choice="required"), parser_for("qwen3_coder", None))
    assert e.value.param == "tool_choice"
    assert constraint(Call(ASK, TOOLS), parser_for("qwen3_coder", None)) is None
