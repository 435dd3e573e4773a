"""RunReader's figures equal what the shards and the journal say; it reads incrementally, bounded,
and survives hostile files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from observe.conftest import journal
from polar_hpc.observe.figures import Series, kind_of
from polar_hpc.observe.run import RunReader
from polar_hpc.observe.tail import Tail
from polar_hpc.shards import iter_trajectories

pytestmark = pytest.mark.timeout(900)


def expected(run_dir: Path) -> dict:
    trajs = list(iter_trajectories(run_dir))
    results = {}
    for e in journal(run_dir):
        if e["event"] == "result":
            results.setdefault((e["task"], e["sample"]), e["status"])
    return {
        "done": len(results),
        "by_status": {s: list(results.values()).count(s) for s in set(results.values())},
        "trajectories": len(trajs),
        "tokens": sum(t.n_tokens for t in trajs),
        "trainable": sum(sum(tr.loss_mask) for t in trajs for tr in t.traces),
        "calls": sum(t.metadata["calls"] for t in trajs),
        "versions": sum(len(tr.weight_versions) for t in trajs for tr in t.traces),
        "rewards": {t.task_id: [x.reward for x in trajs if x.task_id == t.task_id and x.reward is not None] for t in trajs},
    }


def test_finished_run_figures_equal_shards_and_journal(finished_run: Path) -> None:
    want = expected(finished_run)
    reader = RunReader(finished_run)
    reader.poll()
    o = reader.overview()
    assert o["state"] == "finished" and o["eta_s"] == 0.0
    assert (o["done"], o["total"], o["left"]) == (want["done"], 5, 0)
    assert o["by_status"] == want["by_status"] == {"completed": 4, "error": 1}
    assert o["trajectories"] == want["trajectories"] == 5 and o["pending"] == 0
    assert (o["tokens"], o["trainable_tokens"], o["calls"]) == (want["tokens"], want["trainable"], want["calls"])
    assert o["tokens"] > 0 and 0 < o["trainable_tokens"] < o["tokens"]
    assert sum(o["weight_versions"].values()) == want["versions"]
    for task in o["tasks"]:
        rewards = want["rewards"][task["task_id"]]
        assert task["reward"]["n"] == len(rewards)
        if rewards:
            assert task["reward"]["mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert all(v == 0 for v in o["stages"].values()), "nothing is left in any stage"
    points = reader.series.view()["points"]
    assert sum(p["ended"] for p in points) == want["done"] and sum(p["tokens"] for p in points) == want["tokens"]
    errors = {e["kind"]: e for e in reader.errors.view()}
    crash = [e for k, e in errors.items() if k.startswith("session error: harness exited with code N")]
    assert crash and crash[0]["count"] == 1 and "crash#0" in crash[0]["examples"][0]
    assert {p["name"] for p in o["processes"]} >= {"orchestrator", "engine-local", "gateway-local"}
    assert [g["name"] for g in o["gateways"]] == ["local0"]
    reader.poll()  # nothing new: nothing counted twice
    assert reader.overview()["tokens"] == want["tokens"]
    rows = reader.shards.query(status="completed", min_reward=0.5)
    assert rows["matched"] == 4 and all(r["reward"] == 1.0 for r in rows["rows"])
    assert reader.shards.query(task="crash")["rows"][0]["status"] == "error"
    assert reader.shards.query(limit=10**9)["matched"] == 5 and len(reader.shards.query(limit=10**9)["rows"]) == 5


def test_shards_show_json_full(finished_run: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "polar_hpc", "shards", "show", str(finished_run), "--json", "--full"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    shown = {(r["task_id"], r["sample_index"]): r for r in map(json.loads, out.stdout.splitlines())}
    trajs = {(t.task_id, t.sample_index): t for t in iter_trajectories(finished_run)}
    assert shown.keys() == trajs.keys()
    for key, t in trajs.items():
        assert shown[key]["metadata"] == json.loads(json.dumps(t.metadata))
        for got, tr in zip(shown[key]["traces"], t.traces, strict=True):
            assert got["prompt_ids"] == tr.prompt_ids.tolist() and got["response_ids"] == tr.response_ids.tolist()
            assert got["loss_mask"] == tr.loss_mask.tolist() and got["logprobs"] == tr.logprobs.tolist()
    bad = subprocess.run([sys.executable, "-m", "polar_hpc", "shards", "show", str(finished_run), "--full"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--full needs --json" in bad.stderr and "Traceback" not in bad.stderr


def test_status_watch_ends_with_a_finished_run(finished_run: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "polar_hpc", "status", str(finished_run), "--watch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "finished" in text and "5/5 sessions ended (completed 4, error 1)" in text
    assert "calc-merge" in text and "harness exited with code N" in text


def test_live_run_counts_what_has_ended_and_what_runs(live_run: Path) -> None:
    reader = RunReader(live_run)
    reader.poll()
    o = reader.overview(now=max(reader.sessions.result_times) + 1.0)  # just after: the rate's 300 s window holds them
    assert o["state"] == "running" and (o["done"], o["total"]) == (2, 4)
    assert o["stages"]["RUN"] == 2 and o["trajectories"] == 2
    assert o["sessions_per_s"] > 0 and o["eta_s"] is not None and o["eta_s"] > 0
    watch = subprocess.Popen([sys.executable, "-m", "polar_hpc", "status", str(live_run), "--watch"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watch.stdout is not None and watch.stdout.readline().startswith("watching ")
    time.sleep(3)
    assert watch.poll() is None, "a live run is watched until it ends"
    watch.send_signal(signal.SIGINT)
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0 and "Traceback" not in err
    assert "running" in out and "2/4 sessions ended" in " ".join(out.split())


def test_log_errors_grouped_by_kind_with_their_lines(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "journal").mkdir()
    (tmp_path / "logs" / "gateway-n1.log").write_text(
        "2026-12-03 23:21:02,016 polar_hpc.gateway INFO fine\n"
        + "".join(f"2026-12-03 23:21:0{i},016 polar_hpc.gateway ERROR sandbox s#{i}.0 failed after {i} s\n" for i in range(7))
        + "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'engine'\n"
        + "2026-12-03 23:21:09,016 polar_hpc.gateway WARNING slow disk\n")
    reader = RunReader(tmp_path)
    reader.poll()
    kinds = {e["kind"]: e for e in reader.errors.view()}
    sandbox = kinds["gateway-n1: ERROR sandbox <session> failed after N s"]
    assert sandbox["count"] == 7 and len(sandbox["examples"]) == 5 and sandbox["examples"][-1].endswith("after 6 s")
    assert kinds["gateway-n1: KeyError: '…'"]["count"] == 1 and kinds["gateway-n1: WARNING slow disk"]["count"] == 1
    proc = reader.overview()["processes"][0]
    assert proc["name"] == "gateway-n1" and proc["errors"] == 8 and proc["last_line"].endswith("slow disk")


def test_journal_read_incrementally_through_hostile_lines(tmp_path: Path) -> None:
    (tmp_path / "journal").mkdir()
    path = tmp_path / "journal" / "orchestrator.jsonl"
    lines = [{"t": 1.0, "event": "queued", "session": f"a#{i}.0", "task": "a", "sample": i, "attempt": 0} for i in range(3)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n[1,2]\n" + '{"t": 2, "event": "assigned", "sess')
    reader = RunReader(tmp_path)
    reader.poll()
    assert reader.overview()["stages"]["QUEUED"] == 3 and len(reader.problems) == 1
    with open(path, "a") as f:  # the cut line completes; then a result, and the same result again
        f.write('ion": "a#0.0", "gateway": "g"}\n')
        f.write(json.dumps({"t": 3, "event": "state", "session": "a#0.0", "state": "RUN"}) + "\n")
    reader.poll()
    assert reader.overview()["stages"]["RUN"] == 1
    with open(path, "a") as f:
        for _ in range(2):
            f.write(json.dumps({"t": 4, "event": "result", "session": "a#0.0", "task": "a", "sample": 0,
                                "status": "completed", "reward": 1.0, "shard": ""}) + "\n")
        f.write(json.dumps({"t": 5, "event": "result", "session": "a#1.0", "task": "a", "sample": "x"}) + "\n")
    reader.poll()
    o = reader.overview()
    assert (o["done"], o["stages"]["RUN"], o["stages"]["QUEUED"]) == (1, 0, 2)


def test_tail_bounds_what_it_reads(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"old\n" * 100_000 + b"A" * 10_000 + b"\nERROR last\n")
    tail = Tail(log, max_bytes=4096, max_line=100, lossy=True)
    lines = tail.lines()
    assert lines[-1] == "ERROR last" and tail.skipped > 390_000 and all(len(x) <= 100 for x in lines)
    log.write_bytes(b"B" * 10_000)  # shrank: read again from the start; one line longer than a read is dropped
    assert tail.lines() == [] and tail.lines() == []
    journal_tail = Tail(log, max_bytes=4096)
    log.write_bytes(b"x\n" * 5000)
    got = []
    while True:
        got += journal_tail.lines()
        if not journal_tail.more:
            break
    assert len(got) == 5000, "a journal is read whole, a bounded piece per call"


def test_series_stays_bounded_and_keeps_its_sums() -> None:
    series = Series(width_s=1.0, max_points=50)
    for t in range(100_000):
        series.add(float(t), ended=1, tokens=10)
    view = series.view()
    assert len(view["points"]) <= 50 and view["width_s"] >= 2000
    assert sum(p["ended"] for p in view["points"]) == 100_000 and sum(p["tokens"] for p in view["points"]) == 1_000_000


def test_kind_of_groups_the_same_failure() -> None:
    a = kind_of("2026-12-03 23:21:02,016 polar_hpc.gateway ERROR proxy did not close session calc#7.0 in 30 s")
    b = kind_of("2026-12-04 01:00:00,000 polar_hpc.gateway ERROR proxy did not close session other-task#12.3 in 31 s")
    assert a == b == "polar_hpc.gateway ERROR proxy did not close session <session> in N s"
    assert kind_of("cannot open '/a/b/c.txt' at /x/y") == kind_of("cannot open '/q.txt' at /z")
