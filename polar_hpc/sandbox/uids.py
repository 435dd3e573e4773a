"""Host uids for a root gateway's sessions: one per live sandbox, never shared, from `sandbox.uid_range`.

`Uids(first, last)` hands out `Lease`s: a uid U of the range (gid U too) that no live sandbox of
any gateway on this node holds. A lease is an exclusive `flock` on `LOCK_DIR/U`, a folder that
only root can write (made 0700, refused unless root owns it and it is no link); the kernel drops
the lock when its holder's file is closed, by `release()` or by the holder's death (SIGKILL
included), so a crashed gateway frees its uids and two gateways on one node, of one run or of
two, never hold the same uid. A uid some process still runs as (a session's leftover, or a host
user given a uid of the range by mistake) is passed over. Each pool starts at a random place in
the range and moves on from the last uid it gave, so a just-freed uid is the last taken again.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
from pathlib import Path

from polar_hpc.errors import PolarError

LOCK_DIR = Path("/run/polar-hpc/uids")
NOBODY = 65534  # the shared overflow uid: never in a range


class UidsExhausted(PolarError):
    """Every uid of the range is held by a live sandbox (or runs a process)."""


class Lease:
    """A uid (and gid, the same number) held by one sandbox until `release()`."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid, self._fd = uid, fd

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.uid

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor of the lock file drops the flock
            self._fd = -1

    def __del__(self) -> None:
        self.release()


class Uids:
    """The uids `first`..`last` (inclusive) of one gateway; leases are exclusive node-wide."""

    def __init__(self, first: int, last: int, lock_dir: Path = LOCK_DIR) -> None:
        if not 0 < first <= last < (1 << 32) - 1 or first <= NOBODY <= last:
            raise ValueError(f"uid range {first}-{last}: must lie in 1..4294967294 and leave out {NOBODY}")
        self.first, self.last, self.lock_dir = first, last, lock_dir
        self._next = random.randrange(first, last + 1)

    def take(self) -> Lease:
        folder = self._folder()
        try:
            busy = _process_uids()
            size = self.last - self.first + 1
            for i in range(size):
                uid = self.first + (self._next - self.first + i) % size
                if uid in busy:
                    continue
                fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._next = self.first + (uid - self.first + 1) % size
                return Lease(uid, fd)
        finally:
            os.close(folder)
        raise UidsExhausted(f"sandbox.uid_range {self.first}-{self.last}: every uid is held by a live sandbox")

    def _folder(self) -> int:
        """The lock folder, opened; made 0700 by root where missing, refused unless root's and no link."""
        for parent in reversed((self.lock_dir, *self.lock_dir.parents)):
            try:
                os.mkdir(parent, 0o700 if parent == self.lock_dir else 0o755)
            except FileExistsError:
                pass
        fd = os.open(self.lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_mode & 0o022 or not stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise PermissionError(f"{self.lock_dir}: the uid lock folder must be root's and not writable by others")
        return fd


def _process_uids() -> set[int]:
    """The uids that own a process of this node now (a /proc/PID folder belongs to its task's euid)."""
    uids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uids.add(os.stat(f"/proc/{name}").st_uid)
            except OSError:
                pass
    return uids
