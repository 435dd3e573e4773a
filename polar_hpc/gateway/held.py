"""A harness command whose sandbox stays up after it, until the tests have run in it (Harbor's
verification in the same environment): what the harness left running (a service on localhost, a
daemon) is still there for the tests, where each command's processes would die with it (bubblewrap:
one PID and network namespace per command).

`Held(sandbox)` uses the folder the sandbox mounts at GATE, holding two FIFOs the gateway made.
`await start(command, env, timeout_s, hold_s, cwd, user, token) -> ExecResult`: runs `( command );
echo $? > GATE/done; read _ < GATE/go && exec /bin/sh GATE/run.sh` as one sandbox command (in
`cwd`, as `user`: the tests start there too, as that user; `token`: Sandbox.exec's) and returns
once the harness's part has ended (its exit status read from `done`, at most 16 bytes; no output
yet) or the whole command did (killed at a limit); TimeoutError after `timeout_s`, the command killed.
`await run(command, env, timeout_s) -> ExecResult`: writes run.sh (the variables exported, then
`command`), says `go` and waits for the held command to end: its output is the harness's and then
the tests', its exit status the tests'; `timed_out` after `timeout_s`, the command killed.
`close()` kills a command still held. Anything inside may write to the gate too: it can only start
or stall its own tests (a stalled one times out).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import stat
from pathlib import Path

from polar_hpc.sandbox import ExecResult, Sandbox, files

GATE = "/run/polar/gate"
_STATUS_MAX = 16


class Held:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.folder = sandbox.mounts[GATE]
        self._task: asyncio.Task[ExecResult] | None = None
        self._fifos: list[int] = []  # done and go, held open until close(): see _fifo

    async def start(self, command: str, env: dict[str, str], timeout_s: float, hold_s: float,
                    cwd: str | None = None, user: str | None = None, token: str | None = None) -> ExecResult:
        """The harness's result; the command may live `hold_s` more for its tests."""
        for name in ("done", "go"):
            os.mkfifo(self.folder / name, 0o600)
        gate = shlex.quote(self.sandbox.seen_at(GATE))
        wrapped = f"(\n{command}\n); echo $? > {gate}/done; read _ < {gate}/go && exec /bin/sh {gate}/run.sh"
        done = self._open("done")  # never at EOF: the gateway holds it open for writing too
        loop, said = asyncio.get_running_loop(), asyncio.Event()
        loop.add_reader(done, said.set)
        try:
            self._task = asyncio.create_task(
                self.sandbox.exec(wrapped, env, timeout_s + hold_s, cwd=cwd, user=user, token=token))
            waiter = asyncio.create_task(said.wait())
            finished, _ = await asyncio.wait({self._task, waiter}, timeout=timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if self._task in finished:
                return self._task.result()
            if not finished:
                await self.close()
                raise TimeoutError
            status = os.read(done, _STATUS_MAX).decode(errors="replace").strip()
        finally:
            loop.remove_reader(done)
        return ExecResult(int(status) if status.isdigit() else -1, b"", b"", False)

    async def run(self, command: str, env: dict[str, str], timeout_s: float) -> ExecResult:
        assert self._task is not None, "start() first"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        await files.run(lambda: files.write(self.folder, "run.sh", (exports + command + "\n").encode()), None)
        os.write(self._open("go"), b"go\n")  # read by the held shell, even one that opens `go` only later
        try:
            return await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            await self.close()
            return ExecResult(-1, b"", b"", True)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._fifos:
            os.close(self._fifos.pop())

    def _open(self, name: str) -> int:
        """The gate's FIFO `name`, held open (read-write) until close(): a FIFO that no process
        holds open drops what was written to it, so a word said before the held shell opens it
        would be lost (the shell then waits forever), and the shell's second `echo > done` (after
        one from inside) would wait for a reader."""
        fd = _fifo(self.folder / name)
        self._fifos.append(fd)
        return fd


def _fifo(path: Path) -> int:
    """`path` opened read-write without blocking, only if it is a FIFO (no link followed: a
    command inside may have put anything there)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:  # ELOOP: a link; ENOENT: removed
        raise files.FileError(f"{path}: not the FIFO the gateway made ({e.strerror})") from None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise files.FileError(f"{path}: not the FIFO the gateway made")
    return fd
