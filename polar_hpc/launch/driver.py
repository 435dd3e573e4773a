"""The driver of a Slurm run: the job's main process, in component 0's batch step.

`drive(run_dir)` (submitit's submitted function, or the last line of the `polar-hpc sbatch`
script) starts the orchestrator on this node, then one `srun --het-group=0 --overlap` engine step
per GPU node and one `srun --het-group=1` gateway step per CPU node (CUDA_VISIBLE_DEVICES and
GPU_DEVICE_ORDINAL removed from their environment). A step that exits is restarted after a backoff
(1, 2, 4… s, at most `slurm.step_restarts` times); meanwhile the orchestrator requeues its
sessions on the other gateways. When every session has ended it shuts the run down and returns 0;
when every engine step (or every gateway step) has used its restarts it stops the run and returns 1.

Preemption and time limits: on SIGUSR2 (the job's `--signal`) it stops the orchestrator (which
journals the sessions in flight as interrupted), stops the steps and asks Slurm to requeue the
job; on SIGTERM (scancel, `scontrol requeue`) it does the same without the requeue. The next life
of the job resumes from the journal.
"""

from __future__ import annotations

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


def drive(run_dir: Path) -> int:
    run_dir = Path(run_dir)
    topology = load_topology(run_dir / "topology.yaml")
    logs = run_dir / "logs"
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    (run_dir / "rendezvous.json").unlink(missing_ok=True)  # a previous life's endpoint
    host = socket.gethostname()
    args = ["orchestrator", "--run-dir", str(run_dir), "--host", "0.0.0.0", "--advertise", host]
    orchestrator = procs.spawn("orchestrator", args + ["--port", str(topology.slurm.port)], logs / "orchestrator.log")
    endpoint = procs.wait_ready(orchestrator, run_dir / "rendezvous.json")["endpoint"]
    print(f"orchestrator at {endpoint}; restart {os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
    steps = _steps(run_dir, topology, endpoint)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    security.secure_client(sock, run_dir, security.ADMIN)
    sock.connect(endpoint)
    code = 0
    try:
        while not signals:
            if orchestrator.proc.poll() is not None:
                print(f"orchestrator exited with code {orchestrator.proc.returncode}", flush=True)
                code = orchestrator.proc.returncode or 0
                break
            _supervise(steps, topology.slurm.step_restarts)
            for kind in ("engine", "gateway"):
                if all(s.due == float("inf") for s in steps if s.name.startswith(kind)):
                    print(f"every {kind} step failed {topology.slurm.step_restarts + 1} times: giving up", flush=True)
                    code = 1
            if code:
                break
            if _finished(sock):
                sock.send(wire.encode(wire.Shutdown(reason="all sessions ended")))
                _wait(orchestrator.proc, 30)
                break
            time.sleep(0.5)
        if signals:
            print(f"got signal {signals[0]}: stopping; the next start resumes from the journal", flush=True)
    finally:
        procs.stop([orchestrator], grace_s=10)
        running = [s.child for s in steps if s.child is not None]
        for child in running if not signals else []:  # after Shutdown the steps exit on their own
            _wait(child.proc, 15)
        procs.stop(running, grace_s=20)
        sock.close(linger=0)
    if signals and signals[0] == signal.SIGUSR2 and topology.slurm.requeue and "SLURM_JOB_ID" in os.environ:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
        return 0
    return 1 if signals else code


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
