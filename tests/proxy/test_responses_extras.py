"""Responses logprobs (`include: ["message.output_text.logprobs"]`, `top_logprobs`) and `namespace`
tool groups through a real proxy to a scripted engine, in each capture mode, as the official SDK
parses them."""

from __future__ import annotations

import json

import openai
import pytest

from polar_hpc import wire

from proxy.helpers import CALCULATOR, start_engine, stop

MATH = {"type": "namespace", "name": "math", "description": "Arithmetic tools.",
        "tools": [{"type": "function", **CALCULATOR}]}
RULES = [  # the namespaced calculator is called `math.calculator` in the prompt, as the proxy renders it
    {"when": "<tool_response>\n(?P<r>[^<]*)\n</tool_response><\\|im_end\\|>\n<\\|im_start\\|>assistant\n\\Z",
     "reply": "The answer is \\g<r>."},
    {"when": '"name": "math.calculator".*What is (?P<e>[\\d*]+)\\?',
     "reply": '<tool_call>\n{"name": "math.calculator", "arguments": {"expression": "\\g<e>"}}\n</tool_call>'},
    {"when": "", "reply": "Two and two make four."},
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A scripted engine with the rules above (overrides the session's for this module's proxies)."""
    tmp = tmp_path_factory.mktemp("ns")
    (tmp / "rules.yaml").write_text(json.dumps(RULES))
    proc, url, log = start_engine(tmp, "engine", "--script", str(tmp / "rules.yaml"))
    yield url, log
    stop(proc)


def sdk(proxy, token: str) -> openai.OpenAI:
    proxy.gateway.open(token, token)
    return openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=30)


def test_logprobs_in_the_output_text_part(proxy):
    c = sdk(proxy, "lp")
    reply = c.responses.create(model="m", input="Hello?", include=["message.output_text.logprobs"])
    record = proxy.gateway.expect(wire.CallRecord)
    [part] = reply.output[0].content
    assert part.type == "output_text" and part.text == "Two and two make four."
    assert [e.logprob for e in part.logprobs] == record.output_logprobs
    assert "".join(e.token for e in part.logprobs).startswith(part.text)  # then the end token
    assert all(bytes(e.bytes) == e.token.encode() and e.top_logprobs == [] for e in part.logprobs)
    assert record.response["output"][0]["content"][0]["logprobs"] == [e.model_dump() for e in part.logprobs]
    plain = c.responses.create(model="m", input="Hello?")
    proxy.gateway.expect(wire.CallRecord)
    assert plain.output[0].content[0].logprobs is None


def test_streamed_logprobs_come_with_the_done_events(proxy):
    c = sdk(proxy, "lps")
    done, final = None, None
    with c.responses.stream(model="m", input="Hello?", include=["message.output_text.logprobs"]) as stream:
        for event in stream:
            if event.type == "response.output_text.done":
                done = event
            elif event.type == "response.completed":
                final = event.response
    record = proxy.gateway.expect(wire.CallRecord)
    assert done is not None and [e.logprob for e in done.logprobs] == record.output_logprobs
    assert final is not None and [e.logprob for e in final.output[0].content[0].logprobs] == record.output_logprobs


def test_namespaced_tools_are_called_with_their_namespace(proxy):
    c = sdk(proxy, "ns")
    first = c.responses.create(model="m", input="What is 6*7?", tools=[MATH])
    [call] = first.output
    assert (call.type, call.namespace, call.name) == ("function_call", "math", "calculator")
    assert json.loads(call.arguments) == {"expression": "6*7"}
    record = proxy.gateway.expect(wire.CallRecord)
    [tool] = record.meta["chat"]["tools"]
    assert tool["function"]["name"] == "math.calculator"
    assert tool["function"]["description"] == "Arithmetic tools.\n\n" + CALCULATOR["description"]
    history = ["What is 6*7?", call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    history[0] = {"role": "user", "content": history[0]}
    second = c.responses.create(model="m", input=history, tools=[MATH])
    assert second.output_text == "The answer is 42."
    record = proxy.gateway.expect(wire.CallRecord)
    assert record.meta["chat"]["messages"][1]["tool_calls"][0]["function"]["name"] == "math.calculator"
    if proxy.mode == "tito":
        assert "new_chain" not in record.meta  # the namespaced call re-renders as it was sampled
    # streamed: the function call item carries its namespace in every event
    with c.responses.stream(model="m", input="What is 6*7?", tools=[MATH]) as stream:
        items = [e.item for e in stream if e.type == "response.output_item.done"]
    proxy.gateway.expect(wire.CallRecord)
    assert [(i.namespace, i.name) for i in items] == [("math", "calculator")]


def test_a_dotted_name_in_a_namespace_is_refused(proxy):
    c = sdk(proxy, "nsd")
    bad = dict(MATH, tools=[{"type": "function", **CALCULATOR, "name": "a.b"}])
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input="What is 6*7?", tools=[bad])
    assert e.value.body["param"] == "tools[0].tools[0].name"
