"""The one protocol every sandbox backend implements, and the process runner they share.

A `Sandbox` owns a private workspace (its cwd) and a private tmp. `start()` copies the task's files
in and runs its prepare commands; `exec()` runs one shell command with a timeout and an output cap;
`stop()` kills every process the sandbox started and returns whether none is left. Backends differ
only in how a command line is wrapped (`_wrap`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MAX_OUTPUT = 1 << 20


@dataclass
class ExecResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool


class SandboxError(Exception):
    """The sandbox could not be started (a prepare command failed, a file is missing...)."""


class Sandbox:
    """Base class: a workspace folder and process-group bookkeeping; subclasses wrap commands."""

    name = "base"

    def __init__(self, root: Path, files: dict[str, str], prepare: list[str], network: str) -> None:
        self.root = root
        self.workspace = root / "work"
        self.tmp = root / "tmp"
        self.files = files
        self.prepare = prepare
        self.network = network
        self._pgids: set[int] = set()

    async def start(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        for dest, src in self.files.items():
            target = self.workspace / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if Path(src).is_dir() else shutil.copy2)(src, target)
        for command in self.prepare:
            result = await self.exec(command, env={}, timeout_s=600)
            if result.returncode != 0:
                tail = result.stderr[-2000:].decode(errors="replace")
                raise SandboxError(f"prepare command {command!r} exited {result.returncode}: {tail}")

    async def exec(
        self, command: str, env: dict[str, str], timeout_s: float, max_output: int = MAX_OUTPUT
    ) -> ExecResult:
        """Run `command` (via /bin/sh -c) in the workspace; kill its whole tree at the timeout."""
        proc = await asyncio.create_subprocess_exec(
            *self._wrap(["/bin/sh", "-c", command]),
            cwd=self.workspace,
            env=self._environment(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._pgids.add(proc.pid)
        reads = asyncio.gather(_read_capped(proc.stdout, max_output), _read_capped(proc.stderr, max_output))
        timed_out = False
        try:
            await asyncio.wait_for(_exited(proc.pid), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:  # on timeout, cancellation, or children left behind by a command that exited
            _kill_group(proc.pid)
        try:
            out, err = await asyncio.wait_for(reads, 5.0)
        except asyncio.TimeoutError:  # an escaped process still holds the pipes
            out, err = b"", b"(output lost: a process outside the sandbox's group held it open)"
        await proc.wait()
        return ExecResult(proc.returncode, out, err, timed_out)

    async def stop(self) -> bool:
        """Kill what is left, remove the sandbox's files; True when no process of it survives."""
        for pgid in self._pgids:
            _kill_group(pgid)
        clean = await _groups_gone(self._pgids, timeout_s=2.0)
        shutil.rmtree(self.root, ignore_errors=True)
        return clean

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workspace),
            "TMPDIR": str(self.tmp),
            "LANG": "C.UTF-8",
        }
        return base | env

    def _wrap(self, argv: list[str]) -> list[str]:
        raise NotImplementedError


async def _exited(pid: int) -> None:
    """Wait for process `pid` to exit (not for its pipes to close, as Process.wait does)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already exited and reaped
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Read a stream to its end, keeping the first `limit` bytes."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _groups_gone(pgids: set[int], timeout_s: float) -> bool:
    """Wait until no live process is left in any of `pgids` (SIGKILL takes a moment to land)."""
    deadline = time.monotonic() + timeout_s
    while any(_group_alive(p) for p in pgids):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _group_alive(pgid: int) -> bool:
    """A live (non-zombie) process is still in group `pgid`."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
