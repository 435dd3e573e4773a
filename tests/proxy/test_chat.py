"""OpenAI Chat Completions through a real proxy to the real scripted engine, as the SDK sees it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest
from openai.types.chat import ChatCompletion

from polar_hpc import wire

from proxy.helpers import MODEL, check_capture, extends

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


def client(proxy, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0, timeout=20)


def open_session(proxy, session_id: str, token: str) -> openai.OpenAI:
    proxy.gateway.open(session_id, token)
    return client(proxy, token)


def post(url: str, body: bytes, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def calls(message) -> list[tuple]:
    return [(t.id, t.type, t.function.name, t.function.arguments) for t in message.tool_calls or []]


def check_record(record: wire.CallRecord, log, session_id: str, index: int, stream: bool) -> None:
    check_capture(record, log)
    assert record.session_id == session_id and record.call_index == index
    assert record.api == "openai_chat" and record.stream is stream
    assert record.weight_version == "v0"
    assert record.finish_reason == record.response["choices"][0]["finish_reason"]
    assert record.t_start <= record.t_end


def test_tool_turn_then_answer(proxy, engine):
    c = open_session(proxy, "s1", "tok-1")
    raw = c.chat.completions.with_raw_response.create(
        model="whatever", messages=QUESTION, tools=TOOLS
    )
    sent = raw.http_response.json()
    first = raw.parse()
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2+3"}
    rec = proxy.gateway.expect(wire.CallRecord)
    check_record(rec, engine[1], "s1", 0, stream=False)
    assert rec.response == sent
    assert rec.request == {"model": "whatever", "messages": QUESTION, "tools": TOOLS}
    choice = sent["choices"][0]
    assert "prompt_token_ids" not in choice and "response_token_ids" not in choice
    assert "metadata" not in sent and choice["logprobs"] is None
    assert sent["model"] == MODEL

    messages = QUESTION + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = c.chat.completions.create(model="whatever", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "The answer is 5."
    assert second.choices[0].finish_reason == "stop"
    rec2 = proxy.gateway.expect(wire.CallRecord)
    check_record(rec2, engine[1], "s1", 1, stream=False)
    assert rec2.response == second.to_dict()
    assert extends(rec2, rec)  # token-exact in both modes: the reply is re-sent verbatim

    proxy.gateway.send(wire.CloseSession("s1"))
    assert proxy.gateway.expect(wire.SessionClosed) == wire.SessionClosed("s1", 2)
    with pytest.raises(openai.AuthenticationError) as err:
        c.chat.completions.create(model="whatever", messages=QUESTION)
    assert err.value.body["code"] == "invalid_api_key"
    proxy.gateway.quiet(0.2)  # the refused call left no record


@pytest.mark.parametrize("question", [QUESTION, QUESTION + [
    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "calculator", "arguments": "{\"expression\": \"2+3\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
]], ids=["tool_call", "answer"])
def test_stream_assembles_to_the_non_stream_answer(proxy, engine, question):
    c = open_session(proxy, "s2", "tok-2")
    with c.chat.completions.stream(
        model=MODEL, messages=question, tools=TOOLS, logprobs=True,
        stream_options={"include_usage": True},
    ) as stream:
        streamed = stream.get_final_completion()
    rec = proxy.gateway.expect(wire.CallRecord)
    check_record(rec, engine[1], "s2", 0, stream=True)
    answer = ChatCompletion.model_validate(rec.response)  # what a non-streaming call returns
    got, want = streamed.choices[0], answer.choices[0]
    assert got.message.role == want.message.role == "assistant"
    assert got.message.content == want.message.content
    assert calls(got.message) == calls(want.message)
    assert bool(want.message.tool_calls) == (question == QUESTION)
    assert got.finish_reason == want.finish_reason
    assert got.logprobs.content == want.logprobs.content
    assert [e.logprob for e in want.logprobs.content] == rec.output_logprobs
    assert streamed.usage == answer.usage and answer.usage.completion_tokens == len(rec.output_ids)
    assert streamed.id == answer.id

    plain = c.chat.completions.create(model=MODEL, messages=question, tools=TOOLS)
    rec2 = proxy.gateway.expect(wire.CallRecord)
    assert rec2.call_index == 1 and rec2.stream is False
    assert plain.choices[0].message.content == want.message.content
    assert plain.choices[0].logprobs is None


def test_raw_stream_chunk_order(proxy, engine):
    c = open_session(proxy, "s3", "tok-3")
    chunks = list(c.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=TOOLS, stream=True,
        stream_options={"include_usage": True},
    ))
    rec = proxy.gateway.expect(wire.CallRecord)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "tool_calls"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == rec.response["usage"]["total_tokens"]
    calls = [t for c in chunks[:-1] for t in c.choices[0].delta.tool_calls or []]
    assert [(t.index, t.id, t.function.name) for t in calls] == [
        (0, rec.response["choices"][0]["message"]["tool_calls"][0]["id"], "calculator")
    ]
    assert rec.request["stream"] is True
    assert rec.request["stream_options"] == {"include_usage": True}

    chunks = list(c.chat.completions.create(model=MODEL, messages=QUESTION, stream=True))
    proxy.gateway.expect(wire.CallRecord)
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_sessions_keep_their_own_counts(proxy, engine):
    clients = {f"c{i}": open_session(proxy, f"c{i}", f"tok-c{i}") for i in range(3)}
    errors = []

    def work(c: openai.OpenAI) -> None:
        try:
            for _ in range(3):
                c.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for sid in clients:
        proxy.gateway.send(wire.CloseSession(sid))
    seen: dict[str, list[int]] = {sid: [] for sid in clients}
    closed = {}
    for _ in range(9 + 3):
        m = proxy.gateway.next()
        if isinstance(m, wire.CallRecord):
            assert m.session_id not in closed, "a record arrived after its SessionClosed"
            seen[m.session_id].append(m.call_index)
        else:
            closed[m.session_id] = m.n_calls
    assert seen == {sid: [0, 1, 2] for sid in clients}
    assert closed == {sid: 3 for sid in clients}


def test_auth_and_bad_requests(proxy):
    url = proxy.base_url + "/chat/completions"
    body = json.dumps({"model": MODEL, "messages": QUESTION}).encode()
    open_session(proxy, "s4", "tok-4")
    with pytest.raises(openai.AuthenticationError) as err:
        client(proxy, "wrong").chat.completions.create(model=MODEL, messages=QUESTION)
    assert err.value.status_code == 401
    assert err.value.body == {"message": err.value.body["message"], "type": "invalid_request_error",
                              "param": None, "code": "invalid_api_key"}
    status, answer = post(url, body, None)
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    status, answer = post(url, b"{not json", "tok-4")
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    status, answer = post(url, json.dumps({"model": MODEL}).encode(), "tok-4")
    assert status == 400 and answer["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as err:  # the engine's own 400, passed through
        client(proxy, "tok-4").chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=10**6
        )
    assert "context length" in err.value.body["message"]
    assert err.value.body["type"] == "invalid_request_error"
    proxy.gateway.quiet(0.2)  # no records for refused calls
    status, answer = post(url, body, "tok-4")
    assert status == 200 and answer["object"] == "chat.completion"
    assert proxy.gateway.expect(wire.CallRecord).call_index == 0


def test_models(proxy):
    assert [m.id for m in client(proxy, "any").models.list()] == [MODEL]
