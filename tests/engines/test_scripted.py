"""The scripted engine as a real process: `polar-hpc engine --kind scripted`, over real HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from polar_hpc.engines.scripted.chat_format import ChatFormat
from polar_hpc.engines.scripted.policy import logprobs

POLAR = Path(sys.executable).parent / "polar-hpc"
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "What is 12 * (3 + 4)?"}]
TOOL_REPLY = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(url, sample log path) of one engine for the module; it must exit 0 on SIGTERM."""
    tmp = tmp_path_factory.mktemp("engine")
    ready, log = tmp / "ready.json", tmp / "samples.jsonl"
    proc = subprocess.Popen(
        [POLAR, "engine", "--kind", "scripted", "--port", "0", "--ready-file", ready,
         "--sample-log", log, "--weight-version", "v7", "--context-length", "1024"],
        stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "engine did not become ready"
        time.sleep(0.05)
    yield json.loads(ready.read_text())["url"], log
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def call(url: str, path: str, body: object | None = None, raw: bytes | None = None):
    """(status, parsed JSON body or raw text) of a GET (no body) or POST."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, payload = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read().decode()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload


def events(url: str, path: str, body: dict) -> list:
    """The SSE `data:` payloads of a streaming POST, parsed (the final "[DONE]" kept as text)."""
    status, text = call(url, path, body)
    assert status == 200 and isinstance(text, str)
    assert text.endswith("data: [DONE]\n\n")
    chunks = [c.removeprefix("data: ") for c in text.split("\n\n") if c]
    assert all(not c.startswith("data:") for c in chunks)
    return [json.loads(c) for c in chunks[:-1]] + [chunks[-1]]


def chat(url: str, messages: list, **extra) -> dict:
    status, body = call(url, "/v1/chat/completions", {"messages": messages, **extra})
    assert status == 200, body
    return body


def test_generate_ids_logprobs_and_cache(engine, fmt):
    url, _ = engine
    prompt = fmt.encode(fmt.render(ASK, [CALC]))
    body = {"input_ids": prompt, "return_logprob": True, "sampling_params": {"temperature": 0.7}}
    status, out = call(url, "/generate", body)
    assert status == 200
    assert out["output_ids"] == fmt.encode(TOOL_REPLY) + [2]
    assert out["text"] == TOOL_REPLY
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": 2}
    assert meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert meta["weight_version"] == "v7" and meta["e2e_latency"] >= 0
    pairs = meta["output_token_logprobs"]
    assert [p[1] for p in pairs] == out["output_ids"] and all(p[2] is None for p in pairs)
    assert [p[0] for p in pairs] == logprobs(prompt, out["output_ids"])
    again = call(url, "/generate", {**body, "rid": "again"})[1]
    assert again["meta_info"]["output_token_logprobs"] == pairs
    assert again["meta_info"]["cached_tokens"] == len(prompt)
    assert again["meta_info"]["id"] == "again"


def test_generate_finish_reasons(engine, fmt):
    url, _ = engine
    def run(**sampling):
        return call(url, "/generate", {"text": "hello", "sampling_params": sampling})[1]

    full = run()
    ids = full["output_ids"]
    assert full["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2} and len(ids) > 6

    by_token = run(stop_token_ids=[ids[4]])
    assert by_token["output_ids"] == ids[:5]
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[4]}
    assert by_token["text"] == fmt.decode(ids[:4])

    stop = "scripted"
    by_string = run(stop=[stop, "zzz"])
    assert by_string["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert by_string["text"] == full["text"][: full["text"].index(stop)]
    assert stop in fmt.decode(by_string["output_ids"])
    assert ids[: len(by_string["output_ids"])] == by_string["output_ids"]

    by_length = run(max_new_tokens=3)
    assert by_length["output_ids"] == ids[:3]
    assert by_length["meta_info"]["finish_reason"] == {"type": "length", "length": 3}

    raw = run(skip_special_tokens=False)
    assert raw["output_ids"] == ids and raw["text"] == full["text"]  # the matched eos is trimmed


def test_generate_stream_assembles_to_the_plain_response(engine, fmt):
    url, _ = engine
    body = {"text": "hello", "return_logprob": True, "rid": "s1"}
    plain = call(url, "/generate", body)[1]
    chunks = events(url, "/generate", {**body, "stream": True})
    assert chunks.pop() == "[DONE]"
    assert len(chunks) == len(plain["output_ids"])
    for k, chunk in enumerate(chunks, start=1):
        assert chunk["output_ids"] == plain["output_ids"][:k]
        assert plain["text"].startswith(chunk["text"])
        assert chunk["meta_info"]["completion_tokens"] == k
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["text"] == plain["text"]
    for key in ("finish_reason", "output_token_logprobs", "prompt_tokens", "id"):
        assert last["meta_info"][key] == plain["meta_info"][key]


def test_chat_tool_call_then_final_answer(engine):
    url, _ = engine
    first = chat(url, ASK, tools=[CALC], tool_choice="auto")
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    (tool_call,) = message["tool_calls"]
    assert tool_call["id"].startswith("call_") and tool_call["type"] == "function"
    arguments = '{"expression": "12 * (3 + 4)"}'
    assert tool_call["function"] == {"name": "calculator", "arguments": arguments}
    assert first["object"] == "chat.completion" and first["metadata"] == {"weight_version": "v7"}

    turn = [*ASK, message, {"role": "tool", "tool_call_id": tool_call["id"], "content": "84"}]
    second = chat(url, turn, tools=[CALC])
    assert second["choices"][0]["message"] == {"role": "assistant", "content": "The answer is 84."}
    assert second["choices"][0]["finish_reason"] == "stop"
    none = chat(url, ASK, tools=[CALC], tool_choice="none")  # tools not offered: no call
    assert "tool_calls" not in none["choices"][0]["message"]


def test_chat_token_ids_logprobs_and_usage_align(engine, fmt):
    url, _ = engine
    out = chat(url, ASK, tools=[CALC], logprobs=True, return_token_ids=True)
    choice = out["choices"][0]
    prompt, response = choice["prompt_token_ids"], choice["response_token_ids"]
    assert prompt == fmt.encode(fmt.render(ASK, [CALC]))
    assert response == fmt.encode(TOOL_REPLY) + [2]
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(response)
    assert [e["logprob"] for e in entries] == logprobs(prompt, response)
    assert bytes(b for e in entries for b in e["bytes"]) == (TOOL_REPLY + "<|im_end|>").encode()
    assert entries[-1]["token"] == "<|im_end|>" and all(e["top_logprobs"] == [] for e in entries)
    assert out["usage"]["prompt_tokens"] == len(prompt)
    assert out["usage"]["completion_tokens"] == len(response)
    assert out["usage"]["total_tokens"] == len(prompt) + len(response)
    assert "cached_tokens" in out["usage"]["prompt_tokens_details"]
    short = chat(url, ASK, tools=[CALC], max_tokens=4, return_token_ids=True)["choices"][0]
    assert short["finish_reason"] == "length" and short["response_token_ids"] == response[:4]
    assert "tool_calls" not in short["message"]


def test_prompts_extend_token_exactly_across_turns(engine):
    url, _ = engine
    messages, previous, finishes = list(ASK), [], []
    for follow in ({"role": "tool", "content": "84"}, {"role": "user", "content": "Thanks!"}, None):
        choice = chat(url, messages, tools=[CALC], return_token_ids=True)["choices"][0]
        prompt = choice["prompt_token_ids"]
        assert len(prompt) > len(previous) and prompt[: len(previous)] == previous
        previous = prompt + choice["response_token_ids"]
        finishes.append(choice["finish_reason"])
        messages += [choice["message"]] + ([follow] if follow else [])
    assert finishes == ["tool_calls", "stop", "stop"]


def test_chat_stream_matches_the_plain_response(engine):
    url, _ = engine
    for messages, tools in ((ASK, [CALC]), (ASK, None)):
        extra = {"logprobs": True, "return_token_ids": True}
        if tools:
            extra["tools"] = tools
        plain = chat(url, messages, **extra)["choices"][0]
        chunks = events(url, "/v1/chat/completions", {
            "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            **extra,
        })
        assert chunks.pop() == "[DONE]"
        usage = chunks.pop()
        assert usage["choices"] == []
        assert usage["usage"]["completion_tokens"] == len(plain["response_token_ids"])
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        choices = [c["choices"][0] for c in chunks]
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        content = "".join(c["delta"].get("content") or "" for c in choices)
        assert content == (plain["message"]["content"] or "")
        calls = [t for c in choices for t in c["delta"].get("tool_calls", [])]
        expected = plain["message"].get("tool_calls", [])
        assert [t["function"] for t in calls] == [t["function"] for t in expected]
        streamed = [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
        assert streamed == plain["logprobs"]["content"]
        last = choices[-1]
        assert last["finish_reason"] == plain["finish_reason"]
        assert chunks[-1]["metadata"] == {"weight_version": "v7"}
        assert last["response_token_ids"] == plain["response_token_ids"]
        assert all(c["finish_reason"] is None for c in choices[:-1])


def test_sample_log_records_what_was_served(engine):
    url, log = engine
    served = call(url, "/generate", {"text": "log me", "rid": "logged", "return_logprob": True})[1]
    answer = chat(url, ASK, tools=[CALC], logprobs=True, return_token_ids=True)
    lines = {line["rid"]: line for line in map(json.loads, log.read_text().splitlines())}
    gen = lines["logged"]
    assert gen["route"] == "/generate" and gen["weight_version"] == "v7"
    assert gen["output_ids"] == served["output_ids"]
    assert gen["finish_reason"] == served["meta_info"]["finish_reason"]
    assert gen["output_logprobs"] == [p[0] for p in served["meta_info"]["output_token_logprobs"]]
    choice = answer["choices"][0]
    rec = lines[answer["id"]]
    assert rec["route"] == "/v1/chat/completions"
    assert rec["input_ids"] == choice["prompt_token_ids"]
    assert rec["output_ids"] == choice["response_token_ids"]
    assert rec["output_logprobs"] == [e["logprob"] for e in choice["logprobs"]["content"]]


@pytest.mark.parametrize("path, body, needle", [
    ("/generate", b"{not json", "malformed JSON"),
    ("/generate", b"[1, 2]", "must be an object"),
    ("/generate", {"sampling_params": {}}, "exactly one of 'text' and 'input_ids'"),
    ("/generate", {"text": ["a", "b"]}, "batches are not supported"),
    ("/generate", {"input_ids": [[1, 2]]}, "batches are not supported"),
    ("/generate", {"input_ids": [99999]}, "token ids in [0, 4096)"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "'max_new_tokens'"),
    ("/generate", {"text": "x", "sampling_params": {"stop": 3}}, "'stop'"),
    ("/generate", {"input_ids": [5] * 1000, "sampling_params": {"max_new_tokens": 99}},
     "context length"),
    ("/generate", {"input_ids": [5] * 1024}, "context length"),
    ("/v1/chat/completions", {"messages": []}, "'messages'"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "'role'"),
    ("/v1/chat/completions", {"messages": ASK, "n": 2}, "n=1"),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 0}, "'max_tokens'"),
    ("/v1/chat/completions", {"messages": ASK, "tools": {"x": 1}}, "'tools'"),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 5000}, "context length"),
    # what SGLang takes but the scripted engine cannot honour is refused, never ignored
    ("/generate", {"text": "x", "sampling_params": {"json_schema": "{}"}}, "constrained decoding"),
    ("/generate", {"text": "x", "sampling_params": {"structural_tag": "{}"}}, "constrained decoding"),
    ("/generate", {"text": "x", "sampling_params": {"logit_bias": {"5": -100}}}, "logit bias"),
    ("/generate", {"text": "x", "sampling_params": {"n": 2}}, "n=1"),
    ("/generate", {"text": "x", "sampling_params": {"guided_json": "{}"}}, "unknown sampling parameter"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 2}, "top_logprobs_num"),
    ("/generate", {"text": "x", "image_data": "a.png"}, "unknown /generate field"),
    ("/v1/chat/completions", {"messages": ASK, "logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": ASK, "tools": [CALC], "tool_choice": "required"}, "'tool_choice'"),
    ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "json_object"}}, "'response_format'"),
])
def test_bad_requests_get_400_error_bodies(engine, path, body, needle):
    url, _ = engine
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, err = call(url, path, raw=raw)
    assert status == 400
    assert set(err) == {"object", "message", "type", "param", "code"}
    assert (err["object"], err["type"], err["code"]) == ("error", "BadRequestError", 400)
    assert needle in err["message"]


def test_info_routes(engine):
    url, _ = engine
    assert call(url, "/health") == (200, "")
    status, info = call(url, "/get_model_info")
    assert status == 200 and info["is_generation"] is True and info["weight_version"] == "v7"
    assert Path(info["tokenizer_path"], "tokenizer.json").is_file()
    status, models = call(url, "/v1/models")
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["polar-scripted"]
    status, missing = call(url, "/nope")
    assert status == 404 and missing["object"] == "error"


def test_bad_rules_file_fails_before_listening(tmp_path):
    rules, ready = tmp_path / "rules.yaml", tmp_path / "ready.json"
    rules.write_text("- when: ok\n  reply: fine\n- when: '(unclosed'\n  reply: x\n")
    proc = subprocess.run(
        [POLAR, "engine", "--script", rules, "--ready-file", ready],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 2 and not ready.exists()
    assert "Traceback" not in proc.stderr
    assert f"{rules}: rule 1: field 'when': invalid regex" in proc.stderr
