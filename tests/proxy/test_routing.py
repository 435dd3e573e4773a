"""Routing over two real engines: new sessions go to the least-loaded engine, sessions stick."""

from __future__ import annotations

import threading

import openai

from polar_hpc import wire

from proxy.helpers import MODEL, start_engine, start_proxy, stop

HI = [{"role": "user", "content": "Hi"}]


def test_least_loaded_for_new_sessions_then_sticky(short_tmp, gateway):
    engines = [start_engine(short_tmp, name, "--token-delay-ms", "30") for name in ("e0", "e1")]
    proxy = start_proxy(short_tmp, gateway, [url for _, url, _ in engines])
    try:
        clients = {}
        for sid in ("a", "b"):
            gateway.open(sid, sid)
            clients[sid] = openai.OpenAI(base_url=proxy.base_url, api_key=sid, max_retries=0)
        clients["a"].chat.completions.create(model=MODEL, messages=HI, max_tokens=1)  # warm up
        first_engine = gateway.expect(wire.CallRecord).engine_url
        streaming = threading.Event()

        def slow_call() -> None:
            for _ in clients["a"].chat.completions.create(model=MODEL, messages=HI, stream=True):
                streaming.set()

        thread = threading.Thread(target=slow_call)
        thread.start()
        assert streaming.wait(60)  # a's call is in flight on its engine
        clients["b"].chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
        thread.join()
        records = {}
        for _ in range(2):
            r = gateway.expect(wire.CallRecord)
            records[r.session_id] = r.engine_url
        assert records["a"] == first_engine  # sticky
        assert records["b"] != first_engine  # the idle engine takes the new session
        for _ in range(2):
            clients["b"].chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
            assert gateway.expect(wire.CallRecord).engine_url == records["b"]
    finally:
        proxy.stop()
        for proc, _, _ in engines:
            stop(proc)
