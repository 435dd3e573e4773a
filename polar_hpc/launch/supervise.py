"""The one supervisor of a run's processes: `polar-hpc run` (launch/local.py) and the Slurm driver
(launch/driver.py) both start, watch, restart and stop their children through it.

Each caller supplies what differs: how a member is (re)started (`start`, returning a procs.Child)
and how many restarts it may use (0 in a local run: any exit ends the run; `slurm.step_restarts`
for the driver's srun steps). `add` starts a member at once; `poll` notes every member that
exited: with restarts left it is started again after a backoff (1, 2, 4… s, at most 30), else it
is given up. A member added with `done_on_success` (the grow job's gateways, launch/member.py: one
that exits 0 was let go by its orchestrator) is not restarted after exit code 0 but `finished`.
`check` raises ChildFailed for the first member given up (its exit code and log
tail); `given_up(prefix)` says whether every member so named is. `stop(grace_s, wait_s)` gives the
members that end by themselves once the run is shut down (`ends_itself`) up to `wait_s` to do so,
then sends SIGTERM to everyone left at once and SIGKILL after `grace_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from polar_hpc import procs
from polar_hpc.errors import ChildFailed

MAX_BACKOFF_S = 30.0


@dataclass
class _Member:
    name: str
    start: Callable[[], procs.Child]
    restarts: int  # how many restarts it may use
    ends_itself: bool
    done_on_success: bool = False
    done: bool = False  # exited 0 with done_on_success: not restarted, not a failure
    child: procs.Child | None = None
    used: int = 0  # restarts used
    due: float = 0.0  # monotonic time of its next start
    failure: str = ""  # why it was given up


class Supervisor:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say  # one line per exit, restart and give-up
        self.members: list[_Member] = []

    def add(self, name: str, start: Callable[[], procs.Child], restarts: int = 0,
            ends_itself: bool = True, done_on_success: bool = False) -> procs.Child:
        """Start a member now; it is watched from the next `poll` on."""
        child = start()
        self.members.append(_Member(name, start, restarts, ends_itself, done_on_success, child=child))
        return child

    def poll(self) -> None:
        now = time.monotonic()
        for m in self.members:
            if m.child is not None and not (m.failure or m.done) and m.child.proc.poll() is not None:
                self._exited(m, now)
            if m.child is None and now >= m.due:
                m.child = m.start()

    def _exited(self, m: _Member, now: float) -> None:
        assert m.child is not None
        code = m.child.proc.returncode
        if code == 0 and m.done_on_success:
            m.done = True
            self.say(f"{m.name} exited with code 0: done")
            return
        if m.used >= m.restarts:  # kept as its child, so that `stop` still ends what its group left
            m.failure = f"{m.name} exited with code {code} (log {m.child.log}):\n{m.child.tail()}"
            self.say(f"{m.name} exited with code {code}" + (f"; not restarted ({m.restarts} restarts used)"
                                                          if m.restarts else ""))
            return
        m.child = None
        delay = min(MAX_BACKOFF_S, 2.0 ** m.used)
        m.used += 1
        m.due = now + delay
        self.say(f"{m.name} exited with code {code}; restart {m.used} in {delay:.0f}s")

    def check(self) -> None:
        """Raise ChildFailed for the first member given up."""
        self.poll()
        for m in self.members:
            if m.failure:
                raise ChildFailed(m.failure)

    def given_up(self, prefix: str) -> bool:
        """Whether every member whose name starts with `prefix` has used its restarts and exited."""
        named = [m for m in self.members if m.name.startswith(prefix)]
        return bool(named) and all(m.failure for m in named)

    def finished(self, prefix: str) -> bool:
        """Whether a member whose name starts with `prefix` ended with exit code 0 (`done_on_success`)."""
        return any(m.done for m in self.members if m.name.startswith(prefix))

    def stop(self, grace_s: float, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        for m in self.members:
            if m.child is not None and m.ends_itself:
                m.child.wait_exit(max(0.0, deadline - time.monotonic()))
        procs.stop([m.child for m in self.members if m.child is not None], grace_s)
