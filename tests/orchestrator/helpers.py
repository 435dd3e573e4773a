"""Start a real orchestrator process on a run directory, and read what it sends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from polar_hpc import wire


def start_orchestrator(run_dir: Path, topology: str, task: dict | list[dict] | None,
                       args: tuple = ()) -> tuple[subprocess.Popen, str]:
    """Write the run's topology and its task or tasks (none: an empty task file), start `polar-hpc
    orchestrator` with `args`, return it and its endpoint."""
    (run_dir / "topology.yaml").write_text(topology)
    tasks = [] if task is None else task if isinstance(task, list) else [task]
    (run_dir / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "orchestrator", "--run-dir", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rendezvous = run_dir / "rendezvous.json"
    deadline = time.monotonic() + 30
    while not rendezvous.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.02)
    assert rendezvous.stat().st_mode & 0o777 == 0o600
    return proc, json.loads(rendezvous.read_text())["endpoint"]


def reply(sock, kind, timeout_s: float = 5.0):
    """The next message of type `kind` on `sock`, skipping others (heartbeats); None after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        msg = wire.decode(sock.recv())
        if isinstance(msg, kind):
            return msg
    return None


def assigned(sock, n: int, timeout_s: float = 5.0) -> list[wire.SessionSpec]:
    """The next `n` sessions assigned on `sock`, over as many Assign messages as they came in."""
    specs: list[wire.SessionSpec] = []
    while len(specs) < n:
        specs += next_message(sock, wire.Assign, timeout_s).sessions
    assert len(specs) == n, f"{len(specs)} sessions assigned where {n} were expected"
    return specs


def next_message(sock, kind, timeout_s: float = 5.0):
    """The next message of type `kind` on `sock`, skipping others (heartbeats)."""
    msg = reply(sock, kind, timeout_s)
    if msg is None:
        raise AssertionError(f"no {kind.__name__} within {timeout_s}s")
    return msg
