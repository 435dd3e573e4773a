"""The orchestrator's /metrics of a real local run (scripted engine, real processes, ZeroMQ and
HTTP), against what the journal and the shards say; its token; hostile snapshots sent by real
peers holding the run's keys; the metrics log; and a run with metrics off."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, background, polar
from polar_hpc import security, wire
from polar_hpc.observe import RunReader
from polar_hpc.shards import iter_trajectories

CALCULATOR = ROOT / "examples" / "calculator"
DELAY_MS = 3.0  # the scripted engine's time per sampled token


def _tasks(tmp: Path, slow: bool) -> Path:
    shutil.copy(CALCULATOR / "agent.py", tmp)
    calc = {"instruction": "What is 17 * 23 + 4?", "harness": {"command": "python agent.py"},
            "sandbox": {"files": {"agent.py": "agent.py"}}, "evaluator": {"kind": "regex", "pattern": "\\b395\\b"}}
    tasks = [{"id": "calc-merge", "num_samples": 2, "builder": "prefix_merge", **calc},
             {"id": "calc-per-call", "num_samples": 1, "builder": "per_request", **calc},
             {"id": "crash", "instruction": "x", "harness": {"command": "exit 5"}}]
    if slow:
        tasks.append({"id": "slow", "instruction": "x", "timeout_s": 900, "harness": {"command": "sleep 900"}})
    path = tmp / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def _ended(run_dir: Path) -> int:
    path = run_dir / "journal" / "orchestrator.jsonl"
    if not path.exists():
        return 0
    return sum('"result"' in line for line in path.read_text().splitlines())


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Path]:
    """A run whose four quick sessions have ended while a fifth sleeps (so the orchestrator serves)."""
    tmp = tmp_path_factory.mktemp("live")
    topo = tmp / "topology.yaml"
    topo.write_text(f"engine:\n  token_delay_ms: {DELAY_MS}\ngateway:\n  shard_max_age_s: 0.5\n"
                    "metrics:\n  interval_s: 0.3\n")
    run_dir = tmp / "run"
    args = ["run", _tasks(tmp, slow=True), "-c", topo, "--run-dir", run_dir]
    with background(args, run_dir, lambda d: _ended(d) == 4, "the quick sessions never ended", timeout=300):
        deadline = time.monotonic() + 120
        while not _settled(run_dir):
            assert time.monotonic() < deadline, "the ended sessions' shards and metrics never caught up"
            time.sleep(0.2)
        yield run_dir


def _settled(run_dir: Path) -> bool:
    """The four ended sessions sealed in shards, counted by the processes' metrics, and in a line of
    the metrics log after at least one other."""
    if len(list(iter_trajectories(run_dir))) != 4:
        return False
    samples = scrape(run_dir)
    reader = RunReader(run_dir)
    reader.poll()
    calls = reader.overview()["calls"]
    if total(samples, "polar_gateway_sessions_ended_total") != 4 or total(samples, "polar_proxy_calls_total") != calls:
        return False
    log = run_dir / "metrics.jsonl"
    ours = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    ours = [line for line in ours if line.get("source") == "orchestrator"]
    proxies = [v for k, v in ours[-1]["processes"].items() if k.endswith("proxy")] if ours else []
    return (len(ours) >= 2 and ours[-1]["run"]["states"].get("completed") == 3
            and [p.get("polar_proxy_call_seconds_count") for p in proxies] == [calls])


def _rendezvous(run_dir: Path) -> dict:
    return json.loads((run_dir / "rendezvous.json").read_text())


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(run_dir: Path) -> dict[tuple[str, frozenset], float]:
    r = _rendezvous(run_dir)
    status, text = _get(r["metrics_url"], r["metrics_token"])
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


def test_numbers_equal_journal_and_shards(live: Path) -> None:
    samples = scrape(live)
    reader = RunReader(live)
    reader.poll()
    o = reader.overview()
    assert o["by_status"] == {"completed": 3, "error": 1}, o["by_status"]
    for status, n in o["by_status"].items():  # the orchestrator's table, and the gateway's own count
        assert total(samples, "polar_run_sessions", state=status) == n
        assert total(samples, "polar_gateway_sessions_ended_total", status=status) == n
    assert total(samples, "polar_gateway_errors_total", kind="error") == 1
    assert total(samples, "polar_run_sessions", state="RUN") == 1  # the slow one
    assert total(samples, "polar_gateway_sessions_in_stage", stage="RUN") == 1
    assert total(samples, "polar_gateway_sandbox_start_seconds_count") == 5
    assert total(samples, "polar_run_tokens") == o["tokens"]
    # every call the proxy answered is in an accepted trajectory, each sampled token trainable
    assert o["calls"] > 0
    assert total(samples, "polar_proxy_calls_total", mode="tito") == o["calls"]
    assert total(samples, "polar_proxy_calls_total", api="openai_chat") == o["calls"]
    assert total(samples, "polar_proxy_tokens_total", kind="sampled") == o["trainable_tokens"]
    trajectories = list(iter_trajectories(live))
    prompts = sum(len(t.prompt_ids) for tr in trajectories if tr.metadata["builder"] == "per_request" for t in tr.traces)
    assert 0 < prompts < total(samples, "polar_proxy_tokens_total", kind="prompt")
    # the engine: up, idle (the slow session makes no calls), on the run's weights
    assert total(samples, "polar_engine_up") == 1
    assert total(samples, "polar_engine_running") == 0 and total(samples, "polar_engine_waiting") == 0
    assert total(samples, "polar_engine_weight_version") == 0  # v0


def test_engine_and_proxy_time_add_up(live: Path) -> None:
    samples = scrape(live)
    call = total(samples, "polar_proxy_call_seconds_sum")
    engine = total(samples, "polar_proxy_engine_seconds_sum")
    added = total(samples, "polar_proxy_added_seconds_sum")
    n = total(samples, "polar_proxy_call_seconds_count")
    assert n > 0 and engine > 0 and added > 0
    assert abs(call - engine - added) <= n * 2e-6  # rounding to the microsecond, per call
    per_call = [tr for tr in iter_trajectories(live) if tr.metadata["builder"] == "per_request"]
    assert per_call
    for tr in per_call:  # one trace per call: the engine took DELAY_MS per sampled token at least
        timings = tr.metadata["call_ms"]
        assert len(timings) == len(tr.traces) == tr.metadata["calls"]
        for trace, (engine_ms, proxy_ms) in zip(tr.traces, timings):
            assert engine_ms >= 0.9 * DELAY_MS * len(trace.response_ids), (engine_ms, len(trace.response_ids))
            assert 0 <= proxy_ms < engine_ms + 1000


def test_a_tasks_samples_share_an_engine_whose_cache_hits_are_reported(live: Path) -> None:
    """The gateway names each session's task to the proxy: calc-merge's second sample is placed by
    its group, the other two sessions that call by load; both samples' shared prompt is a hit in
    the scripted engine's prefix cache, which the orchestrator and the proxy report."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(live)
        placed = {how: total(samples, "polar_proxy_sessions_placed_total", how=how)
                  for how in ("group", "group_busy", "least_loaded")}
        rates = [v for (n, _), v in samples.items()
                 if n in ("polar_engine_cache_hit_rate", "polar_proxy_engine_cache_hit_rate")]
        if placed == {"group": 1, "group_busy": 0, "least_loaded": 2} and len(rates) == 2 and min(rates) > 0:
            return
        assert time.monotonic() < deadline, (placed, rates)
        time.sleep(0.2)


def test_metrics_need_the_token(live: Path) -> None:
    r = _rendezvous(live)
    url = r["metrics_url"]
    assert url.startswith("http://127.0.0.1:")
    assert (live / "rendezvous.json").stat().st_mode & 0o077 == 0
    assert _get(url)[0] == 401
    assert _get(url, "wrong")[0] == 401
    assert _get(url, r["metrics_token"] + "x")[0] == 401
    assert _get(f"{url}?token={r['metrics_token']}")[0] == 200
    shown = polar("status", live)
    assert f"Prometheus: {url}" in shown.stdout, shown.stdout + shown.stderr


def _peer(run_dir: Path, role: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    security.secure_client(sock, run_dir, role)
    sock.connect(_rendezvous(run_dir)["endpoint"])
    return sock


def _snapshot(process: str, samples: list, role: str = "gateway") -> bytes:
    return wire.encode(wire.Metrics(role=role, process=process, t=time.time(),
                                    samples=[wire.MetricSample(*s) for s in samples]))


def test_hostile_snapshots_are_dropped(live: Path) -> None:
    good = ("polar_gateway_errors_total", {"kind": "error"}, 7.0)
    gateway, client = _peer(live, security.GATEWAY), _peer(live, security.CLIENT)
    hostile = [
        _snapshot("evil-huge", [good] * 5000),  # too many samples
        _snapshot("evil-name", [("polar_run_sessions", {}, 1.0)]),  # a family no peer may send
        _snapshot("evil-made-up", [("polar_gateway_made_up_total", {}, 1.0)]),
        _snapshot("evil-label", [("polar_gateway_errors_total", {"kind": "x", "extra": "y"}, 1.0)]),
        _snapshot("evil-long-label", [("polar_gateway_errors_total", {"kind": "x" * 1000}, 1.0)]),
        _snapshot("evil-nan", [("polar_gateway_errors_total", {"kind": "x"}, float("nan"))]),
        _snapshot("evil-role", [("polar_gateway_errors_total", {"kind": "x"}, 1.0)], role="engine"),
        _snapshot("evil-proxy", [good], role="proxy"),  # a proxy's snapshot with a gateway's family
        msgspec.msgpack.encode({"type": "Metrics", "role": "gateway", "process": "evil-types", "t": "now",
                                "samples": [["polar_gateway_errors_total", {"kind": 5}, "x"]]}),
        msgspec.msgpack.encode({"type": "Metrics", "role": "gateway", "process": "evil-shape", "t": 1.0,
                                "samples": {"a": 1}}),
        b"\xc1" * 100,
    ]
    for payload in hostile:
        gateway.send(payload)
    client.send(_snapshot("evil-client", [good]))  # the client key may not send Metrics at all
    gateway.send(_snapshot("fake-gateway", [good]))  # a well-formed one from a gateway key is kept
    def processes() -> set[str]:
        return {dict(labels).get("process", "") for _, labels in scrape(live)}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "fake-gateway" not in processes():
        time.sleep(0.2)
    names = processes()
    assert "fake-gateway" in names
    assert not {n for n in names if n.startswith("evil")}, names
    samples = scrape(live)
    assert total(samples, "polar_gateway_errors_total", process="fake-gateway") == 7
    assert total(samples, "polar_run_sessions", state="completed") == 3  # the orchestrator still counts
    log = (live / "logs").glob("orchestrator*.log")
    text = "".join(p.read_text() for p in log)
    assert "dropped Metrics" in text and "may not send it" in text
    gateway.close(linger=0)
    client.close(linger=0)


def test_metrics_log_holds_the_processes(live: Path) -> None:
    lines = [json.loads(line) for line in (live / "metrics.jsonl").read_text().splitlines()]
    ours = [line for line in lines if line.get("source") == "orchestrator"]
    assert len(ours) >= 2
    last = ours[-1]
    assert last["run"]["states"]["completed"] == 3
    kinds = Counter(p.split("-")[-1] for p in last["processes"])
    assert kinds["proxy"] == 1, last["processes"].keys()
    proxy = next(v for k, v in last["processes"].items() if k.endswith("proxy"))
    assert proxy["polar_proxy_call_seconds_count"] > 0
    assert not any(k.endswith("_bucket") or "_bucket{" in k for k in proxy)
    assert list(last["engines"].values())[0]["up"] == 1
    reader = RunReader(live)  # the dashboard's plots of these lines
    reader.poll()
    points = reader.live.points
    assert sum(p["calls"] for p in points) == reader.overview()["calls"]
    timed = [p for p in points if p["engine_ms"] is not None]
    assert timed and all(p["engine_ms"] > 0 and p["proxy_ms"] >= 0 for p in timed)


def test_metrics_off(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("metrics:\n  enabled: false\n")
    run_dir = tmp_path / "run"
    result = polar("run", _tasks(tmp_path, slow=False), "-c", topo, "--run-dir", run_dir, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "metrics_url" not in _rendezvous(run_dir)
    assert not (run_dir / "metrics.jsonl").exists()
    merged = [tr for tr in iter_trajectories(run_dir) if tr.metadata.get("calls")]
    assert merged and all(len(tr.metadata["call_ms"]) == tr.metadata["calls"] for tr in merged)
