"""Who may send the orchestrator what: the dispatch table's entries, and refusals kept quiet.

A `Route` names the handler of one wire type, the peer roles (`polar_hpc.security.ROLES`) allowed
to send it, whether only a service run takes it, and whether its sender waits for an answer (then a
refusal is answered with `wire.Refused`). The orchestrator finds the route by the message's type,
so a message of a kind it does not take, or from a role that may not send it, never reaches a
handler. `Refusals` logs refused and malformed messages per peer: the first few, then every
power of two, so a hostile peer cannot fill the log.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("polar_hpc.orchestrator")

_REMEMBERED = 10_000  # peers whose refusals are counted; beyond, the count starts again


@dataclass(frozen=True)
class Route:
    handler: Callable  # (orchestrator, identity, message) -> the answer to send, or None
    roles: frozenset[str]
    service: bool = False  # only a service run takes it
    answered: bool = False  # the sender waits for one answer


class Refusals:
    def __init__(self) -> None:
        self.count: Counter[bytes] = Counter()

    def note(self, identity: bytes, why: str) -> None:
        if len(self.count) >= _REMEMBERED:
            self.count.clear()
        self.count[identity] += 1
        n = self.count[identity]
        if n <= 5 or n & (n - 1) == 0:
            log.warning("peer %s: %s (refusal %d from it)", identity.hex(), why, n)
