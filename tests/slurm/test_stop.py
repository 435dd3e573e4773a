"""How a Slurm job stops: scancel and requeue mid-run stop every process inside KillWait, leave a
true `end` record and status, no rendezvous, and every journaled result readable with no resume;
`polar-hpc cancel` of a pending job scancels it at once; a session that cannot end before the
time limit is not started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from polar_hpc.shards.reader import iter_trajectories
from tests.slurm.conftest import job_gone, journal, results, wait_for, write_topology
from tests.slurm.test_hetjob import _calculator, _check_exactly_once, _nudge, _polar, _sacct_state, _submit


def _lives(run_dir: Path) -> list[dict]:
    path = run_dir / "journal" / "driver.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _mid_run(env: dict, tmp_path: Path, calculator_dir: Path, n: int) -> tuple[str, Path]:
    """A job with results journaled and more sessions in POSTRUN (a 2 s evaluator) than have ended."""
    job_id, run_dir = _submit(env, tmp_path, _calculator(tmp_path, calculator_dir, n, slow_postrun=True),
                              token_delay_ms=15)
    wait_for("results, and sessions in POSTRUN", lambda: len(r := results(run_dir)) >= 2 and len(
        {e["session"] for e in journal(run_dir) if e.get("state") == "POSTRUN"}) > len(r), 120, 0.2)
    return job_id, run_dir


def _stopped_cleanly(env: dict, run_dir: Path) -> dict:
    """What every stop by Slurm must leave: the driver's `end` updated once every process was down
    (not the one it wrote first), no endpoint, no open shard, and every journaled result readable."""
    end = _lives(run_dir)[-1]
    assert end["event"] == "end" and end["outcome"] == "signal", end
    assert end["why"] == "stopped by Slurm: SIGTERM", end
    assert "stopping" not in end and end["stopped_in_s"] is not None and end["left"] > 0, end
    assert [e for e in _lives(run_dir) if e.get("stopping")], "the first `end` comes before the stop"
    assert not (run_dir / "rendezvous.json").exists()
    assert not list((run_dir / "shards").glob(".*.tmp"))
    verify = _polar(env, "shards", "verify", run_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    readable = {t.session_id for t in iter_trajectories(run_dir)}
    journaled = {r["session"] for r in results(run_dir)}
    assert journaled and journaled <= readable, journaled - readable
    shown = _polar(env, "shards", "show", run_dir, "--json").stdout.splitlines()
    assert len(shown) >= len(journaled), shown
    return end


@pytest.mark.timeout(240)
def test_scancel_mid_run_stops_cleanly_inside_killwait(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    job_id, run_dir = _mid_run(slurm, tmp_path, calculator_dir, 40)
    subprocess.run(["scancel", job_id], env=slurm, check=True)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 120)
    _stopped_cleanly(slurm, run_dir)
    assert "|CANCELLED" in _sacct_state(slurm, job_id)
    status = _polar(slurm, "status", job_id).stdout
    assert "stopped (signal): stopped by Slurm: SIGTERM; every process down in" in status, status
    assert "(scancel)" in status and "killed" not in status, status
    assert "cut by stops: " in status and "GPU-seconds (2 GPUs / 8 session slots)" in status, status
    assert f"resume: polar-hpc resume {job_id}" in status, status


@pytest.mark.timeout(400)  # two lives of the job
def test_requeue_mid_run_stops_cleanly_then_resumes(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    """`scontrol requeuehold`: the stop of `scontrol requeue`, with the next life held back until the
    first life's leavings are checked (a next life would seal an open shard itself, hiding a defect)."""
    job_id, run_dir = _mid_run(slurm, tmp_path, calculator_dir, 16)
    subprocess.run(["scontrol", "requeuehold", job_id], env=slurm, check=True)
    wait_for("the first life to end", lambda: (e := _lives(run_dir)) and e[-1]["event"] == "end"
             and "stopping" not in e[-1] and not subprocess.run(
                 ["squeue", "-h", "-j", job_id, "-t", "RUNNING,COMPLETING"], env=slurm, capture_output=True,
                 text=True).stdout.strip(), 120)
    _stopped_cleanly(slurm, run_dir)
    status = _polar(slurm, "status", job_id).stdout
    assert "requeued: its last life stopped (signal): stopped by Slurm: SIGTERM" in status, status
    assert "killed" not in status, status
    subprocess.run(["scontrol", "release", job_id], env=slurm, check=True)
    wait_for("the requeued job to resume", lambda: _nudge(slurm, job_id) or any(
        e["event"] == "resumed" for e in journal(run_dir)), 120, 2.0)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 240)
    _check_exactly_once(run_dir, 16)


def test_cancel_of_a_pending_job_scancels_it_at_once(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    topology = write_topology(tmp_path / "topology.yaml")
    topology.write_text(topology.read_text() + '  extra_sbatch: ["--begin=now+3600"]\n')  # pending for an hour
    out = _polar(slurm, "submit", "-c", topology, "--tasks", _calculator(tmp_path, calculator_dir, 2),
                 "--run-dir", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split("submitted job ")[1].split()[0]
    cancel = _polar(slurm, "cancel", job_id)
    assert cancel.returncode == 0 and f"job {job_id} was PENDING: scancel sent" in cancel.stdout, cancel
    wait_for("Slurm to say CANCELLED", lambda: "|CANCELLED" in _sacct_state(slurm, job_id), 60)
    assert not _lives(tmp_path / "run")  # no driver ever started


@pytest.mark.timeout(240)
def test_a_session_that_cannot_end_before_the_time_limit_is_not_started(slurm, tmp_path: Path,
                                                                       calculator_dir: Path) -> None:
    """A 10-minute job: the calculator's sessions (timeout_s 60) run; those of a task with timeout_s
    900 are held, never dispatched, and the job ends once only they are left (no idling until the limit)."""
    short = yaml.safe_load(_calculator(tmp_path, calculator_dir, 4).read_text())
    long = dict(short, id="too-long", num_samples=2, timeout_s=900)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump([short, long]))
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=5)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 180)
    events = journal(run_dir)
    held = {e["session"]: e for e in events if e["event"] == "held"}
    assert set(held) == {"too-long#0.0", "too-long#1.0"}, held
    assert {e["state"] for e in held.values()} == {"held_too_long"}
    assert not [e for e in events if e["event"] == "assigned" and e["session"].startswith("too-long")]
    assert sorted((r["task"], r["status"]) for r in results(run_dir)) == [(short["id"], "completed")] * 4
    end = _lives(run_dir)[-1]
    assert end["outcome"] == "held" and "2 sessions held" in end["why"], end
    status = _polar(slurm, "status", job_id).stdout
    assert "held: 2 sessions not started" in status and "stopped (held): 2 sessions held" in status, status
