"""`polar-hpc submit` on a real Slurm: the calculator as one hetjob; requeue; a killed gateway step;
a killed driver, told by `status` and resumed; runs that stop early end FAILED and say why."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from polar_hpc.shards.reader import iter_trajectories
from tests.e2e.helpers import live_processes_matching
from tests.slurm.conftest import job_gone, journal, results, wait_for, write_topology


def _polar(env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar_hpc", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=60)


def _submit(env: dict, tmp_path: Path, tasks: Path, gpus: int = 2, extra: tuple[str, ...] = (),
            **engine) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    out = _polar(env, "submit", "-c", write_topology(tmp_path / "topology.yaml", gpus, extra, **engine), "--tasks", tasks,
                 "--run-dir", run_dir)
    assert out.returncode == 0, out.stderr
    job_id = re.search(r"submitted job (\d+)", out.stdout).group(1)
    assert str(run_dir) in out.stdout
    return job_id, run_dir


def _calculator(tmp_path: Path, calculator_dir: Path, n: int, slow_postrun: bool = False) -> Path:
    """The calculator example with `n` samples (its agent copied beside the task file: sources must
    lie in the task's folder); `slow_postrun`: an evaluator that takes 2 s, so that a stop finds
    sessions in POSTRUN."""
    text = (calculator_dir / "task.yaml").read_text().replace("num_samples: 8", f"num_samples: {n}")
    (tmp_path / "agent.py").write_bytes((calculator_dir / "agent.py").read_bytes())
    if slow_postrun:
        text = text.replace('kind: regex\n  pattern: "\\\\b395\\\\b"', 'kind: command\n  command: "sleep 2"')
        assert "sleep 2" in text
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def _nudge(env: dict, job_id: str) -> None:
    """An idle lab cluster's backfill pass skips a cycle when no job or node changed since the last
    one, so a requeued hetjob can wait minutes after its BeginTime; touching the job wakes it."""
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "Comment=requeued"], env=env, capture_output=True)


def _sacct_state(env: dict, job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode"], env=env,
                         capture_output=True, text=True)
    return next((x for x in out.stdout.splitlines() if x.startswith(f"{job_id}+0|")), "")


def _check_exactly_once(run_dir: Path, n: int) -> None:
    """Every (task, sample) has one journaled result, completed, whose trajectory is in its shard,
    and the shards hold no second finished copy of any (task, sample)."""
    done = results(run_dir)
    keys = Counter((r["task"], r["sample"]) for r in done)
    assert sorted(k[1] for k in keys) == list(range(n)) and set(keys.values()) == {1}, keys
    assert {r["status"] for r in done} == {"completed"}
    written = {(t.session_id, t.status) for t in iter_trajectories(run_dir / "shards", unique=False)}
    for r in done:
        assert (r["session"], "completed") in written, r
    read = [(t.task_id, t.sample_index, t.session_id, t.status) for t in iter_trajectories(run_dir)]
    assert sorted(read) == sorted((r["task"], r["sample"], r["session"], "completed") for r in done)
    finished = Counter((t.task_id, t.sample_index) for t in iter_trajectories(run_dir / "shards", unique=False)
                       if t.status != "cancelled")
    assert set(finished.values()) == {1}, finished  # nothing run twice to the end


def test_calculator_hetjob(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    tasks = _calculator(tmp_path, calculator_dir, 8)
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=5)
    seen = wait_for("status to list an engine and a gateway",
                    lambda: (o := _polar(slurm, "status", job_id)).returncode == 0 and "gateway" in o.stdout
                    and "engine" in o.stdout and o.stdout, 90)
    assert "RUNNING" in seen and "gw-n1" in seen and "n0-0" in seen, seen
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 120)
    _check_exactly_once(run_dir, 8)
    assert "CUDA_VISIBLE_DEVICES=0,1" in (run_dir / "logs" / "step-engine-n0.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=unset" in (run_dir / "logs" / "step-gateway-n1.log").read_text()
    final = wait_for("sacct to say COMPLETED", lambda: "COMPLETED" in (o := _polar(slurm, "status", job_id).stdout) and o, 30)
    assert "completed 8" in final and "0 never ended" in final and "finished: all sessions ended" in final, final
    assert "resume" not in final
    assert "cost: " in final and "over 1 job lives; 8 accepted trajectories" in final, final
    cost = json.loads((run_dir / "accounting.json").read_text())  # what `status` read from sacct
    (life,) = cost["lives"]
    assert (life["job"], life["life"], life["state"]) == (job_id, 0, "COMPLETED") and life["elapsed_s"] > 0
    # the hetjob's components start and end together: 2 GPUs and 1 CPU on n0, 2 CPUs on n1
    assert (life["gpu_s"], life["cpu_s"]) == (2 * life["elapsed_s"], 3 * life["elapsed_s"]), life
    assert cost["gpu_hours"] == pytest.approx(life["gpu_s"] / 3600) and cost["accepted_trajectories"] == 8
    assert cost["gpu_hours_per_accepted"] == pytest.approx(cost["gpu_hours"] / 8)
    assert 0 <= cost["wasted_gpu_s"]["idle_engines"] <= life["gpu_s"], cost  # from the engines' own gauges
    assert (run_dir / "keys").stat().st_mode & 0o777 == 0o700
    assert (run_dir / "keys" / "client.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.timeout(300)  # two lives of the job
def test_requeue_resumes_from_the_journal(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    tasks = _calculator(tmp_path, calculator_dir, 16, slow_postrun=True)
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=15)
    before = wait_for("a few results, sessions in POSTRUN", lambda: len(r := results(run_dir)) >= 3 and r and len(
        {e["session"] for e in journal(run_dir) if e.get("state") == "POSTRUN"}) > len(r) and r, 120, 0.2)
    subprocess.run(["scontrol", "requeue", job_id], env=slurm, check=True)
    wait_for("the requeued job to resume", lambda: _nudge(slurm, job_id) or any(
        e["event"] == "resumed" for e in journal(run_dir)), 120, 2.0)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 180)
    _check_exactly_once(run_dir, 16)
    events = journal(run_dir)
    resumed_at = next(i for i, e in enumerate(events) if e["event"] == "resumed")
    done_before = {(r["task"], r["sample"]) for r in results(run_dir) if events.index(r) < resumed_at}
    assert len(done_before) >= len(before)
    redone = [e for e in events[resumed_at:] if e["event"] == "assigned"
              and (e["session"].rpartition("#")[0], int(e["session"].rpartition("#")[2].split(".")[0])) in done_before]
    assert not redone, redone
    wait_for("sacct to say COMPLETED", lambda: "COMPLETED" in _polar(slurm, "status", job_id).stdout, 30)
    lives = json.loads((run_dir / "accounting.json").read_text())["lives"]  # one per start of the job
    assert [(x["job"], x["life"], x["state"]) for x in lives] == [(job_id, 0, "REQUEUED"), (job_id, 1, "COMPLETED")]


@pytest.mark.timeout(240)  # a restarted step on a loaded machine
def test_killed_gateway_step_is_restarted(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    tasks = _calculator(tmp_path, calculator_dir, 12)
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=15)
    wait_for("a first result", lambda: results(run_dir), 120, 0.2)
    pids = live_processes_matching(f"gateway --run-dir {run_dir}")  # the step's srun and the gateway itself
    assert pids
    killed = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # killing the step's srun may have ended the gateway already
            os.kill(pid, signal.SIGKILL)
            killed += 1
    assert killed
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 180)
    _check_exactly_once(run_dir, 12)
    driver_log = next((run_dir / "slurm").glob("*_log.out")).read_text()
    assert "gateway-n1 exited with code" in driver_log and "restart 1" in driver_log, driver_log
    assert [e for e in journal(run_dir) if e["event"] in ("gateway_lost", "interrupted", "requeued")]
    assert json.loads((run_dir / "job.json").read_text())["job_id"] == job_id


@pytest.mark.timeout(300)  # two lives of the job
def test_preemption_signal_requeues_and_resumes(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    """The job's `--signal=B:USR2` (sent here by hand, as at the time limit): the driver journals,
    stops and requeues the job, which resumes."""
    job_id, run_dir = _submit(slurm, tmp_path, _calculator(tmp_path, calculator_dir, 10), token_delay_ms=15)
    wait_for("a few results", lambda: len(results(run_dir)) >= 2, 120, 0.2)
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], env=slurm, check=True)
    wait_for("the requeued job to resume", lambda: _nudge(slurm, job_id) or any(
        e["event"] == "resumed" for e in journal(run_dir)), 120, 2.0)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 180)
    _check_exactly_once(run_dir, 10)
    driver_log = next((run_dir / "slurm").glob("*_log.out")).read_text()
    assert f"got signal {int(signal.SIGUSR2)}" in driver_log and "restart 1" in driver_log, driver_log


@pytest.mark.timeout(300)  # 40 sessions, then status and a second cancel
def test_cancel_stops_the_job_cleanly(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    job_id, run_dir = _submit(slurm, tmp_path, _calculator(tmp_path, calculator_dir, 40), token_delay_ms=30)
    wait_for("a first result", lambda: results(run_dir), 120, 0.2)
    out = _polar(slurm, "cancel", job_id)
    assert out.returncode == 0 and f"job {job_id} ended" in out.stdout, out
    assert any(e["event"] == "shutdown" and e["reason"] == "polar-hpc cancel" for e in journal(run_dir))
    left = 40 - len(results(run_dir))
    assert left > 0  # stopped before the end
    assert _sacct_state(slurm, job_id).startswith(f"{job_id}+0|FAILED|1:0")  # not COMPLETED: sessions left
    status = _polar(slurm, "status", job_id).stdout
    assert "FAILED" in status and "orchestrator not reachable" in status, status
    assert f"{left} never ended" in status and "stopped (cancelled): stopped by a client: polar-hpc cancel" in status
    assert f"resume: polar-hpc resume {job_id}" in status, status
    started = time.monotonic()
    again = _polar(slurm, "cancel", job_id)  # a job that has ended: said at once, not after 60 s
    assert again.returncode == 0 and f"job {job_id} has already ended (FAILED" in again.stdout, again
    assert time.monotonic() - started < 45  # not after asking an orchestrator for 60 s


def test_failing_engine_step_is_restarted_then_the_job_stops(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    """`engine.kind: sglang` where SGLang is not installed: the engine step starts the real command
    line, fails, is restarted a bounded number of times, and then the driver ends the job."""
    topology = write_topology(tmp_path / "topology.yaml")
    text = topology.read_text().replace("kind: scripted", "kind: sglang\n  model_path: /nonexistent/model")
    topology.write_text(text.replace("slurm:\n", "slurm:\n  step_restarts: 1\n"))
    out = _polar(slurm, "submit", "-c", topology, "--tasks", _calculator(tmp_path, calculator_dir, 2),
                 "--run-dir", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    job_id = re.search(r"submitted job (\d+)", out.stdout).group(1)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 120)
    run_dir = tmp_path / "run"
    driver_log = next((run_dir / "slurm").glob("*_log.out")).read_text()
    assert "engine-n0 exited with code 1; restart 1 in 1s" in driver_log, driver_log
    assert "every engine step failed 2 times: giving up" in driver_log, driver_log
    server_log = (run_dir / "logs" / "engine-n0-0.log").read_text()
    assert "No module named 'sglang'" in server_log  # the SGLang command line was run on the GPU node
    assert not results(run_dir)
    assert _sacct_state(slurm, job_id).startswith(f"{job_id}+0|FAILED|1:0")
    status = _polar(slurm, "status", job_id).stdout
    assert "stopped (gave_up): every engine step failed 2 times" in status and "2 never ended" in status, status
    assert f"resume: polar-hpc resume {job_id}" in status, status


@pytest.mark.timeout(300)
def test_killed_driver_is_told_and_resumed(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    """kill -9 of the driver (the batch shell) fails the job with sessions in POSTRUN; `status`
    says so and how to resume; `polar-hpc resume` runs the rest, adopting what the killed life
    sealed but never journaled: nothing lost, nothing run twice."""
    tasks = _calculator(tmp_path, calculator_dir, 8, slow_postrun=True)
    job_id, run_dir = _submit(slurm, tmp_path, tasks, token_delay_ms=15)
    wait_for("a result and sessions in POSTRUN", lambda: results(run_dir) and len(
        {e["session"] for e in journal(run_dir) if e.get("state") == "POSTRUN"}) > len(results(run_dir)), 120, 0.2)
    drivers = live_processes_matching(f"submitit.core._submit {run_dir}/slurm")
    assert len(drivers) == 1, drivers
    os.kill(drivers[0], signal.SIGKILL)
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 60)
    wait_for("sacct to record it FAILED", lambda: "|FAILED|" in _sacct_state(slurm, job_id), 60)  # after squeue
    status = _polar(slurm, "status", job_id).stdout
    assert "ended without saying why: it was killed" in status, status
    assert "never ended" in status and f"resume: polar-hpc resume {job_id}" in status, status
    out = _polar(slurm, "resume", job_id)
    assert out.returncode == 0, out.stderr
    second = re.search(r"submitted job (\d+)", out.stdout).group(1)
    again = _polar(slurm, "resume", second)  # one job per run
    assert again.returncode == 2 and f"job {second} of this run is" in again.stderr, again
    wait_for("the resumed job to end", lambda: job_gone(slurm, second), 180)
    _check_exactly_once(run_dir, 8)
    assert _sacct_state(slurm, second).startswith(f"{second}+0|COMPLETED|0:0")
    assert "finished: all sessions ended" in _polar(slurm, "status", run_dir).stdout
    done = _polar(slurm, "resume", run_dir)
    assert done.returncode == 2 and "nothing to resume: all 8 sessions of the run have ended" in done.stderr


@pytest.mark.timeout(300)  # a job, then four status calls
def test_a_job_submitted_by_hand_is_found(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    """`polar-hpc sbatch` + sbatch: the driver records the job, so `status JOBID` and `status RUN` find it."""
    run_dir = tmp_path / "run"
    out = _polar(slurm, "sbatch", "-c", write_topology(tmp_path / "topology.yaml", token_delay_ms=5), "--tasks",
                 _calculator(tmp_path, calculator_dir, 2), "--run-dir", run_dir)
    assert out.returncode == 0, out.stderr
    before = _polar(slurm, "status", run_dir)
    assert before.returncode == 0 and "none has started for this run yet" in before.stdout, before
    (tmp_path / "job.sbatch").write_text(out.stdout)
    submitted = subprocess.run(["sbatch", "--parsable", tmp_path / "job.sbatch"], env=slurm, capture_output=True,
                               text=True, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for("the job to end", lambda: job_gone(slurm, job_id), 120)
    by_id = _polar(slurm, "status", job_id)
    assert by_id.returncode == 0 and f"slurm job {job_id}: COMPLETED" in by_id.stdout, by_id
    assert "finished: all sessions ended" in by_id.stdout and str(run_dir) in by_id.stdout
    assert f"slurm job {job_id}: COMPLETED" in _polar(slurm, "status", run_dir).stdout


def test_a_job_slurm_refuses_is_a_clear_error(slurm, tmp_path: Path, calculator_dir: Path) -> None:
    topology = write_topology(tmp_path / "topology.yaml")
    topology.write_text(topology.read_text().replace("cpu: {nodes: 1, cpus: 2}", "cpu: {nodes: 1, cpus: 2, partition: nosuch}"))
    out = _polar(slurm, "submit", "-c", topology, "--tasks", calculator_dir / "task.yaml", "--run-dir", tmp_path / "run")
    assert out.returncode == 2, out
    assert f"error: {topology}: sbatch refused the job:" in out.stderr and "Invalid partition" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()  # the same --run-dir works next time
