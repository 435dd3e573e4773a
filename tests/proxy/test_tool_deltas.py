"""tito mode streams each tool call as soon as it is complete, in every API, for both tool formats.

The scripted engine writes two tool calls and pauses 1 s after the first (`pause_after`); the
official SDKs must hold the first call, complete, well before the engine sends its last token.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import anthropic
import openai
import pytest

from polar_hpc import wire
from polar_hpc.engines.scripted.chat_format import ChatFormat

from proxy.helpers import MODEL, FakeGateway, check_capture, start_engine, start_proxy, stop

PAUSE_S = 1.0
LOOKUP = {"name": "lookup", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}}
ARGUMENTS = [{"path": "a.txt", "n": 2}, {"path": "b.txt", "n": 3}]
REPLIES = {
    "hermes": ("Let me look.\n" + "\n".join(
        f'<tool_call>\n{{"name": "lookup", "arguments": {json.dumps(a)}}}\n</tool_call>'
        for a in ARGUMENTS), "</tool_call>"),
    "qwen3_coder": ("Let me look.\n" + "\n".join(
        f"<tool_call>\n<function=lookup>\n<parameter=path>\n{a['path']}\n</parameter>\n"
        f"<parameter=n>\n{a['n']}\n</parameter>\n</function>\n</tool_call>"
        for a in ARGUMENTS), "</function>"),
}


@pytest.fixture(scope="module")
def setup():
    """One engine that answers `FORMAT <name>` with REPLIES[name]; one tito proxy per format."""
    with tempfile.TemporaryDirectory(prefix="pxd") as d:
        tmp = Path(d)
        rules = tmp / "rules.yaml"
        rules.write_text(json.dumps([
            {"when": f"FORMAT {name}", "reply": text.replace("\\", "\\\\"), "pause_after": pause,
             "pause_ms": int(PAUSE_S * 1000)}
            for name, (text, pause) in REPLIES.items()]))
        engine, url, log = start_engine(tmp, "engine", "--script", str(rules), "--token-delay-ms", "2")
        gateways, proxies = [], {}
        try:
            for name in REPLIES:
                gateways.append(FakeGateway(tmp / f"{name}.ipc"))
                proxies[name] = start_proxy(tmp, gateways[-1], url, name=name, tool_parser=name)
            yield proxies, log
        finally:
            for proxy in proxies.values():
                proxy.stop()
            stop(engine)
            for gateway in gateways:
                gateway.close()


def _chat(proxy, token: str, prompt: str):
    c = openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=30)
    calls, text = [], ""
    for chunk in c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}],
            tools=[{"type": "function", "function": LOOKUP}], stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta and delta.content) or ""
        for tc in (delta and delta.tool_calls) or []:
            assert tc.index == len(calls)
            calls.append((time.time(), tc.id, tc.function.name, json.loads(tc.function.arguments)))
    return calls, text, lambda rec: [c["id"] for c in rec.response["choices"][0]["message"]["tool_calls"]]


def _responses(proxy, token: str, prompt: str):
    c = openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=30)
    calls, text, deltas = [], "", []
    for event in c.responses.create(model=MODEL, input=prompt, stream=True, store=False,
                                    tools=[{"type": "function", **LOOKUP}]):
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.function_call_arguments.delta":
            deltas.append(event.delta)
        elif event.type == "response.output_item.done" and event.item.type == "function_call":
            item = event.item
            assert json.loads("".join(deltas)) == json.loads(item.arguments)
            deltas.clear()
            calls.append((time.time(), item.call_id, item.name, json.loads(item.arguments)))
    return calls, text, lambda rec: [
        o["call_id"] for o in rec.response["output"] if o["type"] == "function_call"]


def _anthropic(proxy, token: str, prompt: str):
    c = anthropic.Anthropic(base_url=proxy.url, api_key=token, max_retries=0, timeout=30)
    calls, text = [], ""
    tools = [{"name": LOOKUP["name"], "description": LOOKUP["description"],
              "input_schema": LOOKUP["parameters"]}]
    with c.messages.stream(model=MODEL, max_tokens=500, tools=tools,
                           messages=[{"role": "user", "content": prompt}]) as stream:
        for event in stream:
            if event.type == "text":
                text += event.text
            elif event.type == "content_block_stop" and event.content_block.type == "tool_use":
                block = event.content_block
                calls.append((time.time(), block.id, block.name, block.input))
    return calls, text, lambda rec: [
        b["id"] for b in rec.response["content"] if b["type"] == "tool_use"]


@pytest.mark.parametrize("fmt", list(REPLIES))
@pytest.mark.parametrize("client", [_chat, _responses, _anthropic])
def test_a_tool_call_reaches_the_client_before_the_generation_ends(setup, fmt, client):
    proxies, log = setup
    proxy = proxies[fmt]
    token = f"{client.__name__}-{fmt}"
    proxy.gateway.open(token, token)
    calls, text, record_ids = client(proxy, token, f"FORMAT {fmt}")
    ended = time.time()
    rec = proxy.gateway.expect(wire.CallRecord)
    sample = check_capture(rec, log)  # token-exact: the engine's ids and logprobs
    assert ChatFormat().decode(sample["output_ids"], True) == REPLIES[fmt][0]
    assert text == "Let me look."
    assert [(name, arguments) for _, _, name, arguments in calls] == [
        ("lookup", a) for a in ARGUMENTS]
    assert [call_id for _, call_id, _, _ in calls] == record_ids(rec)
    # the first call was in hand while the engine was still pausing before its last tokens
    first = calls[0][0]
    assert first < sample["t"][-1] - PAUSE_S / 2 and ended - first > PAUSE_S / 2
    assert calls[1][0] > first + PAUSE_S / 2  # and the second one came after the pause
