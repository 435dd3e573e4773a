"""The proxy's link to its gateway survives any multipart the gateway end sends; an engine with
the run's API key answers only callers that send it (401 otherwise), and the proxy sends it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from polar_hpc import wire
from polar_hpc.security import ENGINE_KEY_ENV
from proxy.helpers import MODEL, start_engine, start_proxy, stop
from tests.orchestrator.hostile import JUNK

QUESTION = [{"role": "user", "content": "What is 2+3?"}]


def _ask(proxy, session_id: str) -> str:
    proxy.gateway.open(session_id, f"tok-{session_id}")
    client = openai.OpenAI(base_url=proxy.base_url, api_key=f"tok-{session_id}", max_retries=0, timeout=90)
    return client.chat.completions.create(model=MODEL, messages=QUESTION).choices[0].message.content


def _status(url: str, body: dict | None, key: str | None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_any_multipart_from_the_gateway_end_leaves_the_link_alive(short_tmp, gateway, engine) -> None:
    proxy = start_proxy(short_tmp, gateway, engine[0], name="hl", mode="passthrough")
    try:
        for frames in JUNK + [[b"\0" * (wire.MAX_MESSAGE_BYTES + 1)], [wire.encode(wire.Assign(
                sessions=[wire.SessionSpec(session_id="s", task={}, sample_index=0, attempt=0, deadline=0.0)]))]]:
            gateway.send(frames)
        assert _ask(proxy, "after-junk")  # the link still carries sessions, and the call is recorded
        assert gateway.expect(wire.CallRecord).session_id == "after-junk"
        gateway.send(wire.CloseSession(session_id="after-junk"))
        assert gateway.expect(wire.SessionClosed).n_calls == 1
        assert proxy.proc.poll() is None
    finally:
        proxy.stop()
    log = (short_tmp / "hl.log").read_text()
    assert "ignoring a message from the gateway: 3 frames where 1 belong" in log
    assert "50 frames where 1 belong" in log and "undecodable (67108865 bytes)" in log and "Traceback" not in log


def test_engine_takes_calls_only_with_the_run_key(short_tmp, gateway, monkeypatch) -> None:
    monkeypatch.setenv(ENGINE_KEY_ENV, "run-secret")  # the engine and the first proxy inherit it
    engine, url, _ = start_engine(short_tmp, "keyed")
    try:
        assert _status(url + "/health", None, None) == 200  # for the engine step's health checks
        for path, body in (("/generate", {"text": "hi"}), ("/v1/chat/completions", {"messages": QUESTION}),
                           ("/pause_generation", {"mode": "abort"}), ("/get_model_info", None)):
            assert _status(url + path, body, None) == 401, path
            assert _status(url + path, body, "wrong") == 401, path
        assert _status(url + "/get_model_info", None, "run-secret") == 200
        proxy = start_proxy(short_tmp, gateway, url, name="with-key")
        try:
            assert _ask(proxy, "s1")
            assert gateway.expect(wire.CallRecord).session_id == "s1"
        finally:
            proxy.stop()
        monkeypatch.delenv(ENGINE_KEY_ENV)
        bare = start_proxy(short_tmp, gateway, url, name="no-key", mode="passthrough")
        try:
            with pytest.raises(openai.APIStatusError) as refused:
                _ask(bare, "s2")
            assert refused.value.status_code == 502 and "401" in str(refused.value)
        finally:
            bare.stop()
    finally:
        stop(engine)


def test_the_proxy_uses_only_engines_that_prove_they_are_the_runs(short_tmp, gateway, monkeypatch) -> None:
    """An engine of another run (another key) given to the proxy, at its start and by the gateway, is
    refused before any call reaches it: no engine, then the run's own engine once it is named."""
    monkeypatch.setenv(ENGINE_KEY_ENV, "another-run")
    foreign, foreign_url, _ = start_engine(short_tmp, "foreign")
    monkeypatch.setenv(ENGINE_KEY_ENV, "run-secret")
    ours, ours_url, _ = start_engine(short_tmp, "ours")
    try:
        proxy = start_proxy(short_tmp, gateway, foreign_url, name="proving", engine_wait_s=1)
        try:
            with pytest.raises(openai.APIStatusError) as refused:
                _ask(proxy, "s1")
            assert refused.value.status_code == 503, refused.value  # no engine: not the foreign one's 401
            gateway.send(wire.Engines(urls=[foreign_url, ours_url], versions={}))
            gateway.open("s2", "tok-s2")
            client = openai.OpenAI(base_url=proxy.base_url, api_key="tok-s2", max_retries=5, timeout=90)
            assert client.chat.completions.create(model=MODEL, messages=QUESTION).choices[0].message.content
        finally:
            proxy.stop()
        log = proxy.log.read_text()
        assert f"engine {foreign_url} refused: it cannot prove it is this run's" in log, log
        assert f"engine {ours_url} refused" not in log, log
    finally:
        stop(foreign)
        stop(ours)
