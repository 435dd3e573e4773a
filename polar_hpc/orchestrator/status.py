"""The run's status as a client sees it (StatusReply), and the rate sessions end at.

`Rate` remembers when sessions ended over the last minute (nothing older is kept): `per_s()` is
the run's sessions per second, from which StatusReply's ETA and a Busy answer's retry_after come.
`reply` puts together the session table's counts, every member (engines up, gateways up with
their load, members lost or gone), the newest weight version of each session in flight, and
whether the run is done: a service run only once it drains and every session has ended.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from polar_hpc import wire
from polar_hpc.orchestrator.sessions import SessionTable

WINDOW_S = 60.0


class Rate:
    def __init__(self) -> None:
        self._ended: deque[float] = deque()

    def note(self) -> None:
        self._ended.append(time.monotonic())
        self._forget()

    def per_s(self) -> float:
        self._forget()
        return len(self._ended) / WINDOW_S

    def _forget(self) -> None:
        now = time.monotonic()
        while self._ended and now - self._ended[0] > WINDOW_S:
            self._ended.popleft()


def reply(table: SessionTable, gateways: int, members: list[wire.Member], rate: float,
          assigned_policy: dict[str, str], draining: bool | None) -> wire.StatusReply:
    """`draining`: None in a batch run; in a service run, whether a trainer has sent Drain."""
    status = table.status(gateways, members, rate)
    status.versions_in_flight = dict(Counter(assigned_policy.values()))
    if draining is not None:
        status.done = status.done and draining
    return status
