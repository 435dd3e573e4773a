"""What bounds a sandbox: `Limits`, and a pids cgroup per sandbox where this process may make one.

Where each bound is enforced (docs/sandbox.md has the table):
- processes: `max_pids` through a pids cgroup when the gateway can create one (root, or a
  delegated cgroup v2 subtree); otherwise RLIMIT_NPROC set inside the sandbox's user namespace
  (bwrap, apptainer), which the kernel counts per namespace but does not enforce for host root
  (a root gateway's harnesses run as `run_as` outside any user namespace: owner.py).
- one file's size: RLIMIT_FSIZE (every backend).
- the session's disk: the sandbox folder's size (its /dev/shm included: bwrap and apptainer bind
  the folder's `shm/` there), checked every 0.5 s while a command runs.
- output kept: `max_output` bytes per stream; the rest is read and dropped.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PARENT = "polar-hpc"


@dataclass(frozen=True)
class Limits:
    max_pids: int = 512
    max_file_bytes: int = 1 << 30
    max_disk_bytes: int = 4 << 30
    max_output: int = 1 << 20
    use_cgroup: bool = True  # False: rely on RLIMIT_NPROC (as on clusters without delegation)


class PidsCgroup:
    """A pids cgroup (v1 `pids` hierarchy or a v2 tree with the pids controller) for one sandbox."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, max_pids: int) -> PidsCgroup | None:
        """A new cgroup limited to `max_pids` processes, or None when none can be made here."""
        for parent in _parents():
            path = parent / name
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(max_pids))
            except OSError:
                path.rmdir()
                continue
            return cls(path)
        return None

    def join(self) -> None:
        """Move the calling process in (used between fork and exec, so every descendant is in)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    async def remove(self, timeout_s: float = 2.0) -> bool:
        """Remove the cgroup; it stays busy until its last (zombie) process is reaped."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
            await asyncio.sleep(0.02)


def _parents() -> list[Path]:
    """Folders a per-sandbox cgroup may be created in, made (once) where possible."""
    found = []
    v1 = CGROUP_ROOT / "pids"
    if (v1 / "cgroup.procs").exists():
        found.append(v1 / _PARENT)
    for v2 in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "pids" in controllers.read_text().split():
            found.append(v2 / _PARENT)
    usable = []
    for parent in found:
        try:
            parent.mkdir(exist_ok=True)
            control = parent / "cgroup.subtree_control"
            if control.exists() and "pids" not in control.read_text().split():
                control.write_text("+pids")
        except OSError:
            continue
        usable.append(parent)
    return usable
