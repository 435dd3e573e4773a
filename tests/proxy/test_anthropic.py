"""Anthropic Messages through a real proxy to the scripted engine, as the official SDK sees it."""

from __future__ import annotations

import anthropic
import pytest

from polar_hpc import wire

from proxy.helpers import CALCULATOR, MODEL, check_capture, extends

TOOLS = [{"name": CALCULATOR["name"], "description": CALCULATOR["description"],
          "input_schema": CALCULATOR["parameters"]}]


def sdk(proxy, token: str) -> anthropic.Anthropic:
    proxy.gateway.open(token, token)
    return anthropic.Anthropic(base_url=proxy.url, api_key=token, max_retries=0, timeout=20)


def test_tool_use_round_trip(proxy, engine):
    c = sdk(proxy, "a1")
    question = [{"role": "user", "content": "What is 9-4?"}]
    first = c.messages.create(model="any-claude-model", max_tokens=200, system="Be brief.",
                              messages=question, tools=TOOLS)
    [use] = first.content
    assert use.type == "tool_use" and use.name == "calculator" and use.input == {"expression": "9-4"}
    assert first.stop_reason == "tool_use" and first.model == MODEL
    rec = proxy.gateway.expect(wire.CallRecord)
    assert rec.api == "anthropic_messages"
    check_capture(rec, engine[1])
    assert first.usage.output_tokens == len(rec.output_ids)
    assert rec.response == first.to_dict()

    history = question + [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]},
    ]
    second = c.messages.create(model="any-claude-model", max_tokens=200, system="Be brief.",
                               messages=history, tools=TOOLS)
    assert second.content[0].text == "The answer is 5." and second.stop_reason == "end_turn"
    rec2 = proxy.gateway.expect(wire.CallRecord)
    check_capture(rec2, engine[1])
    assert extends(rec2, rec)


def test_stream_text_and_tool_use(proxy, engine):
    c = sdk(proxy, "a2")
    with c.messages.stream(model=MODEL, max_tokens=200, messages=[
            {"role": "user", "content": "Hello"}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    rec = proxy.gateway.expect(wire.CallRecord)
    check_capture(rec, engine[1])
    assert "".join(pieces) == final.content[0].text
    assert final.content[0].text and "".join(pieces) == final.content[0].text
    # tito streams tokens as they come; passthrough emits the whole text at once, in one piece
    assert len(pieces) == 1 if proxy.mode == "passthrough" else len(pieces) > 1, pieces
    assert final.to_dict()["content"] == rec.response["content"]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == len(rec.output_ids)

    with c.messages.stream(model=MODEL, max_tokens=200, tools=TOOLS, messages=[
            {"role": "user", "content": "What is 3*3?"}]) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.input) for b in final.content] == [("tool_use", {"expression": "3*3"})]
    assert final.stop_reason == "tool_use"
    proxy.gateway.expect(wire.CallRecord)


def test_errors_in_anthropic_shape(proxy):
    c = sdk(proxy, "a3")
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=proxy.url, api_key="nope", max_retries=0).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model=MODEL, max_tokens=10**6, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["type"] == "error"
    assert "context length" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "robot", "content": "hi"}])
    assert "messages.0.role" in err.value.body["error"]["message"]
    proxy.gateway.quiet(0.2)
