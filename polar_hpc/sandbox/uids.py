"""Host uids for a root gateway's sessions: one per live sandbox, never shared, from `sandbox.uid_range`.

`Uids(first, last)` hands out `Lease`s: a uid U of the range (gid U too) that no live sandbox of
any gateway on this node holds. A lease is an exclusive `flock` on `LOCK_DIR/U`, a folder that
only root can write (made 0700, refused unless root owns it and it is no link); the kernel drops
the lock when its holder's file is closed, by `release()` or by the holder's death (SIGKILL
included), so a crashed gateway frees its uids and two gateways on one node, of one run or of
two, never hold the same uid. A uid some process still runs as (a session's leftover, or a host
user given a uid of the range by mistake) is passed over. A leftover can only outlive a holder
that ended without `release()` (called once none of the sandbox's processes can survive): the
lock file says "held" while leased and is emptied by `release()`, so a uid whose file still says
"held" is taken only after a read of /proc made with its lock held. Otherwise the last read of
/proc (at most SCAN_S old: it also finds a host user's processes) decides, so most leases read no
/proc: `quick()` (no wait; None where a read is due) then `take()` (which reads where needed).
Each pool starts at a random place in the range and moves on from the last uid it gave, so a
just-freed uid is the last taken again.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
import time
from pathlib import Path

from polar_hpc.errors import PolarError

LOCK_DIR = Path("/run/polar-hpc/uids")
NOBODY = 65534  # the shared overflow uid: never in a range
SCAN_S = 10.0  # how old a read of /proc may be for a uid its last holder released
HELD = b"held"  # a lock file's content while leased


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
        """Give the uid back: call it only once no process of the sandbox can survive."""
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)  # released: no leftover to look for
            self._drop()

    def _drop(self) -> None:
        os.close(self._fd)  # closing the only descriptor of the lock file drops the flock
        self._fd = -1

    def __del__(self) -> None:  # a lease never released (its file says "held"): the next taker reads /proc
        if self._fd >= 0:
            self._drop()


class Uids:
    """The uids `first`..`last` (inclusive) of one gateway; leases are exclusive node-wide."""

    def __init__(self, first: int, last: int, lock_dir: Path = LOCK_DIR) -> None:
        if not 0 < first <= last < (1 << 32) - 1 or first <= NOBODY <= last:
            raise ValueError(f"uid range {first}-{last}: must lie in 1..4294967294 and leave out {NOBODY}")
        self.first, self.last, self.lock_dir = first, last, lock_dir
        self._next = random.randrange(first, last + 1)
        self._busy: set[int] = set()  # the uids processes ran as at the last read of /proc
        self._read_at = float("-inf")  # when that was

    def quick(self) -> Lease | None:
        """A lease taken without reading /proc (a few file operations: no wait), or None where a read
        is due (`take()` then)."""
        if time.monotonic() - self._read_at > SCAN_S:
            return None
        return self._lease(quick=True)

    def take(self) -> Lease:
        """A lease, reading /proc where it is due (UidsExhausted when no uid is free)."""
        started = time.monotonic()
        if started - self._read_at > SCAN_S:
            self._read()
        lease = self._lease(quick=False)
        if lease is None and self._read_at < started:  # a uid passed over for an older read may be free now
            self._read()
            lease = self._lease(quick=False)
        if lease is None:
            raise UidsExhausted(f"sandbox.uid_range {self.first}-{self.last}: every uid is held by a live sandbox")
        return lease

    def _read(self) -> None:
        self._busy, self._read_at = _process_uids(), time.monotonic()

    def _lease(self, quick: bool) -> Lease | None:
        """The first free uid from `_next` on; with `quick`, None at one whose file says "held"."""
        folder = self._folder()
        try:
            size = self.last - self.first + 1
            for i in range(size):
                uid = self.first + (self._next - self.first + i) % size
                if uid in self._busy:
                    continue
                fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if os.pread(fd, len(HELD), 0) == HELD:  # its holder ended without release()
                    if quick:
                        os.close(fd)
                        return None
                    self._read()  # with its lock held: no new process of it can start
                    if uid in self._busy:
                        os.close(fd)
                        continue
                os.pwrite(fd, HELD, 0)
                self._next = self.first + (uid - self.first + 1) % size
                return Lease(uid, fd)
        finally:
            os.close(folder)
        return None

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
