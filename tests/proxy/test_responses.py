"""OpenAI Responses through a real proxy to the scripted engine, as the official SDK sees it."""

from __future__ import annotations

import json

import openai
import pytest

from polar_hpc import wire

from proxy.helpers import CALCULATOR, MODEL, check_capture, extends

TOOLS = [{"type": "function", **CALCULATOR}]


def sdk(proxy, token: str) -> openai.OpenAI:
    proxy.gateway.open(token, token)
    return openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=20)


def test_function_call_round_trip(proxy, engine):
    c = sdk(proxy, "r1")
    first = c.responses.create(model="gpt-5", instructions="Be brief.", input="What is 6*7?",
                               tools=TOOLS, store=False)
    [call] = first.output
    assert call.type == "function_call" and call.name == "calculator"
    assert json.loads(call.arguments) == {"expression": "6*7"}
    assert first.model == MODEL and first.status == "completed"
    rec = proxy.gateway.expect(wire.CallRecord)
    assert rec.api == "openai_responses" and rec.finish_reason == "tool_calls"
    check_capture(rec, engine[1])
    assert first.usage.output_tokens == len(rec.output_ids)
    assert rec.response == first.to_dict()
    assert rec.meta["chat"]["messages"][0] == {"role": "system", "content": "Be brief."}

    history = [{"role": "user", "content": "What is 6*7?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    second = c.responses.create(model="gpt-5", instructions="Be brief.", input=history,
                                tools=TOOLS, store=False)
    assert second.output_text == "The answer is 42."
    rec2 = proxy.gateway.expect(wire.CallRecord)
    check_capture(rec2, engine[1])
    assert extends(rec2, rec)


def test_stream_events_and_final_response(proxy, engine):
    c = sdk(proxy, "r2")
    with c.responses.stream(model=MODEL, input="Hello there", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    rec = proxy.gateway.expect(wire.CallRecord)
    check_capture(rec, engine[1])
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text
    assert final.output_text and "".join(deltas) == final.output_text
    # tito streams tokens as they come; passthrough emits the whole text at once, in one delta
    assert len(deltas) == 1 if proxy.mode == "passthrough" else len(deltas) > 1, deltas
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == rec.response["output"][0]["content"][0]["text"]
    assert final.id == rec.response["id"] and final.output[0].id == rec.response["output"][0]["id"]
    assert rec.stream is True

    with c.responses.stream(model=MODEL, input="What is 1+1?", tools=TOOLS) as stream:
        done = [e.item for e in stream if e.type == "response.output_item.done"]
    assert [(i.type, i.name) for i in done] == [("function_call", "calculator")]
    proxy.gateway.expect(wire.CallRecord)


def test_errors_in_openai_shape(proxy):
    c = sdk(proxy, "r3")
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert err.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model=MODEL, input=[{"type": "image_generation_call", "id": "x"}])
    assert "image_generation_call" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model=MODEL, input="hi", max_output_tokens=10**6)
    assert err.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=proxy.base_url, api_key="nope", max_retries=0).responses.create(
            model=MODEL, input="hi")
    proxy.gateway.quiet(0.2)
