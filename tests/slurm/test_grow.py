"""`polar-hpc grow` on a real Slurm: a grow job's gateway joins a running run, takes sessions, is
stopped by Slurm mid-run (`polar-hpc shrink`: scancel, as a preemption stops it), and the run still
ends COMPLETED with every (task, sample) exactly once; a grow job's engine registers, serves calls
and deregisters when shrunk, the run ending the same way, its GPU-seconds in the run's cost; a grow
job follows the run's job through a requeue into its next life and ends with the run; a grow job
shrunk while still PENDING is cancelled and never starts, the run untouched."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from polar_hpc.observe.run import RunReader
from tests.slurm.conftest import job_gone, journal, results, wait_for
from tests.slurm.test_hetjob import _calculator, _check_exactly_once, _nudge, _polar, _sacct_state, _submit


def _held_by(run_dir: Path, gateway: str) -> tuple[int, int]:
    """(sessions the gateway was assigned, of them those still without an end) from the journal."""
    events = journal(run_dir)
    mine = {e["session"] for e in events if e["event"] == "assigned" and e["gateway"] == gateway}
    ended = {e["session"] for e in events if e["event"] in ("result", "interrupted")}
    ended |= {e["previous"] for e in events if e["event"] == "requeued"}
    return len(mine), len(mine - ended)


@pytest.mark.timeout(420)  # two jobs, 40 sessions of up to 32 s, on a busy 2-core machine (270 s seen at load 19)
def test_a_grown_gateway_takes_work_and_leaves_on_scancel_with_nothing_lost(slurm, tmp_path: Path,
                                                                            calculator_dir: Path) -> None:
    n = 40
    job_id, run_dir = _staggered(slurm, tmp_path, calculator_dir, n, 4)  # when a gateway ends one, it runs others
    grow, node = _grown(slurm, run_dir, job_id, "nodes", "--nodes", "1", "--cpus", "2")
    gateway = f"gw-g{grow}-{node}"
    wait_for(f"{gateway} to finish a session and hold others", lambda: _held_by(run_dir, gateway)[1] > 0 and any(
        r["session"] in _assigned_to(run_dir, gateway) for r in results(run_dir)), 120, 0.2)
    shrink = _polar(slurm, "shrink", run_dir)
    assert shrink.returncode == 0 and f"scancel sent to grow job {grow}" in shrink.stdout, shrink
    wait_for("the grow job to end", lambda: job_gone(slurm, grow), 60)
    wait_for("the run's job to end", lambda: job_gone(slurm, job_id), 240)
    _check_exactly_once(run_dir, n)
    events = journal(run_dir)
    mine = _assigned_to(run_dir, gateway)
    again = [e for e in events if e["event"] == "requeued" and e["previous"] in mine]
    assert again, "the grown gateway's sessions in flight were not handed back"
    assert len({e["previous"] for e in again}) == len(again)  # each once
    ends = [e for e in _grow_events(run_dir) if e["event"] == "end"]
    assert [(e["job"], e["outcome"]) for e in ends] == [(grow, "signal")], ends  # it said goodbye within KillWait
    assert [e["job"] for e in _grow_events(run_dir) if e["event"] == "joined"] == [grow]
    assert not any(e.get("job") == grow for e in map(json.loads, (run_dir / "journal" / "driver.jsonl").open()))
    assert _sacct_state(slurm, job_id).startswith(f"{job_id}+0|COMPLETED|0:0")  # the main job untouched
    status = wait_for("status to list both jobs", lambda: (o := _polar(slurm, "status", run_dir).stdout) and
                      "COMPLETED" in o and f"grow job {grow}: CANCELLED" in o and o, 30)
    assert "finished: all sessions ended" in status, status
    assert grow in json.loads((run_dir / "accounting.json").read_text())["jobs"]
    shown = RunReader(run_dir).overview()["jobs"]  # the dashboard's list
    assert [(j["job"], j["kind"], j["outcome"]) for j in shown] == [(job_id, "main", "finished"), (grow, "grow", "signal")]


@pytest.mark.timeout(360)  # two jobs, 12 sessions of up to 22 s, on a busy 2-core machine
def test_a_grown_engine_serves_calls_and_leaves_on_scancel_with_nothing_lost(slurm, tmp_path: Path,
                                                                             calculator_dir: Path) -> None:
    """A grow job of an engine node and a gateway node (a hetjob, engines first) beside the run's job."""
    n = 12
    # sessions keep starting after the engine joins; one of n0's 2 GPUs is left for the grow job; the
    # task's samples go to the least loaded engine, not their group's
    job_id, run_dir = _staggered(slurm, tmp_path, calculator_dir, n, 2, gpus=1, extra=("proxy: {affinity_slack: 0}",),
                                 sample_log="true")
    grow, node = _grown(slurm, run_dir, job_id, "engine_nodes", "--engines", "1", "--nodes", "1", "--cpus", "1")
    (gateway_node,) = next(e["nodes"] for e in _grow_events(run_dir) if e["event"] == "start")
    engine, gateway = f"g{grow}-{node}-0", f"gw-g{grow}-{gateway_node}"
    wait_for(f"{engine} and {gateway} to register", lambda: {(e["event"], e.get("engine", e.get("gateway"))) for e in journal(
        run_dir)} >= {("engine_up", engine), ("gateway_up", gateway)}, 120, 0.2)  # each step got its component's CPUs
    samples = run_dir / "logs" / f"engine-samples-g{grow}-{node}.jsonl"  # what the grown engine generated
    wait_for(f"{engine} to serve calls", lambda: samples.exists() and samples.read_text().count("\n") >= 2, 120, 0.2)
    shrink = _polar(slurm, "shrink", run_dir)
    assert shrink.returncode == 0 and f"scancel sent to grow job {grow}" in shrink.stdout, shrink
    wait_for("the grow job to end", lambda: job_gone(slurm, grow), 60)
    wait_for("the run's job to end", lambda: job_gone(slurm, job_id), 240)
    _check_exactly_once(run_dir, n)
    downs = [e for e in journal(run_dir) if e["event"] == "engine_down" and e["engine"] == engine]
    assert [e["reason"] for e in downs] == ["deregistered"], downs  # it said goodbye, it did not go silent
    ends = [(e["job"], e["outcome"]) for e in _grow_events(run_dir) if e["event"] == "end"]
    assert ends == [(grow, "signal")], ends
    assert f"engine step g{grow}-{node} on {node}" in (run_dir / "logs" / f"step-engine-g{grow}-{node}.log").read_text()
    assert _sacct_state(slurm, job_id).startswith(f"{job_id}+0|COMPLETED|0:0")  # the main job untouched
    wait_for("status to list the grow job", lambda: f"grow job {grow}: CANCELLED" in _polar(slurm, "status", run_dir).stdout, 30)
    cost = json.loads((run_dir / "accounting.json").read_text())
    (life,) = [x for x in cost["lives"] if x["job"] == grow]
    assert (life["gpu_s"], life["cpu_s"]) == (life["elapsed_s"], 2 * life["elapsed_s"]), life  # 1 GPU, 1 + 1 CPUs
    assert cost["gpu_hours"] == pytest.approx(sum(x["gpu_s"] for x in cost["lives"]) / 3600)


def _staggered(slurm: dict, tmp_path: Path, calculator_dir: Path, n: int, kinds: int, **submit) -> tuple[str, Path]:
    """A run of `n` calculator samples, sample s sleeping 2 + (s % kinds) * 10 s before its agent, once
    it has a first result: (its job, its run directory)."""
    tasks = _calculator(tmp_path, calculator_dir, n)
    text = tasks.read_text().replace("timeout_s: 60", "timeout_s: 300")  # two gateways (engines) on 2 busy cores
    staggered = f"command: 's=${{POLAR_SESSION_ID##*#}}; sleep $((2 + ${{s%%.*}} % {kinds} * 10)) && python agent.py'"
    tasks.write_text(text.replace("command: python agent.py", staggered))
    assert "sleep $((" in tasks.read_text()
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=30, **submit)
    wait_for("a first result", lambda: results(run_dir), 120, 0.2)
    return job_id, run_dir


def _grown(slurm: dict, run_dir: Path, target: str, nodes: str, *args: str) -> tuple[str, str]:
    """`polar-hpc grow TARGET ARGS`, started: (the grow job, its first node of `nodes` in its start event)."""
    out = _polar(slurm, "grow", target, *args)
    assert out.returncode == 0, out.stderr
    grow = re.search(r"submitted grow job (\d+)", out.stdout).group(1)
    return grow, wait_for("the grow job to start", lambda: next(
        (e[nodes][0] for e in _grow_events(run_dir) if e["event"] == "start" and e[nodes]), None), 180)


def _grow_events(run_dir: Path) -> list[dict]:
    path = run_dir / "journal" / "grow.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _assigned_to(run_dir: Path, gateway: str) -> set[str]:
    return {e["session"] for e in journal(run_dir) if e["event"] == "assigned" and e["gateway"] == gateway}


def test_grow_of_a_run_whose_job_has_ended_is_refused(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    job_id, run_dir = _submit(slurm, tmp_path, _calculator(tmp_path, calculator_dir, 2))
    subprocess.run(["scancel", job_id], env=slurm, check=True)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 60)
    out = _polar(slurm, "grow", job_id)
    assert out.returncode == 2 and f"the run has no job queued or running (job {job_id}: " in out.stderr, out
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (run_dir / "journal" / "grow.jsonl").exists()


@pytest.mark.timeout(420)  # two lives of the run's job beside a grow job
def test_a_grow_job_follows_the_run_into_its_next_life_and_ends_with_it(slurm, tmp_path: Path,
                                                                        calculator_dir: Path) -> None:
    tasks = _calculator(tmp_path, calculator_dir, 16)
    tasks.write_text(tasks.read_text().replace("timeout_s: 60", "timeout_s: 300"))  # 25 s idle; over 60 s seen loaded
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=15)
    out = _polar(slurm, "grow", run_dir)
    assert out.returncode == 0, out.stderr
    grow = re.search(r"submitted grow job (\d+)", out.stdout).group(1)
    first = wait_for("the grow job to join", lambda: next(
        (e["endpoint"] for e in _grow_events(run_dir) if e["event"] == "joined"), None), 120)
    wait_for("a first result", lambda: results(run_dir), 120, 0.2)
    subprocess.run(["scontrol", "requeue", job_id], env=slurm, check=True)
    wait_for("the run's next life, joined by the grow job", lambda: _nudge(slurm, job_id) or len(
        [e for e in _grow_events(run_dir) if e["event"] == "joined"]) >= 2, 180, 2.0)
    wait_for("both jobs to end", lambda: job_gone(slurm, job_id) and job_gone(slurm, grow), 180)
    _check_exactly_once(run_dir, 16)
    joined = [e["endpoint"] for e in _grow_events(run_dir) if e["event"] == "joined"]
    assert joined[0] == first and len(joined) == 2 and any(e["event"] == "resumed" for e in journal(run_dir))
    ends = [(e["job"], e["outcome"], e["code"]) for e in _grow_events(run_dir) if e["event"] == "end"]
    assert ends == [(grow, "finished", 0)], ends  # it ended with the run, not at its time limit
    gateways = {e["gateway"] for e in journal(run_dir) if e["event"] == "gateway_up"}
    assert any(g.startswith(f"gw-g{grow}-") for g in gateways), gateways


def test_shrink_of_a_pending_grow_job_cancels_it_and_leaves_the_run_alone(slurm, tmp_path: Path,
                                                                          calculator_dir: Path) -> None:
    job_id, run_dir = _submit(slurm, tmp_path, _calculator(tmp_path, calculator_dir, 4))
    out = _polar(slurm, "grow", run_dir, "--sbatch=--hold")  # held: PENDING until released, which it never is
    assert out.returncode == 0, out.stderr
    grow = re.search(r"submitted grow job (\d+)", out.stdout).group(1)
    assert _squeue_state(slurm, grow) == "PENDING"
    shrink = _polar(slurm, "shrink", run_dir, grow)
    assert shrink.returncode == 0 and f"scancel sent to grow job {grow}" in shrink.stdout, shrink
    wait_for("the grow job to leave the queue", lambda: job_gone(slurm, grow), 60)
    cancelled = wait_for("sacct to record it", lambda: next((x for x in subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", grow, "-o", "JobID,State"], env=slurm, capture_output=True,
        text=True).stdout.splitlines() if x.startswith(f"{grow}|")), None), 30)
    assert cancelled.startswith(f"{grow}|CANCELLED"), cancelled
    again = _polar(slurm, "shrink", run_dir)
    assert again.returncode == 0 and "no grow job of this run is queued or running" in again.stdout, again
    wait_for("the run's job to end", lambda: job_gone(slurm, job_id), 240)
    _check_exactly_once(run_dir, 4)
    assert [e["event"] for e in _grow_events(run_dir)] == ["submitted"]  # it never started
    assert not any(e["gateway"].startswith(f"gw-g{grow}-") for e in journal(run_dir) if e["event"] == "gateway_up")
    assert _sacct_state(slurm, job_id).startswith(f"{job_id}+0|COMPLETED|0:0")  # the run's job untouched


def _squeue_state(env: dict, job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True)
    return out.stdout.strip()
