"""What one harness call may cost the proxy, through a real proxy process and the scripted engine:
the key is checked before the body is read, a body over the limit gets 413 and a malformed one
400 in its API's shape (never 500), a ~10 MB call leaves other sessions' calls and the gateway's
heartbeats flowing, is refused (its context) after tokenizing only its start, the proxy's memory
comes back down, an engine's 400 is in the proxy log,
and while no engine is registered a call waits (bounded) for one, then gets 503 + Retry-After."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from polar_hpc import wire
from polar_hpc.proxy.tito import WINDOW_CHARS_PER_TOKEN
from proxy.helpers import MODEL, start_proxy

ASK = [{"role": "user", "content": "What is 2 + 2?"}]
APIS = {  # path, auth header for a key, a minimal body
    "openai_chat": ("/v1/chat/completions", lambda k: {"Authorization": f"Bearer {k}"},
                    {"model": MODEL, "messages": ASK, "max_tokens": 8}),
    "openai_responses": ("/v1/responses", lambda k: {"Authorization": f"Bearer {k}"},
                         {"model": MODEL, "input": ASK, "max_output_tokens": 8}),
    "anthropic": ("/v1/messages", lambda k: {"x-api-key": k},
                  {"model": MODEL, "messages": ASK, "max_tokens": 8}),
}
MALFORMED = [  # not UTF-8, not JSON, nested too deep, not an object, required fields missing
    b"\xff\xfe{}", b'{"model": "\xc3\x28", "messages": [], "input": []}', b"[" * 100000,
    b'{"a": ' + b"[" * 100000, b"[1]", b"{}", b'{"messages": 5, "input": 5, "max_tokens": "x"}',
]
WRONG_TYPES = {  # fields of the wrong type, per API
    "openai_chat": [
        {"messages": [{"role": 5, "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "x"}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]},
        {"messages": [{"role": "user", "content": "x", "name": [1]}]},
        {"messages": ASK, "tools": [1]},
        {"messages": ASK, "max_tokens": "8"},
        {"messages": ASK, "stop": [1]},
    ],
    "openai_responses": [
        {"input": 5}, {"input": [5]}, {"input": [{"type": "function_call", "name": 5}]},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": {}}]}]},
        {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"text": 1}]}]},
        {"input": "x", "instructions": 5}, {"input": "x", "tools": "x"},
    ],
    "anthropic": [
        {"messages": ASK}, {"messages": ASK, "max_tokens": "8"},
        {"messages": [{"role": "user", "content": 5}], "max_tokens": 8},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 8},
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": 5}]}],
         "max_tokens": 8},
        {"messages": ASK, "max_tokens": 8, "system": [{"type": "text", "text": None}]},
    ],
}


def post(url: str, api: str, key: str, body: bytes | dict, timeout: float = 120) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of one call."""
    path, auth, _ = APIS[api]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json", **auth(key)})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def assert_error(api: str, answer: dict, kind: str | None = None) -> str:
    """The answer is an error in `api`'s own shape; returns its message."""
    if api == "anthropic":
        assert answer["type"] == "error" and isinstance(answer["error"]["message"], str), answer
        assert kind is None or answer["error"]["type"] == kind, answer
    else:
        assert set(answer["error"]) == {"message", "type", "param", "code"}, answer
        assert kind is None or kind in (answer["error"]["type"], answer["error"]["code"]), answer
    return answer["error"]["message"]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.fixture
def small_limit(short_tmp, gateway, engine):
    p = start_proxy(short_tmp, gateway, engine[0], mode="passthrough", max_body_mb=1)
    gateway.open("s", "tok-s")
    yield p
    p.stop()


def test_a_body_without_a_valid_key_is_refused_before_it_is_read(small_limit):
    for api, (path, auth, _) in APIS.items():
        before = rss_mb(small_limit.proc.pid)
        host, port = urlsplit(small_limit.url).netloc.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            head = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
                    f"Content-Length: {200 << 20}", *(f"{k}: {v}" for k, v in auth("wrong").items())]
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"x" * (64 << 10))
            answer = sock.makefile("rb").read1(1 << 16)  # 64 KiB of 200 MiB sent: answered anyway
        status, _, rest = answer.partition(b"\r\n")
        assert status.split()[1] == b"401", answer
        assert_error(api, json.loads(rest.partition(b"\r\n\r\n")[2]), "authentication_error"
                     if api == "anthropic" else "invalid_api_key")
        assert rss_mb(small_limit.proc.pid) < before + 20


def test_a_body_over_the_limit_gets_413_in_its_api_shape(small_limit):
    over = b" " * ((1 << 20) + 1)  # whitespace: valid JSON if it were read
    for api, (path, auth, body) in APIS.items():
        kind = "request_too_large"
        status, _, answer = post(small_limit.url, api, "tok-s", json.dumps(body).encode() + over)
        assert status == 413 and "1048576 bytes" in assert_error(api, answer, kind)
        # no Content-Length: the body is read in chunks until it passes the limit
        host, port = urlsplit(small_limit.url).netloc.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        chunks = iter([json.dumps(body).encode()[:-1], *[b" " * (64 << 10)] * 20, b"}"])
        conn.request("POST", path, body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json", **auth("tok-s")})
        answer = conn.getresponse()
        assert answer.status == 413
        assert_error(api, json.loads(answer.read()), kind)
        conn.close()
        status, _, _ = post(small_limit.url, api, "tok-s", json.dumps(body).encode() + over[:1000])
        assert status == 200  # under the limit, whitespace and all


def test_malformed_bodies_get_400_in_their_api_shape(proxy):
    proxy.gateway.open("s", "tok-s")
    for api, (_, _, good) in APIS.items():
        bodies = [*MALFORMED, *(dict(body, model=MODEL) for body in WRONG_TYPES[api])]
        for body in bodies:
            status, _, answer = post(proxy.url, api, "tok-s", body)
            assert status == 400, (api, body if isinstance(body, dict) else body[:40], answer)
            assert_error(api, answer, "invalid_request_error")
        assert post(proxy.url, api, "tok-s", good)[0] == 200  # and it still serves


def test_an_engine_400_is_in_the_proxy_log(proxy):
    proxy.gateway.open("s", "tok-s")
    long = [{"role": "user", "content": "calculate 12 + 34 " * 40000}]  # over the scripted engine's 65536-token context
    status, _, answer = post(proxy.url, "openai_chat", "tok-s", {"model": MODEL, "messages": long})
    assert status == 400
    message = assert_error("openai_chat", answer)
    log = proxy.log.read_text()
    assert "session s: engine error, the harness gets 400" in log and message in log, log


def test_a_big_call_leaves_other_sessions_heartbeats_and_memory_alone(short_tmp, gateway, engine):
    """A ~10 MB prompt is refused once its first characters hold more tokens than the context, while
    another session's calls are answered (with a peer timeout of 4 s the proxy would stop if its
    loop stalled that long); repeated big calls do not leave the proxy's memory growing."""
    p = start_proxy(short_tmp, gateway, engine[0], mode="tito", heartbeat_s=0.2, peer_timeout_s=4)
    try:
        gateway.open("big", "tok-big")
        gateway.open("other", "tok-other")
        assert post(p.url, "openai_chat", "tok-other", APIS["openai_chat"][2])[0] == 200
        base = rss_mb(p.proc.pid)
        after = []
        for size_mb in (10, 5, 5):
            text = ("def f(x):\n    return x * 2  # pasted code\n" * (size_mb << 16))[: size_mb << 20]
            body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
            latencies: list[float] = []
            statuses: set[int] = set()
            done = threading.Event()

            def other(done: threading.Event, statuses: set[int], latencies: list[float]) -> None:
                while not done.is_set():
                    t = time.monotonic()
                    statuses.add(post(p.url, "openai_chat", "tok-other", APIS["openai_chat"][2])[0])
                    latencies.append(time.monotonic() - t)
                    time.sleep(0.05)

            thread = threading.Thread(target=other, args=(done, statuses, latencies))
            thread.start()
            status, _, answer = post(p.url, "openai_chat", "tok-big", body, timeout=300)
            done.set()
            thread.join()
            message = assert_error("openai_chat", answer)
            assert status == 400 and "context length is 65536 tokens" in message, message
            counted, total = map(int, re.search(r"counted in its first (\d+) of (\d+) characters", message).groups())
            assert counted <= WINDOW_CHARS_PER_TOKEN * 65536 < total, message  # refused before all of it was tokenized
            # Counted, not timed: refused after its first characters, the big call is short now.
            assert statuses == {200} and latencies, latencies
            after.append(settled_rss_mb(p.proc.pid))  # the worker hands the memory back once the call is over
        assert max(after) < base + 250 and after[-1] < after[0] + 50, (base, after)
        assert p.proc.poll() is None
    finally:
        p.stop()
    assert p.proc.returncode == 0


def settled_rss_mb(pid: int) -> float:
    """The process's RSS once two readings 0.5 s apart differ by less than 5 MB (60 s at most)."""
    deadline, last = time.monotonic() + 60, rss_mb(pid)
    while True:
        time.sleep(0.5)
        now = rss_mb(pid)
        if abs(now - last) < 5 or time.monotonic() > deadline:
            return now
        last = now


@pytest.fixture
def waiting(short_tmp, gateway, engine):
    """A proxy whose engine has left (the gateway says no engine is up)."""
    p = start_proxy(short_tmp, gateway, engine[0], mode="passthrough", engine_wait_s=2)
    gateway.open("s", "tok-s")
    gateway.send(wire.Engines(urls=[]))
    deadline = time.monotonic() + 60
    while "engines now: none" not in p.log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield p
    p.stop()


def test_without_an_engine_a_call_waits_then_gets_503_in_its_api_shape(waiting):
    for api, (_, _, body) in APIS.items():
        t = time.monotonic()
        status, headers, answer = post(waiting.url, api, "tok-s", body)
        assert time.monotonic() - t > 1.9  # it waited engine_wait_s
        assert status == 503 and headers["Retry-After"] == "10", (status, headers)
        assert "no engine is serving" in assert_error(
            api, answer, "overloaded_error" if api == "anthropic" else "server_error")


def test_a_call_waiting_for_an_engine_is_answered_once_one_registers(waiting, engine):
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(
        post(waiting.url, "anthropic", "tok-s", APIS["anthropic"][2])))
    thread.start()
    time.sleep(0.5)
    waiting.gateway.send(wire.Engines(urls=[engine[0]]))
    thread.join(timeout=30)
    status, _, answer = outcome[0]
    assert status == 200 and answer["type"] == "message", answer
    assert waiting.gateway.expect(wire.CallRecord).session_id == "s"
