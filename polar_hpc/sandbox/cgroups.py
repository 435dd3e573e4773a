"""Per-sandbox cgroups: a process, CPU and memory bound, and a kill that a fork bomb cannot outrun.

Layout: `polar-hpc/OWNER/sb-MARKER` in each cgroup v1 hierarchy used (`pids`, and where mounted
`cpu` and `freezer`), or in a cgroup v2 tree with the pids (and cpu) controller available. OWNER is
`RUN.PID.START`: the run (`run_key`, a hash of a gateway's run directory; `local` outside a gateway),
the owning process's pid and its start time, so an owner that died is recognised even if its pid
was reused. What each sandbox gets:
- processes: `pids.max` = max_pids (`pids.events` counts the forks refused);
- CPU: a quota of `max_cpus` CPUs (v1 `cpu.cfs_quota_us`, v2 `cpu.max`), and all sandboxes
  together weigh, per CPU, as much as one session of processes outside `polar-hpc` (the gateway,
  its proxy: each in its own session, so its own autogroup), however many sandboxes and processes
  spin (each bwrap command used to be an autogroup of its own, so N spinning sandboxes outweighed
  the gateway N to 1);
- memory (only for a sandbox with `max_memory_bytes`): v1 `memory.limit_in_bytes` (and
  `memory.memsw.limit_in_bytes` where swap is accounted), in `polar-hpc/OWNER/sb-MARKER` NESTED
  under the memory cgroup the creating process itself is in (as /proc/self/cgroup names it), so a
  sandbox's memory still counts against the gateway's own group and the machine's accounting;
  the OOM killer acts inside it, and `oom_kills()` counts its kills. Without a v1 memory hierarchy
  (cgroup v2: its tree here sits at the root) or where the folder cannot be made or bounded,
  `memory_bounded` is False and the sandbox falls back to RLIMIT_AS (base.py);
- `wrap(argv)`: a command that joins the cgroup, then execs `argv` (a shell does it, so no Python
  runs between fork and exec in the gateway, which has threads). In v1 the shell (one thread)
  writes 0, itself, to each `tasks` file: moving one's own thread skips the kernel's global
  threadgroup lock, whose write side waits an RCU grace period (5 ms here) holding the cgroup
  mutex, which every cgroup mkdir and freeze of the node then waits for; v2 has only
  `cgroup.procs`;
- `kill()`: freeze (v1 freezer; v2 `cgroup.kill`, else `cgroup.freeze`), SIGKILL every member,
  thaw: every member dies, none forks meanwhile.
`Cgroups.close()` (a gateway's exit, by any path) kills and removes every sandbox cgroup of its
owner; `sweep()` (a gateway's start) does the same for the owners of the same run whose process is
gone, never another run's. Only pids is required: without a usable pids hierarchy (not root and
no delegation, as on clusters) `create` returns None and RLIMIT_NPROC is the process bound left.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from polar_hpc.sandbox.limits import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "polar-hpc"
SWEEP_S = 15.0  # a dead owner's processes, killed at a start, may take this long to be reaped on a busy node
SESSION_WEIGHT = {False: 1024, True: 100}  # a nice-0 session's (autogroup's) v1 cpu.shares, v2 cpu.weight
_JOIN = 'for f; do [ "$f" = -- ] && break; echo 0 > "$f" || exit 126; shift; done; shift; exec "$@"'
_PERIOD_US = 100_000


@dataclass(frozen=True)
class _Tree:
    root: Path  # a v1 hierarchy's mount, or a v2 tree's root
    controllers: tuple[str, ...]  # what it bounds here, among pids, cpu, freezer, memory
    v2: bool


def _trees() -> list[_Tree]:
    """The hierarchies a sandbox's cgroups go in: v1 pids (+ cpu, freezer, memory), else a v2 tree with pids."""
    v1 = [_Tree(CGROUP_ROOT / c, (c,), False) for c in ("pids", "cpu", "freezer")]
    v1 = [t for t in v1 if (t.root / "cgroup.procs").exists()]
    if v1 and v1[0].controllers == ("pids",):
        own = _own_group("memory")
        memory = [_Tree(CGROUP_ROOT / "memory" / own, ("memory",), False)] if own is not None else []
        return v1 + [t for t in memory if (t.root / "cgroup.procs").exists()]
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        try:
            available = (root / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if "pids" in available:
            return [_Tree(root, tuple(c for c in ("pids", "cpu") if c in available), True)]
    return []


def run_key(run_dir: Path) -> str:
    """The RUN part of an owner's name: the same for every gateway of a run, different across runs."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]


class Cgroup:
    """One sandbox's cgroups: a folder of the same name in each tree."""

    def __init__(self, folders: list[tuple[_Tree, Path]]) -> None:
        self.folders = folders
        self.path = self._folder("pids")

    def _folder(self, controller: str) -> Path | None:
        return next((f for t, f in self.folders if controller in t.controllers), None)

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started in the cgroup (so is every descendant); exit 126 if it cannot join."""
        return ["/bin/sh", "-c", _JOIN, "join", *self.join_files(), "--", *argv]

    def join_files(self) -> list[str]:
        """The files a process writes 0 to, to join this cgroup (one per hierarchy)."""
        return [str(f / _join_file(t)) for t, f in self.folders]

    def pids(self) -> list[int]:
        if self.path is None:  # a folder half removed by an earlier close
            return []
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    @property
    def memory_bounded(self) -> bool:
        return self._folder("memory") is not None

    def oom_kills(self) -> int:
        """How many processes the OOM killer has killed in it for its memory limit so far."""
        folder = self._folder("memory")
        fields = _read(folder / "memory.oom_control").split() if folder else []
        return int(fields[fields.index("oom_kill") + 1]) if "oom_kill" in fields[:-1] else 0

    def pids_limit_hits(self) -> int:
        """How many forks the pids limit has refused so far."""
        if self.path is None:
            return 0
        try:
            events = (self.path / "pids.events").read_text().split()
        except OSError:
            return 0
        return int(events[1]) if len(events) >= 2 else 0

    def kill(self, timeout_s: float = 3.0) -> bool:
        """SIGKILL every process in it, frozen first so none forks meanwhile; True once it is empty."""
        if not self.pids():  # the usual end: the command's PID namespace took every process with it
            return True
        deadline = time.monotonic() + timeout_s
        thaw = self._freeze(deadline)
        for pid in self.pids():
            sigkill(pid)
        if thaw is not None:
            _write(thaw[0], thaw[1])
        while pids := self.pids():
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                sigkill(pid)
            time.sleep(0.01)
        return True

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Remove its folders; each stays busy until its last (zombie) process is reaped."""
        deadline = time.monotonic() + timeout_s
        left = [f for _, f in self.folders]
        while left := [f for f in left if not _rmdir(f)]:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _freeze(self, deadline: float) -> tuple[Path, str] | None:
        """Stop every member (v2 `cgroup.kill` kills them outright); the file and text that thaw."""
        for tree, folder in self.folders:
            if tree.v2 and _write(folder / "cgroup.kill", "1"):
                return None
            if tree.v2 and _write(folder / "cgroup.freeze", "1"):
                return folder / "cgroup.freeze", "0"
            if "freezer" in tree.controllers and _write(folder / "freezer.state", "FROZEN"):
                wait_until = min(deadline, time.monotonic() + 1.0)  # a task in D state may never freeze
                while _read(folder / "freezer.state") == "FREEZING" and time.monotonic() < wait_until:
                    time.sleep(0.005)
                return folder / "freezer.state", "THAWED"
        return None


class Cgroups:
    """The folder (`polar-hpc/OWNER` in each tree) holding one process's sandbox cgroups."""

    def __init__(self, run: str = "local") -> None:
        self.run = run
        self.owner = f"{run}.{os.getpid()}.{_start_time(os.getpid())}"
        self._trees: list[_Tree] | None = None  # found at the first create: they do not change
        self._prepared: set[Path] = set()  # owner folders made (a sweep that removed one: made again)

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        """A new cgroup `name` bounded by `limits`, or None when no pids cgroup can be made here."""
        folders: list[tuple[_Tree, Path]] = []
        if self._trees is None:
            self._trees = _trees()
        for tree in self._trees:
            if "memory" in tree.controllers and limits.max_memory_bytes is None:
                continue
            folder = tree.root / PARENT / self.owner / name
            try:
                if folder.parent not in self._prepared:
                    _prepare(tree, folder.parent)
                    self._prepared.add(folder.parent)
                try:
                    folder.mkdir()
                except FileNotFoundError:  # its owner folder was removed since
                    _prepare(tree, folder.parent)
                    folder.mkdir()
            except OSError:
                if "pids" in tree.controllers:
                    return None
                continue
            folders.append((tree, folder))
            if not _bound(tree, folder, limits):
                if "pids" in tree.controllers:
                    Cgroup(folders).remove()
                    return None
                Cgroup([folders.pop()]).remove()  # an unbounded memory folder: RLIMIT_AS instead
        return Cgroup(folders) if folders else None

    def close(self) -> int:
        """Kill every process of this owner's sandboxes, remove their cgroups; how many were killed."""
        return _close(self.owner)

    def sweep(self, *, live_too: bool = False) -> list[str]:
        """Close the owners of this run whose process is gone (every other one with `live_too`)."""
        owners = set()
        for tree in _trees():
            try:
                owners |= {e.name for e in os.scandir(tree.root / PARENT) if e.is_dir()}
            except OSError:
                continue
        swept = []
        for owner in sorted(owners - {self.owner}):
            run, _, rest = owner.partition(".")
            pid, _, start = rest.partition(".")
            if run != self.run or not pid.isdigit():
                continue
            if live_too or _start_time(int(pid)) != start:
                _close(owner, SWEEP_S)
                swept.append(owner)
        return swept


@functools.cache
def local() -> Cgroups:
    """The owner of sandboxes made outside a gateway (tests, tools): closed when this process exits."""
    owner = Cgroups()
    atexit.register(owner.close)
    return owner


def _close(owner: str, timeout_s: float = 3.0) -> int:
    folders = [(tree, tree.root / PARENT / owner) for tree in _trees()]
    names = set()
    for _, folder in folders:
        try:
            names |= {e.name for e in os.scandir(folder) if e.is_dir()}
        except OSError:
            pass
    cgroups = [Cgroup([(t, f / name) for t, f in folders if (f / name).is_dir()]) for name in sorted(names)]
    killed = sum(len(c.pids()) for c in cgroups)
    for cgroup in cgroups:
        cgroup.kill()
    deadline = time.monotonic() + timeout_s  # a zombie not yet reaped by its parent keeps its folder busy
    for cgroup in cgroups:
        cgroup.remove(max(0.0, deadline - time.monotonic()))
    Cgroup(folders).remove(timeout_s=0)
    return killed


def _prepare(tree: _Tree, owner: Path) -> None:
    """Make `polar-hpc` (weighing one session per CPU) and the owner's folder; v2: pass the controllers down."""
    for folder in (tree.root, owner.parent, owner):
        folder.mkdir(exist_ok=True)
        if tree.v2:
            for c in tree.controllers:
                _write(folder / "cgroup.subtree_control", "+" + c)
    if "cpu" in tree.controllers:
        weight = min(10_000, SESSION_WEIGHT[tree.v2] * len(os.sched_getaffinity(0)))
        _write(owner.parent / ("cpu.weight" if tree.v2 else "cpu.shares"), str(weight))


def _bound(tree: _Tree, folder: Path, limits: Limits) -> bool:
    """Write the sandbox's bounds; False when its process (or memory) bound cannot be set."""
    if "memory" in tree.controllers:
        limit = str(limits.max_memory_bytes)  # memsw (memory + swap) may not be below it: set it second
        memsw = folder / "memory.memsw.limit_in_bytes"
        return _write(folder / "memory.limit_in_bytes", limit) and (not memsw.exists() or _write(memsw, limit))
    if "cpu" in tree.controllers:
        quota = max(1000, int(limits.max_cpus * _PERIOD_US))
        if tree.v2:
            _write(folder / "cpu.max", f"{quota} {_PERIOD_US}")
        else:
            _write(folder / "cpu.cfs_period_us", str(_PERIOD_US))
            _write(folder / "cpu.cfs_quota_us", str(quota))
    return "pids" not in tree.controllers or _write(folder / "pids.max", str(limits.max_pids))


def _join_file(tree: _Tree) -> str:
    return "cgroup.procs" if tree.v2 else "tasks"


def _own_group(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of `controller`, relative ('' at the root), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return None


def _start_time(pid: int) -> str:
    """Process `pid`'s start time (clock ticks since boot), or '' when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _rmdir(folder: Path) -> bool:
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
