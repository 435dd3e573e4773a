"""Capture against a real vLLM (the session's `vllm` fixture) through a real proxy, in both capture
modes, for all three APIs (through the openai and anthropic SDKs), streamed or not: every recorded
sampled id and logprob is what vLLM itself answers for that call (asked again directly, greedy, so
the same), tito's prompt ids are what vLLM renders from the same conversation (its chat route's
`prompt_token_ids`), and vLLM's answers, which carry no weight version, are stamped with the one
the engine registry gave the proxy. The tiny model knows only the conversations it was taught:
what it says elsewhere is used as it comes, never relied on; asked the calculator agent's first
call, it writes the calculator call it was taught, and that call must reach harness and record."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from polar_hpc import wire
from polar_hpc.engines.tiny import conversation as calc
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import CALCULATOR, MODEL, start_proxy

pytestmark = pytest.mark.timeout(900)  # the session's vLLM may start within a test: minutes on a busy host
MAX = 12
GREEDY = {"temperature": 0}  # (this anthropic SDK takes no temperature argument)
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": CALCULATOR}]
FIRST_CALL = [{"role": "system", "content": calc.SYSTEM}, {"role": "user", "content": calc.QUESTION}]
HISTORY = [  # a finished tool call in the history: the template renders calls and results
    {"role": "user", "content": "Use the calculator: 6 * 7"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6 * 7"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
]


@pytest.fixture(params=["tito", "passthrough"])
def proxy(request, short_tmp, gateway, vllm):  # noqa: F811
    p = start_proxy(short_tmp, gateway, vllm.url, mode=request.param, engine_kind="vllm")
    p.mode = request.param
    gateway.send(wire.Engines(urls=[vllm.url], versions={vllm.url: "v7"}))
    gateway.open("s", "tok")
    yield p
    p.stop()
    assert p.proc.returncode == 0, p.log.read_text()


def _chat(proxy, messages, tools, stream: bool) -> str:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)
    extra = {"tools": tools} if tools else {}
    if not stream:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX, temperature=0, **extra)
        return answer.choices[0].message.content or ""
    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX, temperature=0,
                                            stream=True, **extra)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _responses(proxy, messages, stream: bool) -> str:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)
    if not stream:
        return client.responses.create(model=MODEL, input=messages, max_output_tokens=MAX, temperature=0).output_text
    events = client.responses.create(model=MODEL, input=messages, max_output_tokens=MAX, temperature=0, stream=True)
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def _messages(proxy, messages, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="tok", max_retries=0, timeout=300)
    if not stream:
        answer = client.messages.create(model=MODEL, messages=messages, max_tokens=MAX, extra_body=GREEDY)
        return "".join(b.text for b in answer.content if b.type == "text")
    with client.messages.stream(model=MODEL, messages=messages, max_tokens=MAX, extra_body=GREEDY) as events:
        return "".join(events.text_stream)


def check_against_vllm(vllm, proxy, record: wire.CallRecord, messages, tools=None) -> None:
    """The record is token-exact: what vLLM answers when asked the same directly."""
    assert record.weight_version == "v7"  # vLLM reports none: the registry's, as the proxy knew it
    assert record.engine_url == vllm.url and len(record.output_ids) == len(record.output_logprobs) > 0
    extra = {"tools": tools} if tools else {}
    chat = vllm.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": MAX,
                                              "temperature": 0, "logprobs": True, "return_token_ids": True, **extra})
    assert record.prompt_ids == chat["prompt_token_ids"]  # tito renders as vLLM does, tools included
    if proxy.mode == "passthrough":
        choice = chat["choices"][0]
        ids, logprobs = choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]
    else:
        choice = vllm.post("/v1/completions", {"model": MODEL, "prompt": record.prompt_ids, "max_tokens": MAX,
                                               "temperature": 0, "logprobs": 0, "return_token_ids": True})["choices"][0]
        ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        assert choice["prompt_token_ids"] == record.prompt_ids
    assert record.output_ids == ids
    assert record.output_logprobs == logprobs


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["openai_chat", "openai_responses", "anthropic_messages"])
def test_every_api_captures_what_vllm_sampled(vllm, proxy, api, stream) -> None:
    ask = {"openai_chat": lambda: _chat(proxy, ASK, None, stream), "openai_responses": lambda: _responses(proxy, ASK, stream),
           "anthropic_messages": lambda: _messages(proxy, ASK, stream)}[api]
    text = ask()
    record = proxy.gateway.expect(wire.CallRecord, timeout=60)
    assert (record.api, record.stream, record.meta["mode"]) == (api, stream, proxy.mode)
    check_against_vllm(vllm, proxy, record, ASK)
    reply = record.response["choices"][0]["message"]["content"] if api == "openai_chat" else None
    if reply is not None:
        assert text == reply  # the harness got (streamed) what was recorded


@pytest.mark.parametrize("stream", [False, True])
def test_tools_and_a_tool_result_in_the_history(vllm, proxy, stream) -> None:
    _chat(proxy, HISTORY, TOOLS, stream)
    record = proxy.gateway.expect(wire.CallRecord, timeout=60)
    check_against_vllm(vllm, proxy, record, HISTORY, TOOLS)


@pytest.mark.parametrize("stream", [False, True])
def test_the_tool_call_the_model_writes_reaches_the_harness_and_the_record(vllm, proxy, stream) -> None:
    """The tiny model was taught the calculator agent's first call: asked it greedily, it writes one
    calculator call, which the harness gets (streamed or not) and the record holds, as a tool call."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)
    ask = dict(model=MODEL, messages=FIRST_CALL, tools=calc.TOOLS, max_tokens=200, temperature=0)
    if stream:
        chunks = [c for c in client.chat.completions.create(stream=True, **ask) if c.choices]
        parts: dict[int, list[str]] = {}
        for delta in (d for c in chunks for d in c.choices[0].delta.tool_calls or []):
            part = parts.setdefault(delta.index, ["", ""])
            part[0] += delta.function.name or ""
            part[1] += delta.function.arguments or ""
        got = [(name, json.loads(arguments)) for name, arguments in parts.values()]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    else:
        choice = client.chat.completions.create(**ask).choices[0]
        got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        finish = [choice.finish_reason]
    assert got == [("calculator", {"expression": calc.EXPRESSION})] and finish == ["tool_calls"], (got, finish)
    record = proxy.gateway.expect(wire.CallRecord, timeout=60)
    calls = record.response["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == got
    assert record.finish_reason == "tool_calls"


def test_a_second_turn_extends_the_first_token_exactly(vllm, proxy) -> None:
    """tito: the second call's prompt is the first's prompt + sampled ids + the new turn (or a new
    chain that says why); passthrough: vLLM's own rendering of the second call."""
    first = _chat(proxy, ASK, None, False)
    r1 = proxy.gateway.expect(wire.CallRecord, timeout=60)
    second = [*ASK, {"role": "assistant", "content": first}, {"role": "user", "content": "And 3 + 3?"}]
    _chat(proxy, second, None, False)
    r2 = proxy.gateway.expect(wire.CallRecord, timeout=60)
    if proxy.mode == "passthrough":  # vLLM renders each call itself: the record holds its rendering, token-exact
        check_against_vllm(vllm, proxy, r2, second)
    elif r1.finish_reason == "stop":  # ended with the end token: one chain
        assert r2.prompt_ids[: len(r1.prompt_ids) + len(r1.output_ids)] == r1.prompt_ids + r1.output_ids
    else:  # cut by max_tokens (the untaught question rarely ends within MAX): a new chain, and it says why
        assert r2.meta.get("new_chain"), r2.meta
    tito_choice = vllm.post("/v1/completions", {"model": MODEL, "prompt": r2.prompt_ids, "max_tokens": MAX,
                                                "temperature": 0, "logprobs": 0, "return_token_ids": True})["choices"][0]
    if proxy.mode == "tito":
        assert (r2.output_ids, r2.output_logprobs) == (tito_choice["token_ids"], tito_choice["logprobs"]["token_logprobs"])


def test_the_registry_version_at_the_call_start_is_recorded(vllm, proxy) -> None:
    _chat(proxy, ASK, None, False)
    assert proxy.gateway.expect(wire.CallRecord, timeout=60).weight_version == "v7"
    proxy.gateway.send(wire.Engines(urls=[vllm.url], versions={vllm.url: "v8"}))
    for _ in range(50):  # the proxy has the new membership once a call is recorded with it
        _chat(proxy, ASK, None, False)
        if proxy.gateway.expect(wire.CallRecord, timeout=60).weight_version == "v8":
            return
    raise AssertionError("the proxy never stamped the registry's new version")
