"""Proxy process and session lifecycle against a fake engine: cancellation, failures, exits."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request

import anthropic
import openai
import pytest

from polar_hpc import wire
from proxy.helpers import MODEL, FakeEngine, start_proxy

QUESTION = [{"role": "user", "content": "hello"}]
PEER_TIMEOUT_S = 2.0  # the fake gateway heartbeats every 0.2 s from a thread of its own


@pytest.fixture
def fake_engine():
    engine = FakeEngine()
    yield engine
    engine.close()


@pytest.fixture
def fake_proxy(short_tmp, gateway, fake_engine):
    p = start_proxy(
        short_tmp, gateway, fake_engine.url, name="fp", heartbeat_s=0.1, peer_timeout_s=PEER_TIMEOUT_S,
        mode="passthrough",  # the fake engine answers only the chat route
    )
    yield p
    if p.proc.poll() is None:
        p.proc.kill()
        p.proc.wait()


def session(proxy, sid: str) -> openai.OpenAI:
    proxy.gateway.open(sid, f"tok-{sid}")
    return openai.OpenAI(base_url=proxy.base_url, api_key=f"tok-{sid}", max_retries=0, timeout=20)


def call_in_thread(client: openai.OpenAI) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(client.chat.completions.create(model=MODEL, messages=QUESTION))
        except Exception as e:  # the test inspects it
            outcome.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_close_session_cancels_in_flight_calls(fake_proxy, fake_engine):
    client = session(fake_proxy, "s1")
    thread, outcome = call_in_thread(client)
    assert fake_engine.received.wait(60)
    fake_proxy.gateway.send(wire.CloseSession("s1"))
    assert fake_proxy.gateway.expect(wire.SessionClosed) == wire.SessionClosed("s1", 0)
    assert fake_engine.aborted.wait(60), "the upstream request was not aborted"
    thread.join(10)
    assert isinstance(outcome[0], openai.AuthenticationError)
    fake_proxy.gateway.quiet(0.3)


@pytest.mark.parametrize("mode", ["error", "bare", "drop"])
def test_engine_failures_are_502_without_records(fake_proxy, fake_engine, mode):
    fake_engine.mode = mode
    client = session(fake_proxy, "s2")
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION)
    assert err.value.status_code == 502
    assert err.value.body["type"] == "upstream_error" and err.value.body["message"]
    fake_proxy.gateway.send(wire.CloseSession("s2"))
    assert fake_proxy.gateway.expect(wire.SessionClosed) == wire.SessionClosed("s2", 0)


def test_heartbeats_then_exit_when_gateway_goes_silent(fake_proxy):
    beats = int(PEER_TIMEOUT_S / 0.1) + 5  # the proxy's own, 0.1 s apart at least: longer than peer_timeout_s
    deadline = time.monotonic() + 60
    while len(fake_proxy.gateway.heartbeats) < beats:  # the gateway's heartbeats keep it alive meanwhile
        assert fake_proxy.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert {h.sender for h in fake_proxy.gateway.heartbeats} == {"fp"}
    fake_proxy.gateway.beating.clear()
    silent_at = time.monotonic()
    assert fake_proxy.proc.wait(timeout=60) == 0
    assert time.monotonic() - silent_at > PEER_TIMEOUT_S - 0.3
    with pytest.raises(OSError):
        urllib.request.urlopen(fake_proxy.base_url + "/models", timeout=2)


def test_shutdown_answers_in_flight_calls_and_exits(fake_proxy, fake_engine):
    thread, outcome = call_in_thread(session(fake_proxy, "s3"))
    assert fake_engine.received.wait(60)
    fake_proxy.gateway.send(wire.Shutdown("test"))
    assert fake_proxy.proc.wait(timeout=60) == 0
    thread.join(10)
    assert isinstance(outcome[0], openai.APIStatusError) and outcome[0].status_code == 503
    assert fake_engine.aborted.wait(60)


def test_sigint_exits_cleanly(fake_proxy):
    fake_proxy.proc.send_signal(signal.SIGINT)
    assert fake_proxy.proc.wait(timeout=60) == 0


def test_upstream_failure_in_each_api_shape(fake_proxy, fake_engine):
    fake_engine.mode = "error"
    session(fake_proxy, "s6")
    with pytest.raises(openai.APIStatusError) as err:
        openai.OpenAI(base_url=fake_proxy.base_url, api_key="tok-s6", max_retries=0).responses.create(
            model=MODEL, input="hi")
    assert err.value.status_code == 502 and err.value.body["type"] == "upstream_error"
    with pytest.raises(anthropic.APIStatusError) as err:
        anthropic.Anthropic(base_url=fake_proxy.url, api_key="tok-s6", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 502
    assert err.value.body == {"type": "error", "error": {
        "type": "api_error", "message": err.value.body["error"]["message"]}}
    assert "HTTP 500" in err.value.body["error"]["message"]
    fake_proxy.gateway.quiet(0.2)
