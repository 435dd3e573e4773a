"""The driver of a Slurm run: the job's main process, in component 0's batch step.

`drive(run_dir)` (the last line of the `polar-hpc sbatch` script; `job_main`, its submitit entry,
exits with its code) records the job (`rundir.record_job`), starts the orchestrator on this node,
then one `srun --het-group=0 --overlap` engine step per GPU node and one `srun --het-group=1`
gateway step per CPU node (CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL removed from their
environment). A step that exits is restarted after a backoff (1, 2, 4… s, at most
`slurm.step_restarts` times); meanwhile the orchestrator requeues its sessions on the other
gateways. When every session has ended it shuts the run down and returns 0. Every other end
returns 1, so Slurm records the job FAILED, never COMPLETED: every engine step (or every gateway
step) used its restarts, the orchestrator exited with sessions left (killed, or stopped by a
client's Shutdown: `polar-hpc cancel`), or a signal stopped it.

Preemption and time limits: on SIGUSR2 (the job's `--signal`) it stops the orchestrator (which
journals the sessions in flight as interrupted), stops the steps and asks Slurm to requeue the
job (then returns 0); on SIGTERM (scancel, `scontrol requeue`) it does the same without the
requeue. The next life of the job resumes from the journal.

Each life appends to `<run>/journal/driver.jsonl`: `{"event": "start", "job", "restart", "t"}`
and, unless the driver is killed (a start with no end), `{"event": "end", "outcome", "why",
"left", "code", "t"}` with outcome finished, gave_up, orchestrator_exited, cancelled, requeued or
signal; `polar-hpc status` reads it to say what happened. The stale `rendezvous.json` is removed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from polar_hpc import procs, security, wire
from polar_hpc.config import load_topology
from polar_hpc.launch.rundir import record_job
from polar_hpc.orchestrator.journal import progress

_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass
class _Step:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    child: procs.Child | None = None
    restarts: int = 0
    due: float = 0.0  # when to (re)start it


def nodes(group: int) -> list[str]:
    """Host names of het group `group` of this job."""
    nodelist = os.environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}") or os.environ["SLURM_JOB_NODELIST"]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def job_main(run_dir: Path) -> None:
    """submitit's entry: exit with the driver's code (submitit would record a return value as success)."""
    code = drive(run_dir)
    if code:
        raise SystemExit(code)


def drive(run_dir: Path) -> int:
    run_dir = Path(run_dir)
    topology = load_topology(run_dir / "topology.yaml")
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        try:
            record_job(job, run_dir)
        except OSError as e:  # e.g. a read-only home on the compute node: status RUN_DIR still works
            print(f"cannot record job {job}: {e}", flush=True)
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    _record(run_dir, "start", job=job, restart=restart)
    outcome, why = "error", "the driver failed"
    try:
        outcome, why = _life(run_dir, topology, signals, restart, topology.slurm.requeue and bool(job))
    except BaseException as e:
        why = f"the driver failed: {e!r} (its traceback: the job's output)"
        raise
    finally:
        code = 0 if outcome in ("finished", "requeued") else 1
        _record(run_dir, "end", outcome=outcome, why=why, left=progress(run_dir).left, code=code)
    if outcome == "requeued" and job:  # requeued: only a Slurm job is
        subprocess.run(["scontrol", "requeue", job], check=False)
    return code


def _life(run_dir: Path, topology, signals: list[int], restart: str, requeue: bool) -> tuple[str, str]:
    """One life of the job, until the run ends or a signal comes: (outcome, why)."""
    started = time.time()
    (run_dir / "rendezvous.json").unlink(missing_ok=True)  # a previous life's endpoint
    host = socket.gethostname()
    args = ["orchestrator", "--run-dir", str(run_dir), "--host", "0.0.0.0", "--advertise", host]
    orchestrator = procs.spawn("orchestrator", args + ["--port", str(topology.slurm.port)],
                               run_dir / "logs" / "orchestrator.log")
    steps: list[_Step] = []
    sock = zmq.Context.instance().socket(zmq.DEALER)
    outcome, why = "", ""
    try:
        endpoint = procs.wait_ready(orchestrator, run_dir / "rendezvous.json")["endpoint"]
        print(f"orchestrator at {endpoint}; restart {restart}", flush=True)
        steps = _steps(run_dir, topology, endpoint)
        security.secure_client(sock, run_dir, security.ADMIN)
        sock.connect(endpoint)
        while not signals:
            if orchestrator.proc.poll() is not None:
                outcome, why = _orchestrator_exit(run_dir, orchestrator.proc.returncode, started)
                break
            _supervise(steps, topology.slurm.step_restarts)
            for kind in ("engine", "gateway"):
                if all(s.due == float("inf") for s in steps if s.name.startswith(kind)):
                    outcome, why = "gave_up", f"every {kind} step failed {topology.slurm.step_restarts + 1} times"
            if outcome:
                break
            if _finished(sock):
                sock.send(wire.encode(wire.Shutdown(reason="all sessions ended")))
                _wait(orchestrator.proc, 30)
                outcome, why = "finished", "all sessions ended"
                break
            time.sleep(0.5)
        if signals:
            outcome = "requeued" if requeue and signals[0] == signal.SIGUSR2 else "signal"
            why = f"got signal {signals[0]} ({signal.Signals(signals[0]).name})"
        if outcome != "finished":
            print(f"{why}: {'giving up' if outcome == 'gave_up' else 'stopping'} ({outcome}); "
                  "a next life of the job resumes from the journal", flush=True)
        return outcome, why
    finally:
        procs.stop([orchestrator], grace_s=10)
        running = [s.child for s in steps if s.child is not None]
        for child in running if not signals else []:  # after Shutdown the steps exit on their own
            _wait(child.proc, 15)
        procs.stop(running, grace_s=20)
        sock.close(linger=0)
        (run_dir / "rendezvous.json").unlink(missing_ok=True)


def _orchestrator_exit(run_dir: Path, returncode: int, started: float) -> tuple[str, str]:
    """Why the orchestrator exited on its own: the run is done, a client stopped it, or it died."""
    print(f"orchestrator exited with code {returncode}", flush=True)
    p = progress(run_dir)
    if p.left == 0:
        return "finished", "all sessions ended"
    if p.shutdown is not None and p.shutdown.get("t", 0) >= started:
        return "cancelled", f"stopped by a client: {p.shutdown.get('reason', '')}"
    return "orchestrator_exited", f"the orchestrator exited with code {returncode}"


def _record(run_dir: Path, event: str, **fields) -> None:
    with open(run_dir / "journal" / "driver.jsonl", "a") as f:
        f.write(json.dumps({"t": round(time.time(), 3), "event": event, **fields}) + "\n")


def _steps(run_dir: Path, topology, endpoint: str) -> list[_Step]:
    polar = [sys.executable, "-m", "polar_hpc"]
    one = ["--nodes=1", "--ntasks=1"]
    steps = []
    for node in nodes(0):
        argv = ["srun", "--het-group=0", "--overlap", *one, f"--nodelist={node}", f"--cpus-per-task={topology.slurm.gpu.cpus}"]
        argv += polar + ["engine", "--kind", topology.engine.kind, "--run-dir", str(run_dir)]
        steps.append(_Step(f"engine-{node}", argv, dict(os.environ), run_dir / "logs" / f"step-engine-{node}.log"))
    cpu_env = {k: v for k, v in os.environ.items() if k not in _GPU_ENV}
    for node in nodes(1):
        argv = ["srun", "--het-group=1", *one, f"--nodelist={node}", f"--cpus-per-task={topology.slurm.cpu.cpus}"]
        argv += polar + ["gateway", "--run-dir", str(run_dir), "--orchestrator", endpoint, "--gateway-id", f"gw-{node}"]
        steps.append(_Step(f"gateway-{node}", argv, cpu_env, run_dir / "logs" / f"step-gateway-{node}.log"))
    return steps


def _supervise(steps: list[_Step], max_restarts: int) -> None:
    now = time.monotonic()
    for step in steps:
        if step.child is not None and step.child.proc.poll() is not None:
            rc = step.child.proc.returncode
            step.child = None
            if step.restarts >= max_restarts:
                print(f"{step.name} exited with code {rc}; not restarted ({max_restarts} restarts used)", flush=True)
                step.due = float("inf")
                continue
            delay = min(30.0, 2.0 ** step.restarts)
            step.restarts += 1
            step.due = now + delay
            print(f"{step.name} exited with code {rc}; restart {step.restarts} in {delay:.0f}s", flush=True)
        if step.child is None and now >= step.due:
            step.child = procs.spawn_command(step.name, step.argv, step.log, step.env)


def _finished(sock: zmq.Socket) -> bool:
    sock.send(wire.encode(wire.StatusRequest()))
    if not sock.poll(1000):
        return False
    reply = wire.decode(sock.recv())
    return isinstance(reply, wire.StatusReply) and reply.done


def _wait(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
