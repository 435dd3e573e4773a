"""Sampling controls and constrained decoding through a real proxy to the scripted engine (SGLang's
API), in both capture modes: the controls reach the engine and each call records what it sampled
under (`meta["sampling"]`, `meta["constrained"]`); what the engine cannot honour (a logit bias,
constrained decoding on the scripted engine) reaches the harness as the engine's 400, never
ignored. (Constrained decoding honoured: tests/vllm/test_constrained.py on a real vLLM.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from polar_hpc import wire

from proxy.helpers import CALCULATOR, MODEL, check_capture

TOOLS = [{"type": "function", "function": CALCULATOR}]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
CONTROLS = {"seed": 11, "presence_penalty": 0.5, "frequency_penalty": 0.25, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.05}


def client(proxy, token: str) -> openai.OpenAI:
    proxy.gateway.open(token, token)
    return openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=300)


def test_controls_reach_the_engine_and_are_recorded(proxy, engine):
    c = client(proxy, "s1")
    reply = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0.7, top_p=0.9,
                                      stop=["never"], max_completion_tokens=64, extra_body=CONTROLS)
    assert reply.choices[0].message.tool_calls[0].function.name == "calculator"
    rec = proxy.gateway.expect(wire.CallRecord)
    check_capture(rec, engine[1])
    sampling = rec.meta["sampling"]
    assert {k: sampling[k] for k in CONTROLS} == CONTROLS
    assert (sampling["temperature"], sampling["top_p"], sampling["stop"]) == (0.7, 0.9, ["never"])
    assert sampling.get("max_tokens", sampling.get("max_completion_tokens")) == 64
    assert rec.meta["constrained"] is None


def test_anthropic_and_responses_controls_are_recorded(proxy):
    proxy.gateway.open("s2", "s2")
    r = httpx.post(proxy.url + "/v1/messages", headers={"x-api-key": "s2"}, timeout=300, json={
        "model": MODEL, "max_tokens": 32, "messages": ASK, "top_k": 3, "stop_sequences": ["zz"]})
    assert r.status_code == 200, r.text
    sampling = proxy.gateway.expect(wire.CallRecord).meta["sampling"]
    assert sampling["top_k"] == 3 and sampling["stop"] == ["zz"] and sampling["max_tokens"] == 32
    r = httpx.post(proxy.url + "/v1/responses", headers={"Authorization": "Bearer s2"}, timeout=300, json={
        "model": MODEL, "input": "hi", "seed": 5, "max_output_tokens": 40})
    assert r.status_code == 200, r.text
    sampling = proxy.gateway.expect(wire.CallRecord).meta["sampling"]
    assert sampling["seed"] == 5 and sampling["max_tokens"] == 40


@pytest.mark.parametrize("extra, needle", [
    ({"logit_bias": {"5": -100}}, "logit"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "calculator"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}},
     "response_format"),
    ({"tools": [{"type": "function", "function": dict(CALCULATOR, strict=True)}]}, "tools"),
])
def test_what_the_engine_cannot_honour_is_its_400(proxy, extra, needle):
    c = client(proxy, "s3")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=ASK, **extra)
    message = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
    assert "scripted engine" in message and (needle in message or proxy.mode == "tito"), message


def test_anthropic_any_and_responses_json_format_ask_the_engine(proxy):
    proxy.gateway.open("s4", "s4")
    tools = [{"name": "calculator", "description": "", "input_schema": CALCULATOR["parameters"]}]
    r = httpx.post(proxy.url + "/v1/messages", headers={"x-api-key": "s4"}, timeout=300, json={
        "model": MODEL, "max_tokens": 32, "messages": ASK, "tools": tools, "tool_choice": {"type": "any"}})
    assert r.status_code == 400 and "scripted engine" in r.text, r.text
    r = httpx.post(proxy.url + "/v1/responses", headers={"Authorization": "Bearer s4"}, timeout=300, json={
        "model": MODEL, "input": "hi", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 400 and "scripted engine" in r.text, r.text


def test_tool_choice_none_reads_no_calls(proxy):
    if proxy.mode != "tito":
        pytest.skip("passthrough: the engine's chat route decides (the scripted one leaves the tools out)")
    c = client(proxy, "s5")
    reply = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none")
    choice = reply.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert '<tool_call>\n{"name": "calculator"' in choice.message.content  # what the model wrote
    assert proxy.gateway.expect(wire.CallRecord).meta["constrained"] is None


def test_n_choices_are_samples_of_their_own_each_recorded(proxy, engine):
    c = client(proxy, "s6")
    if proxy.mode == "passthrough":
        with pytest.raises(openai.BadRequestError, match="tito"):
            c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, n=2)
        return
    reply = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, n=2, seed=7)
    assert [ch.index for ch in reply.choices] == [0, 1]
    assert all(ch.message.tool_calls[0].function.name == "calculator" for ch in reply.choices)
    records = [proxy.gateway.expect(wire.CallRecord) for _ in range(2)]
    assert sorted(r.meta["choice"] for r in records) == [0, 1]
    assert len({r.meta["rid"] for r in records}) == 2 and len({r.call_index for r in records}) == 2
    for r in records:
        check_capture(r, engine[1])  # each what the engine sampled for its own request
        assert r.meta["sampling"]["seed"] == 7 + r.meta["choice"]
    assert reply.usage.completion_tokens == sum(len(r.output_ids) for r in records)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=ASK, n=2, stream=True)
