"""The one protocol every sandbox backend implements, and the process runner they share.

A `Sandbox` owns a private workspace (its cwd) and a private tmp under its `root` folder.
- `start()` makes them (and, per backend, the container instance), uploads the task's files and
  runs its prepare commands; `SandboxError` when any of that fails.
- `exec(command, env, timeout_s, max_output, cwd=, user=, token=)` runs `/bin/sh -c command`
  through a launcher (limits, the drop to `run_as`: `inside.py`, or the compiled launcher or host
  tools where bwrap.py can)
  and kills the command's whole tree at the timeout or when it breaks a limit (`ExecResult.limit`
  says which). It starts in the workspace, or in `cwd` (a folder as the sandbox shows it: an
  image's `workdir`); it runs as the backend's user, or, in an image, as `user` (a name, uid,
  `name:group`; as `docker exec -u` takes it) where given. A backend that cannot honour either
  refuses the command (`SandboxError`). With the session's `token`, a sandbox without network
  (`relayed`) first hands the proxy a listener on 127.0.0.1:RELAY_PORT inside (the launcher's
  `--relay`, proxy/relay.py): the command reaches its proxy there (`proxy_url`); other commands
  (prepare, evaluators) do not.
- `workdir`: the image's WorkingDir where the sandbox runs an image ("/" where the image sets
  none, as a container starts there), else None.
- `upload(src, dest)` / `download(path, dest)` copy a file or folder into / out of the workspace
  with `files.copy` (no link followed, links kept as links, FIFOs and devices skipped), in a
  thread, within what is left of the disk limit; a path that leaves the workspace (`..`, absolute,
  through a link) is refused. `SandboxError` names what went wrong.
- Launching a command can fail (an argument or environment over the kernel's limit, a NUL byte, a
  bad environment name): `exec` raises `SandboxError` with the reason.
- `mounts` (in-sandbox absolute path -> a folder name under `root`): folders of the session made
  at start and shown at those paths where the backend can (`binds_mounts`; elsewhere a command
  finds them at their host folders: `seen_at(path)` says which). `put(path, src)` empties the
  folder mounted at `path` (whatever a command left there, no link followed) and copies the
  folder `src`'s contents in (e.g. the tests at /tests).
- `cancel()` kills every process of the sandbox now and returns True only when it could verify
  that none survives; `stop()` does the same, then removes the files and the cgroup.

Processes are found and killed by `processes.Processes`: the process groups of the commands
started, the environment marker `POLAR_SANDBOX_ID` every process inherits, and the sandbox's cgroup
when there is one (cgroups.py: `cgroups` owns it, `cgroups.local()` by default; each command joins
it before it starts, through the compiled launcher's `--join` where there is one; it also bounds the
sandbox's CPU, and is frozen and killed whole before the per-process kill; where no command can
leave it, `cgroup_sealed` (bwrap: every command joins it before bwrap starts, /sys is read-only
inside), its member list is complete and /proc is not scanned). Verification needs more than the
marker (a daemon may clear its environment): a cgroup, or a backend whose commands run in their
own PID namespace (`pid_namespace`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from polar_hpc.errors import PolarError
from polar_hpc.sandbox import files, launcher
from polar_hpc.sandbox import cgroups as cg
from polar_hpc.sandbox.inside import RELAY_TOKEN
from polar_hpc.sandbox.limits import Limits
from polar_hpc.sandbox.processes import MARKER, Processes, exited, kill_group, read_capped

RELAY_PORT = 47111  # where a harness without network finds its proxy: http://127.0.0.1:47111
INSIDE = Path(__file__).with_name("inside.py")
_WATCH_S = 0.5
log = logging.getLogger("polar_hpc.sandbox")


@dataclass
class ExecResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    limit: str | None = None  # the limit the command broke and was killed for


class SandboxError(PolarError):
    """The sandbox could not be started (a prepare command failed, a file is missing...)."""


class Sandbox:
    """Base class: workspace, limits and process bookkeeping; subclasses wrap command lines."""

    name = "base"
    pid_namespace = False  # each command runs in its own PID namespace, gone when it exits
    isolates_network = False  # network none/proxy-only get a network namespace of their own
    binds_mounts = False  # `mounts` are seen at their own paths (else at their host folders)
    cgroup_sealed = False  # no command can leave the sandbox's cgroup (its cgroup files are read-only inside)
    side_by_side = True  # a command may run while another does (not so where each mounts the same writable layer)
    python = sys.executable  # the sandbox's python3, which runs inside.py
    python_flags: tuple[str, ...] = ("-I", "-S")  # stdlib only: no site hook, no PYTHON* variable; starts faster
    inside = str(INSIDE)  # inside.py, as the sandbox sees it
    proxy_socket_inside = "/run/polar/proxy.sock"
    workdir: str | None = None  # the image's WorkingDir ("/" when unset) where the sandbox runs an image

    def __init__(
        self,
        root: Path,
        files: dict[str, str],
        prepare: list[str],
        network: str,
        *,
        limits: Limits = Limits(),
        proxy_socket: Path | None = None,
        image: str | None = None,
        gpus: bool = False,
        hidden: tuple[Path, ...] = (),
        cgroups: cg.Cgroups | None = None,
        mounts: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.workspace = root / "work"
        self.tmp = root / "tmp"
        self.files = files
        self.prepare = prepare
        self.network = network
        self.limits = limits
        self.proxy_socket = proxy_socket
        self.image = image
        self.gpus = gpus  # backends that cannot give GPUs ignore it
        self.hidden = hidden  # host folders the harness must not see (the run directory)
        self.mounts = {path: root / name for path, name in (mounts or {}).items()}
        self.marker = secrets.token_hex(8)
        self._cgroups = cgroups
        self._processes = Processes(self.marker, self.cgroup_sealed)

    @property
    def _cgroup(self) -> cg.Cgroup | None:
        return self._processes.cgroup

    @property
    def user_namespace(self) -> bool:
        """RLIMIT_NPROC inside counts only this sandbox's processes."""
        return False

    @property
    def relayed(self) -> bool:
        """The harness has no network of its own and reaches the proxy through a listener it hands over."""
        return self.network != "host" and self.proxy_socket is not None and self.isolates_network

    def proxy_url(self, host_url: str) -> str:
        """The proxy's base URL as the harness inside must use it."""
        return f"http://127.0.0.1:{RELAY_PORT}" if self.relayed else host_url

    async def start(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        for folder in self.mounts.values():
            folder.mkdir(parents=True, exist_ok=True)
        if self.limits.use_cgroup:
            self._processes.cgroup = (self._cgroups or cg.local()).create(f"sb-{self.marker}", self.limits)
        if self.limits.max_memory_bytes is not None and not self._memory_cgroup:
            log.warning("sandbox %s: no memory cgroup can be made here: its memory bound (%d bytes) is "
                        "RLIMIT_AS per process", self.marker, self.limits.max_memory_bytes)
        await self._launch()
        for dest, src in self.files.items():
            await self.upload(Path(src), dest)
        for command in self.prepare:
            result = await self.exec(command, env={}, timeout_s=600)
            if result.returncode != 0:
                tail = result.stderr[-2000:].decode(errors="replace")
                raise SandboxError(f"prepare command {command!r} exited {result.returncode}: {tail}")

    async def upload(self, src: Path, dest: str) -> None:
        """Copy the file or folder `src` to `dest` in the workspace."""
        await self._copy(f"upload {src} to {dest}", src.parent, src.name, self.workspace, dest)

    async def download(self, path: str, dest: Path) -> None:
        """Copy `path` (a file or folder) of the workspace to `dest` on the host."""
        await self._copy(f"download {path} to {dest}", self.workspace, path, dest.parent, dest.name)

    def seen_at(self, path: str) -> str:
        """Where a command of this sandbox finds the folder mounted at `path`."""
        return path if self.binds_mounts else str(self.mounts[path])

    async def put(self, path: str, src: Path | None) -> None:
        """Empty the folder mounted at `path`, then copy the contents of the folder `src` (if any) into it."""
        folder = self.mounts[path]
        await files.run(lambda: files.empty(folder), None)  # in place: a running command's bind still shows it
        if src is None:
            return
        for name in sorted(p.name for p in src.iterdir()):
            await self._copy(f"copy {src} to {path}", src, name, folder, name)

    async def exec(
        self, command: str, env: dict[str, str], timeout_s: float, max_output: int | None = None, *,
        cwd: str | None = None, user: str | None = None, token: str | None = None,
    ) -> ExecResult:
        """Run `command` (via /bin/sh -c) in the workspace (or `cwd`), as the image's `user` where
        given; kill its whole tree at the timeout."""
        cap = self.limits.max_output if max_output is None else max_output
        hits = self._processes.hits()
        relay = {RELAY_TOKEN: token} if token is not None and self.relayed else {}
        try:
            argv, environment = self._process(command, env | {MARKER: self.marker} | relay, cwd, user)
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.workspace,
                env=environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except (OSError, ValueError) as e:  # E2BIG, a NUL byte, a bad environment name...
            raise SandboxError(f"cannot launch the command: {getattr(e, 'strerror', None) or e}") from None
        self._processes.started(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None  # both are PIPE
        reads = asyncio.gather(read_capped(proc.stdout, cap), read_capped(proc.stderr, cap))
        timed_out, limit = False, None
        try:
            timed_out, limit = await self._watch(proc.pid, time.monotonic() + timeout_s, hits)
        finally:  # on timeout, cancellation, or children left behind by a command that exited
            kill_group(proc.pid)
        if limit:
            await self.cancel()
        try:
            out, err = await asyncio.wait_for(reads, 5.0)
        except asyncio.TimeoutError:  # an escaped process still holds the pipes
            out, err = b"", b"(output lost: a process outside the sandbox's group held it open)"
        returncode = await proc.wait()
        return ExecResult(returncode, out, err, timed_out, limit)

    async def cancel(self, timeout_s: float = 2.0) -> bool:
        """Kill every process of the sandbox now (its files stay until `stop`); True when it could
        verify that none survives."""
        await self._terminate()
        gone = await self._processes.reap(timeout_s)
        return gone and (self._cgroup is not None or self.pid_namespace)

    async def stop(self) -> bool:
        """`cancel`, then remove the sandbox's files and cgroup; True when no process of it can survive."""
        gone = await self.cancel(timeout_s=3.0)
        await self._remove()
        if self._cgroup is not None:
            gone = await asyncio.to_thread(self._cgroup.remove) and gone
        return gone

    # --- for backends ---------------------------------------------------------------------------

    async def _launch(self) -> None:
        """Backend hook: start whatever lives as long as the sandbox (a container instance)."""

    async def _terminate(self) -> None:
        """Backend hook: stop that; the base then kills every process it can find."""

    async def _remove(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.root, ignore_errors=True)

    def _wrap(self, argv: list[str], cwd: str | None = None, user: str | None = None) -> list[str]:
        """The host's command line that runs `argv` in this sandbox, in `cwd` as `user` (exec);
        ValueError where the backend cannot."""
        raise NotImplementedError

    def _process(self, command: str, env: dict[str, str], cwd: str | None = None,
                 user: str | None = None) -> tuple[list[str], dict[str, str]]:
        """The host's command line and environment that run `/bin/sh -c command` with `env` in this
        sandbox (with RELAY_TOKEN in `env`: hand the proxy a listener first); ValueError for what
        cannot be launched (a bad environment name, a user the image does not know)."""
        argv = self._wrap(self._launcher(["/bin/sh", "-c", command], RELAY_TOKEN in env), cwd, user)
        return self._joined(argv), self._environment(env)

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workspace),
            "TMPDIR": str(self.tmp),
            "LANG": "C.UTF-8",
        }
        return base | env

    # --- internals ------------------------------------------------------------------------------

    def _launcher(self, argv: list[str], relay: bool = False) -> list[str]:
        return [self.python, *self.python_flags, self.inside, *self._launch_options(relay), "--", *argv]

    def _launch_options(self, relay: bool = False) -> list[str]:
        """inside.py's options for this sandbox and command (backends add theirs in front)."""
        options = ["--fsize", str(self.limits.max_file_bytes)]
        if self.user_namespace:
            options += ["--nproc", str(self.limits.max_pids)]
        if self.limits.max_memory_bytes is not None and not self._memory_cgroup:
            options += ["--as", str(self.limits.max_memory_bytes)]
        if relay:
            options += ["--relay", f"{RELAY_PORT}={self.proxy_socket_inside}"]
        return options

    async def _watch(self, pid: int, deadline: float, hits: tuple[int, int]) -> tuple[bool, str | None]:
        """Wait for `pid` to exit or a limit to break: (timed out, the limit broken, if any).

        A command that exits after a fork failed at the pids limit, or after the OOM killer killed
        one of its processes at the memory cgroup's limit, is reported as breaking it.
        """
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True, None
            try:
                await asyncio.wait_for(exited(pid), min(left, _WATCH_S))
                return False, self._processes.broken(hits, self.limits)
            except asyncio.TimeoutError:
                pass
            if broken := self._processes.broken(hits, self.limits):
                return False, broken
            if await asyncio.to_thread(files.disk_usage, self.root) > self.limits.max_disk_bytes:
                return False, f"disk limit exceeded (max_disk_bytes={self.limits.max_disk_bytes})"

    async def _copy(self, what: str, src_root: Path, src: str, dst_root: Path, dst: str) -> None:
        """`files.copy` in a thread, bounded by what is left of the disk limit; stopped if cancelled."""
        stop = threading.Event()

        def copy() -> int:
            budget = self.limits.max_disk_bytes - files.disk_usage(self.root)
            return files.copy(src_root, src, dst_root, dst, budget, stop)

        try:
            await files.run(copy, timeout_s=None)
        except files.OverBudget as e:
            raise SandboxError(f"cannot {what}: {e} (max_disk_bytes={self.limits.max_disk_bytes})") from None
        except (files.FileError, OSError) as e:
            raise SandboxError(f"cannot {what}: {getattr(e, 'strerror', None) or e}") from None
        finally:
            stop.set()  # a cancelled copy stops at its next MiB

    def _joined(self, argv: list[str]) -> list[str]:
        """`argv` started in the sandbox's cgroup: by the compiled launcher where there is one, else a shell."""
        exe = launcher.path() if self._cgroup else None
        if exe is not None:
            assert self._cgroup is not None
            return [str(exe), *(a for f in self._cgroup.join_files() for a in ("--join", f)), "--", *argv]
        return self._cgroup.wrap(argv) if self._cgroup else argv

    @property
    def _memory_cgroup(self) -> bool:
        return self._cgroup is not None and self._cgroup.memory_bounded
