"""Who a harness runs as on the host: never root. `RunsAs` is the base of the container backends.

A gateway that is not root runs harnesses as its own user (in user and PID namespaces, without
capabilities: other processes of that uid are the user's own, who is trusted with its run's
secrets; a session sees no other session's process). A gateway running as root (as in CI) runs
each sandbox as its own host uid:gid U:U, leased at `start()` from `sandbox.uid_range`
(uids.py: never two live sandboxes of the node on one uid, whichever gateway holds them) and
given back at `stop()` once no process of it can survive (an unverified teardown keeps it until
the gateway exits); so no session, and no host process of another uid (65534 included), can read
a session's /proc/PID/environ (its proxy token) or its files. Each backend says how it drops
(bwrap: the compiled launcher, setpriv or `inside.py --user`; apptainer: `--security uid:N,gid:N`). The sandbox's tmp
and /dev/shm folders are given to that user at start, and its workspace and `mounts`, with all the
gateway put there (uploads, a harness's config files), before each command; never following a
link. No process of a sandbox runs between two of its commands (each command's PID namespace
dies with it; but for a harness command held for its tests, gateway/held.py, whose processes may:
the walk, an fwalk with chown never following a link, stays safe against a path swapped under
it), and a hard link can only name a file of the workspace itself (link(2) does not cross the
workspace's bind mount).
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

from polar_hpc.config import UID_RANGE
from polar_hpc.sandbox.base import ExecResult, Sandbox, SandboxError
from polar_hpc.sandbox.uids import Lease, Uids, UidsExhausted

NOBODY = (65534, 65534)  # the owner of a root pull's image cache entries (suites/images.py)


def give(path: Path, uid: int, gid: int) -> None:
    """Make `path` and everything under it owned by uid:gid, never following a symbolic link."""
    os.chown(path, uid, gid, follow_symlinks=False)
    if path.is_symlink() or not path.is_dir():
        return
    for _, dirs, files, fd in os.fwalk(path):  # fwalk does not follow links, even swapped in later
        for name in dirs + files:
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)


class RunsAs(Sandbox):
    """A sandbox whose commands run as its own leased uid (`run_as`) when the gateway is root;
    `shm` is its /dev/shm, a folder of the sandbox (on disk, counted in the disk limit, unlike a
    RAM tmpfs)."""

    def __init__(self, *args, uids: Uids | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.privileged = os.geteuid() == 0
        self.uids = uids
        self.lease: Lease | None = None
        self.run_as = NOBODY  # until start() leases this sandbox's own uid (a root gateway)
        self.shm = self.root / "shm"

    @property
    def user_namespace(self) -> bool:  # as root, commands run as `run_as` outside any user namespace
        return not self.privileged

    def _launch_options(self, relay: bool = False) -> list[str]:
        options = super()._launch_options(relay)
        if not self.user_namespace and self._cgroup is None:  # the one bound left: run_as is this sandbox's alone
            options[:0] = ["--nproc", str(self.limits.max_pids)]
        return options

    async def _launch(self) -> None:
        if self.privileged and self.lease is None:
            pool = self.uids or local_uids()
            try:
                lease = pool.quick()
                if lease is None:  # take() may read /proc: not on the loop
                    lease = await asyncio.to_thread(pool.take)
            except (UidsExhausted, OSError) as e:
                raise SandboxError(f"no host uid for the sandbox: {e}") from None
            self.lease, self.run_as = lease, lease.ids
        for folder in (self.workspace, self.tmp, self.shm, *self.mounts.values()):
            folder.mkdir(parents=True, exist_ok=True)
            if self.privileged:
                give(folder, *self.run_as)

    async def exec(
        self, command: str, env: dict[str, str], timeout_s: float, max_output: int | None = None, *,
        cwd: str | None = None, user: str | None = None, token: str | None = None,
    ) -> ExecResult:
        if self.privileged:  # what the gateway put there since (uploads, a harness's config files)
            for folder in (self.workspace, *(m for m in self.mounts.values() if m.is_dir())):
                give(folder, *self.run_as)
            socket = self.proxy_socket
            if self.relayed and socket is not None and socket.exists():  # connectable; its host folder stays closed
                socket.chmod(0o666)
        return await super().exec(command, env, timeout_s, max_output, cwd=cwd, user=user, token=token)

    async def stop(self) -> bool:
        gone = await super().stop()
        if gone and self.lease is not None:  # else kept (a process of its uid may live) until the gateway exits
            self.lease.release()
            self.lease = None
        return gone


@functools.cache
def local_uids() -> Uids:
    """The pool of the default `sandbox.uid_range` for sandboxes made without a gateway's (tests, bench)."""
    return Uids(*UID_RANGE)
