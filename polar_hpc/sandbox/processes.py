"""The processes of one sandbox: every one found, every one killed, a command watched against its limits.

`Processes(marker, sealed)` belongs to one sandbox. Its processes are found by three means: the
process groups of the commands it started (`started(pgid)`), the environment marker
`MARKER=marker` every process inherits, and the sandbox's cgroup (`cgroup`, set once the sandbox
made one). Where `sealed` (no command can leave the cgroup), the cgroup's member list is complete
and /proc is not scanned.
- `survivors()`: the live processes of the sandbox (a /proc scan: call it off the event loop).
- `reap(timeout_s)`: the cgroup frozen and killed, then SIGKILL to every survivor until none is
  left; False if some outlive `timeout_s`.
- `hits()` and `broken(before, limits)`: the forks the pids cgroup refused and the processes the
  memory cgroup's OOM killer killed, and the limit broken since `before`, named for the user.
Module functions for one command: `exited(pid)` (its exit, not its pipes' close), `read_capped`
(a stream to its end, the first bytes kept) and `kill_group(pgid)`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from polar_hpc.sandbox import cgroups as cg
from polar_hpc.sandbox.limits import Limits

MARKER = "POLAR_SANDBOX_ID"


class Processes:
    def __init__(self, marker: str, sealed: bool) -> None:
        self.marker = marker
        self.sealed = sealed
        self.cgroup: cg.Cgroup | None = None
        self._pgids: set[int] = set()

    def started(self, pgid: int) -> None:
        self._pgids.add(pgid)

    def hits(self) -> tuple[int, int]:
        """Forks the pids cgroup refused and processes the memory cgroup's OOM killer killed, so far."""
        return (self.cgroup.pids_limit_hits(), self.cgroup.oom_kills()) if self.cgroup else (0, 0)

    def broken(self, before: tuple[int, int], limits: Limits) -> str | None:
        """The cgroup limit broken since `before` (`hits()`), if any."""
        pids, ooms = self.hits()
        if ooms > before[1]:
            return f"memory limit exceeded (memory_mb={(limits.max_memory_bytes or 0) >> 20})"
        return f"process limit reached (max_pids={limits.max_pids})" if pids > before[0] else None

    def survivors(self) -> set[int]:
        found = set(self.cgroup.pids()) if self.cgroup else set()
        if self.cgroup is not None and self.sealed:  # the scan of /proc (ms) would find nothing more
            return {p for p in found if _alive(p)}
        needle = f"{MARKER}={self.marker}".encode()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            state = _stat(pid)
            if state is None or state[0] == "Z":
                continue
            if int(state[2]) in self._pgids or pid in found or needle in _environ(pid):
                found.add(pid)
        return {p for p in found if _alive(p)}

    async def reap(self, timeout_s: float) -> bool:
        """SIGKILL every process of the sandbox until none is left; False if some outlive `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        if self.cgroup is not None:  # frozen, then killed: a fork bomb cannot outrun it
            await asyncio.to_thread(self.cgroup.kill, timeout_s)
        while survivors := await asyncio.to_thread(self.survivors):  # a /proc scan: off the event loop
            if time.monotonic() > deadline:
                return False
            for pid in survivors:
                cg.sigkill(pid)
            await asyncio.sleep(0.01)
        return True


async def exited(pid: int) -> None:
    """Wait for process `pid` to exit (not for its pipes to close, as Process.wait does)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already exited and reaped
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def gone() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, gone)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def read_capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Read a stream to its end, keeping the first `limit` bytes."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    return (s := _stat(pid)) is not None and s[0] != "Z"


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first, pgrp third), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""
