"""`polar-hpc status` and `polar-hpc cancel` for a Slurm run, named by run directory or job id.

A job id is looked up in `~/.polar-hpc/jobs/` (written by submit). Status shows the Slurm state
(sacct, hetjob rows mapped), then asks the orchestrator (over CURVE with the run's keys) for the
engines and gateways (up, load), sessions by state, throughput and ETA; when it cannot be reached
the sessions are counted from the journal. Cancel asks the orchestrator to shut the run down
cleanly (gateways write what they hold, the driver exits) and falls back to `scancel`.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import zmq
from rich.console import Console
from rich.table import Table

from polar_hpc import security, wire
from polar_hpc.config import ConfigError
from polar_hpc.launch.slurm import JOB_INDEX, job_state


def resolve(target: str) -> tuple[Path, str | None]:
    """(run directory, job id) for a run directory or a job id."""
    path = Path(target)
    if not (path / "tasks.jsonl").exists():
        entry = JOB_INDEX / target
        if not entry.exists():
            raise ConfigError(f"{target}: neither a run directory nor a job id submitted from here")
        path = Path(entry.read_text().strip())
    job = path / "job.json"
    return path.resolve(), json.loads(job.read_text())["job_id"] if job.exists() else None


def ask(run_dir: Path, msg: wire.Message, timeout_s: float = 3.0) -> wire.AnyMessage | None:
    """Send one message to the run's orchestrator; its reply, or None when nobody answered."""
    rendezvous = run_dir / "rendezvous.json"
    if not rendezvous.exists():
        return None
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        security.secure_client(sock, run_dir, security.ADMIN)
        sock.setsockopt(zmq.LINGER, 500)
        sock.connect(json.loads(rendezvous.read_text())["endpoint"])
        sock.send(wire.encode(msg))
        if isinstance(msg, wire.Shutdown):
            return None
        return wire.decode(sock.recv()) if sock.poll(int(timeout_s * 1000)) else None
    finally:
        sock.close()


def show(target: str, console: Console) -> None:
    run_dir, job_id = resolve(target)
    state = job_state(job_id) if job_id else "(not a Slurm run)"
    console.print(f"run {run_dir}\nslurm job {job_id}: {state}")
    reply = ask(run_dir, wire.StatusRequest())
    if not isinstance(reply, wire.StatusReply):
        states = _journal_states(run_dir)
        console.print(f"orchestrator not reachable; from the journal: {_states(states)}")
        return
    table = Table("kind", "name", "host", "up", "load", "detail")
    for m in reply.members:
        table.add_row(m.kind, m.name, m.host, "up" if m.up else "down", str(m.load), m.detail)
    console.print(table)
    eta = f"{reply.eta_s:.0f}s" if reply.eta_s is not None else "-"
    console.print(f"sessions {reply.total}: {_states(reply.states)}")
    if reply.versions_in_flight:
        console.print(f"weight versions in flight: {_states(reply.versions_in_flight)}")
    console.print(f"throughput {reply.sessions_per_s * 60:.1f} sessions/min, ETA {eta}, tokens {reply.tokens}")


def _states(states: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none"


def _journal_states(run_dir: Path) -> dict[str, int]:
    path = run_dir / "journal" / "orchestrator.jsonl"
    events = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return dict(Counter(e["status"] for e in events if e.get("event") == "result"))


def cancel(target: str, console: Console, wait_s: float = 60.0) -> None:
    run_dir, job_id = resolve(target)
    ask(run_dir, wire.Shutdown(reason="polar-hpc cancel"))
    console.print(f"asked the orchestrator of {run_dir} to stop")
    if job_id is None:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
        if out.returncode == 0 and not out.stdout.strip():
            console.print(f"job {job_id} ended")
            return
        time.sleep(1)
    subprocess.run(["scancel", job_id], check=False)
    console.print(f"job {job_id} did not stop within {wait_s:.0f}s: scancel sent")
