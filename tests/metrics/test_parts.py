"""The parts that need no run: engine figure parsing (SGLang's and vLLM's names, hostile text),
snapshot checks, and the dashboard's reading of the orchestrator's metrics.jsonl lines."""

from __future__ import annotations

import json
from pathlib import Path

from polar_hpc import metrics, wire
from polar_hpc.observe.live import engine_figures
from polar_hpc.observe.livelog import LiveLog
from polar_hpc.proxy.routing import Reading


def test_engine_figures_by_sglang_and_vllm_names() -> None:
    sglang = ('# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 3.0\n'
              'sglang:num_running_reqs_other 99\nsglang:num_queue_reqs{model_name="m",dp="1"} 2\n'
              'sglang:num_queue_reqs{model_name="m",dp="2"} 5\n'
              'sglang:cache_hit_rate{dp="1"} 0.2\nsglang:cache_hit_rate{dp="2"} 0.4\n')
    assert engine_figures(sglang) == {"running": 3.0, "waiting": 7.0, "cache_hit_rate": 0.30000000000000004}
    counted = sglang + 'sglang:prompt_tokens_total{model_name="m"} 400\nsglang:cached_tokens_total{a="}"} 100 17\n'
    assert engine_figures(counted)["cache_hit_rate"] == 0.25  # the counters before the gauge
    vllm = ('vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 4\n'
            'vllm:prefix_cache_queries_total{engine="0"} 80\nvllm:prefix_cache_hits_total{engine="0"} 60\n')
    assert engine_figures(vllm) == {"running": 1.0, "waiting": 4.0, "cache_hit_rate": 0.75}
    hostile = "sglang:num_running_reqs nan\nsglang:num_queue_reqs {}\nsglang:num_queue_reqs inf\n\x00" * 3
    assert engine_figures(hostile) == {}


def test_a_meter_snapshot_passes_its_own_check() -> None:
    meter = metrics.ProxyMeter("gw-proxy", 1.0)
    record = wire.CallRecord(session_id="s", call_index=1, api="openai_chat", request={}, response={},
                             prompt_ids=[1, 2], output_ids=[3], output_logprobs=[0.0], finish_reason="stop",
                             weight_version="v0", engine_url="u", stream=False, t_start=1.0, t_end=1.5,
                             meta={"mode": "tito", "new_chain": "first call"})
    metrics.start_call()
    metrics.call_timings(record.meta, record.t_start, record.t_end)
    assert record.meta["engine_ms"] == 0.0 and record.meta["proxy_ms"] == 500.0
    meter.call("openai_chat", record)
    meter.error("upstream")
    long_url = "http://engine/" + "x" * 200  # a label value is cut to what `check` allows
    meter.engines({"group": 2}, {"http://e0": Reading(3.0, 0.5, 1), long_url: Reading(1.0, None, 0)})
    assert metrics.check(meter.snapshot(), ("proxy",)) is None
    meter.engines({"group": 3, "least_loaded": 1}, {"http://e0": Reading(4.0, 0.25, 0)})
    snap = meter.snapshot()
    assert metrics.check(snap, ("gateway", "proxy")) is None
    assert metrics.check(snap, ("gateway",)) is not None  # a proxy's snapshot is not a gateway's
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in snap.samples}
    assert values[("polar_proxy_tokens_total", (("kind", "prompt"),))] == 2
    assert values[("polar_proxy_chain_breaks_total", ())] == 1
    assert values[("polar_proxy_errors_total", (("kind", "upstream"),))] == 1
    assert values[("polar_proxy_sessions_placed_total", (("how", "group"),))] == 3  # the router's counts
    engines = {(n, dict(labels)["engine"]): v for (n, labels), v in values.items() if ("engine", "http://e0") in labels
               or n == "polar_proxy_engine_requests"}
    assert engines == {("polar_proxy_engine_requests", "http://e0"): 4.0,  # the last reading only
                       ("polar_proxy_engine_cache_hit_rate", "http://e0"): 0.25}


def _line(t: float, count: float, engine: float, added: float, running: float = 0) -> str:
    proxy = {"polar_proxy_call_seconds_count": count, "polar_proxy_engine_seconds_sum": engine,
             "polar_proxy_added_seconds_sum": added}
    return json.dumps({"t": t, "source": "orchestrator", "run": {}, "processes": {"gw-proxy": proxy},
                       "engines": {"http://e": {"up": 1, "running": running, "waiting": 1}}}) + "\n"


def test_live_log_points_and_hostile_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line(1, 2, 0.2, 0.02, running=2) + '{"t": 1.5, "state": "running"}\n' + "garbage\n"
                    + '{"source": "orchestrator", "processes": 5}\n' + "[1, 2]\n"
                    + _line(2, 4, 0.6, 0.04) + _line(3, 4, 0.6, 0.04) + _line(4, 1, 0.1, 0.01))
    log = LiveLog(tmp_path)
    log.poll()
    assert [p["calls"] for p in log.points] == [2, 2, 0, 0]
    assert log.points[0]["engine_ms"] == 100.0 and log.points[0]["proxy_ms"] == 10.0
    assert log.points[0]["running"] == 2 and log.points[0]["waiting"] == 1
    assert log.points[1]["engine_ms"] == 200.0 and log.points[1]["proxy_ms"] == 10.0
    assert log.points[2]["engine_ms"] is None  # no call ended
    assert log.points[3]["engine_ms"] is None  # a counter went back (a restarted proxy)


def test_live_log_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_line(t, t, t * 0.1, t * 0.01) for t in range(1, 1001)))
    log = LiveLog(tmp_path, max_points=100)
    log.poll()
    assert 50 <= len(log.points) <= 100
    assert all(p["engine_ms"] == 100.0 for p in log.points[1:])  # means over the lines skipped too
