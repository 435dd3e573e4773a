"""Liveness: the orchestrator's heartbeats to its members, and the members gone silent.

Members are the registered gateways and engines. Every message a member sends counts as a sign of
life (`heard`: a peer that never registered is not tracked, so no stranger fills the table; an engine lost to
silence is registered again when heard, a gateway is not: its sessions already run elsewhere); each
`beat` sends every member a Heartbeat and hands each member silent for longer than
`gateway.peer_timeout_s` to the part that registered it: a gateway to the scheduler (its sessions
run again elsewhere), an engine to the registry (it leaves the engine list).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from polar_hpc import wire
from polar_hpc.orchestrator.registry import Registry
from polar_hpc.orchestrator.scheduling import Scheduler


class Watch:
    def __init__(self, peers: wire.Liveness, scheduler: Scheduler, registry: Registry,
                 send: Callable[[bytes, wire.Message], None]) -> None:
        self.peers, self.scheduler, self.registry, self.send = peers, scheduler, registry, send

    def members(self) -> list[bytes]:
        return list(self.scheduler.gateways) + list(self.registry.engines)

    def heard(self, identity: bytes) -> None:
        if identity in self.scheduler.gateways or identity in self.registry.engines or self.registry.back(identity):
            self.peers.heard(identity)

    def beat(self) -> None:
        beat = wire.Heartbeat(sender="orchestrator", t=time.time())
        for identity in self.members():
            self.send(identity, beat)
        for identity in self.peers.lost():
            if identity in self.registry.engines:
                self.registry.lose(identity, "silent")
            else:
                self.scheduler.lose(identity)
