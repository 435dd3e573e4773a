"""Child processes of polar-hpc: start them with a log file, wait until they are ready, stop them.

A child says it is ready by writing a ready file (`write_ready`: JSON, mode 0600, written to a
temporary name and renamed into place, so a reader never sees it half written); its parent polls
for it (`wait_ready`).

Every child runs `python -m polar_hpc ...` with this interpreter (or, with `spawn_command`, any
command such as SGLang's server), in its own process group, and
gets SIGTERM if its parent dies (PR_SET_PDEATHSIG), so no process outlives the one that started it.

The stop budget: a process told to stop (SIGTERM, Shutdown) seals what it holds within
`stop_budget()` seconds, the Slurm driver's budget (a third of the cluster's KillWait, or
`slurm.stop_budget_s`) handed down to every child in POLAR_STOP_BUDGET_S.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from polar_hpc.errors import ChildFailed

_PR_SET_PDEATHSIG = 1
STOP_BUDGET_ENV = "POLAR_STOP_BUDGET_S"
DEFAULT_STOP_BUDGET_S = 10.0  # where no budget is handed down (local runs)



@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_exit(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the process to exit by itself (it may still run after)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)

    def check(self) -> None:
        """Raise ChildFailed if the process has exited."""
        if self.proc.poll() is not None:
            raise ChildFailed(f"{self.name} exited with code {self.proc.returncode} (log {self.log}):\n{self.tail()}")


def stop_budget(default: float = DEFAULT_STOP_BUDGET_S) -> float:
    """Seconds this process has to stop once told to: POLAR_STOP_BUDGET_S, else `default`."""
    try:
        value = float(os.environ.get(STOP_BUDGET_ENV, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(name: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
    """Start `polar-hpc ARGS...` with stdout and stderr appended to `log`."""
    return spawn_command(name, [sys.executable, "-m", "polar_hpc", *args], log, env)


def spawn_command(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
    """Start any command the same way (own process group, dies with its parent, output to `log`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return Child(name, proc, log)


def write_ready(path: Path, info: dict) -> None:
    """Write `info` to the ready file `path` at once (tmp + os.replace), readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


def wait_ready(child: Child, ready_file: Path, timeout_s: float = 60.0) -> dict:
    """Wait for the child to write its ready file (JSON); fail early if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready_file.exists():
            return json.loads(ready_file.read_text())
        child.check()
        time.sleep(0.02)
    raise ChildFailed(f"{child.name} not ready after {timeout_s:.0f}s (log {child.log}):\n{child.tail()}")


def stop(children: list[Child], grace_s: float = 5.0) -> None:
    """SIGTERM each process group, then SIGKILL whatever is left after `grace_s`."""
    for c in children:
        _signal_group(c.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for c in children:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for c in children:
        _signal_group(c.proc, signal.SIGKILL)
        c.proc.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
