"""Routing over two real engines: new sessions go to the least-loaded engine, sessions stick; a
task's next sample goes to its task's engine unless that one is busier than the slack allows; load
is read from the engines' gauges, or counted by the proxy where an engine serves none; the proxy
reports the engines' prefix-cache hit rate."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import urllib.request

import openai

from polar_hpc import wire
from polar_hpc.engines import gauges

from proxy.helpers import MODEL, FakeEngine, start_engine, start_proxy, stop, wait_gauge

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


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def _queue_at(url: str, n: int, pool: concurrent.futures.ThreadPoolExecutor) -> list:
    """Pause the engine and send it `n` requests of its own (not through the proxy): they queue."""
    _post(url + "/pause_generation", {"mode": "in_place"})
    calls = [pool.submit(_post, url + "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
             for _ in range(n)]
    wait_gauge(url, "num_queue_reqs", n)
    return calls


def _chat(pool, client, sid: str) -> concurrent.futures.Future:
    return pool.submit(client[sid].chat.completions.create, model=MODEL, messages=HI, max_tokens=1)


def test_a_groups_next_sample_goes_where_its_prefix_is_cached_within_the_slack(
    short_tmp, gateway
) -> None:
    """Loads come from the engines' own gauges: e0 carries requests the proxy never sent."""
    (e0, u0, _), (e1, u1, _) = (start_engine(short_tmp, name) for name in ("e0", "e1"))
    proxy = start_proxy(short_tmp, gateway, [u0, u1], affinity_slack=2, metrics_s=0.1)
    client = {}
    for sid, task in (("t#0", "t"), ("t#1", "t"), ("t#2", "t"), ("u#0", "u")):
        gateway.open(sid, sid, task)
        client[sid] = openai.OpenAI(base_url=proxy.base_url, api_key=sid, max_retries=0, timeout=60)
    pool = concurrent.futures.ThreadPoolExecutor(8)
    try:
        _chat(pool, client, "t#0").result()
        assert gateway.expect(wire.CallRecord).engine_url == u0  # both idle: the first engine
        direct = _queue_at(u0, 2, pool)
        gateway.wait_metrics(lambda m: m.get(("polar_proxy_engine_requests", u0)) == 2)
        _chat(pool, client, "u#0").result()  # another task: the least loaded by the gauges
        assert gateway.expect(wire.CallRecord).engine_url == u1
        sample = _chat(pool, client, "t#1")  # its task's engine, 2 requests over e1's 0: within the slack
        wait_gauge(u0, "num_queue_reqs", 3)
        _post(u0 + "/continue_generation", {})
        sample.result()
        assert gateway.expect(wire.CallRecord).engine_url == u0
        for call in direct:
            call.result()
        direct = _queue_at(u0, 3, pool)
        gateway.wait_metrics(lambda m: m.get(("polar_proxy_engine_requests", u0)) == 3)
        _chat(pool, client, "t#2").result()  # 3 over: past the slack, the least loaded
        assert gateway.expect(wire.CallRecord).engine_url == u1
        _post(u0 + "/continue_generation", {})
        for call in direct:
            call.result()
        seen = gateway.wait_metrics(lambda m: m.get(("polar_proxy_engine_cache_hit_rate", u0), 0) > 0)
        placed = {how: seen.get(("polar_proxy_sessions_placed_total", how)) for how in
                  ("least_loaded", "group", "group_busy")}
        assert placed == {"least_loaded": 2, "group": 1, "group_busy": 1}
        text = urllib.request.urlopen(u0 + "/metrics", timeout=60).read().decode()
        figures = gauges.read(text)  # the engine's own counters: t#1 found t#0's prompt cached
        assert seen[("polar_proxy_engine_cache_hit_rate", u0)] == figures["cached_tokens"] / figures["prompt_tokens"]
    finally:
        pool.shutdown(cancel_futures=True)
        proxy.stop()
        stop(e0)
        stop(e1)


def test_an_engine_without_metrics_is_balanced_by_the_proxys_own_calls(short_tmp, gateway) -> None:
    hanging = FakeEngine()  # /metrics: 404; calls never answered
    e1, u1, _ = start_engine(short_tmp, "e1", "--no-metrics")
    proxy = start_proxy(short_tmp, gateway, [hanging.url, u1], mode="passthrough")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        for sid in ("a", "b"):
            gateway.open(sid, sid)
        deadline = time.monotonic() + 30
        while "/metrics" not in hanging.gets:  # the proxy tried to read it
            assert time.monotonic() < deadline, "the proxy never asked the engine for its metrics"
            time.sleep(0.02)
        a = openai.OpenAI(base_url=proxy.base_url, api_key="a", max_retries=0, timeout=60)
        pool.submit(a.chat.completions.create, model=MODEL, messages=HI, max_tokens=1)
        assert hanging.received.wait(30)  # both idle: the first engine; it never answers
        b = openai.OpenAI(base_url=proxy.base_url, api_key="b", max_retries=0, timeout=30)
        b.chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
        assert gateway.expect(wire.CallRecord).engine_url == u1
    finally:
        proxy.stop()
        pool.shutdown(cancel_futures=True)
        hanging.close()
        stop(e1)
