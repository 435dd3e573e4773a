"""Scheduling by credit: which gateway runs which session, and what becomes of its result.

A gateway registers (`hello`) and sends Credit, one unit per free INIT slot; each unit takes the
next queued session (journaled `assigned`, remembered with the newest weight version at its
dispatch); the sessions one Credit takes go out as one Assign. A Report is handled item by item,
in order, as if each had come alone. News of a session (SessionUpdate, Result) counts only from
the gateway running it; from any other peer it is refused and logged. The first result of a
(task, sample) is journaled `result`, `"stale": true` when more weight versions passed during it
than its batch allows; a `cancelled` result nobody asked for (its gateway stopped under it) is journaled
`interrupted` and the session runs again. A lost gateway's sessions go back to the front of the
queue as new attempts (`lose`), offered at once to every gateway with credit. Sessions cancelled on
purpose while running are asked of their gateway (`cancel_running`). A session the allocation's
end leaves no time for is not dispatched but journaled `held` (SessionTable: walltime admission).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from polar_hpc import wire
from polar_hpc.orchestrator.journal import Journal
from polar_hpc.orchestrator.peers import Refusals
from polar_hpc.orchestrator.service import Batches
from polar_hpc.orchestrator.sessions import FINAL, Session, SessionTable
from polar_hpc.orchestrator.status import Rate

log = logging.getLogger("polar_hpc.orchestrator")


@dataclass
class Gateway:
    gateway_id: str
    host: str = ""
    credit: int = 0
    sessions: set[str] = field(default_factory=set)


class Scheduler:
    def __init__(self, table: SessionTable, batches: Batches, journal: Journal, send: Callable[[bytes, wire.Message], None],
                 peers: wire.Liveness, refusals: Refusals, policy: Callable[[], str], stopping: asyncio.Event) -> None:
        self.table, self.batches, self.journal, self.send = table, batches, journal, send
        self.peers, self.refusals, self.policy, self.stopping = peers, refusals, policy, stopping
        self.gateways: dict[bytes, Gateway] = {}
        self.down: dict[str, wire.Member] = {}  # gateway id -> the gateway as last seen
        self.assigned_policy: dict[str, str] = {}  # running session -> the newest version at its dispatch
        self.cancelling: set[str] = set()  # running sessions cancelled on purpose
        self.rate = Rate()

    def hello(self, identity: bytes, msg: wire.Hello) -> None:
        self.gateways[identity] = Gateway(msg.gateway_id, msg.host)
        self.down.pop(msg.gateway_id, None)
        self.peers.heard(identity)
        self.journal.write("gateway_up", gateway=msg.gateway_id, host=msg.host, slots=msg.slots)

    def credit(self, identity: bytes, msg: wire.Credit) -> None:
        gw = self.gateways.get(identity)
        if gw is None:
            self.refusals.note(identity, "refused Credit: not a registered gateway")
            return
        gw.credit += max(0, msg.n)
        self._dispatch(identity, gw)

    def update(self, identity: bytes, msg: wire.SessionUpdate) -> None:
        if self._holder(identity, msg.session_id) is not None and self.table.update(msg.session_id, msg.state):
            self.journal.write("state", session=msg.session_id, state=msg.state)

    def report(self, identity: bytes, msg: wire.Report) -> None:
        for item in msg.items:
            _BY_KIND[type(item)](self, identity, item)

    def result(self, identity: bytes, msg: wire.Result) -> None:
        gw = self._holder(identity, msg.session_id)
        if gw is None:
            return
        gw.sessions.discard(msg.session_id)
        dispatched = self.assigned_policy.pop(msg.session_id, "")
        if msg.status == "cancelled" and msg.session_id not in self.cancelling:  # not the attempt that counts
            self.journal.write("interrupted", session=msg.session_id, reason="gateway stopped", shard=msg.shard)
            if not self.stopping.is_set():
                self._requeue(msg.session_id)
                self.dispatch_all()
            return
        s = self.table.finish(msg)
        if s is not None:  # the first result of a (task, sample): the attempt that counts
            self.rate.note()
            stale = self.batches.is_stale(s.task.id, dispatched, self.policy())
            self.journal.write(
                "result", session=msg.session_id, task=s.task.id, sample=s.sample_index, attempt=s.attempt,
                status=msg.status, reward=msg.reward, shard=msg.shard, n_tokens=msg.n_tokens,
                **({"stale": True} if stale else {}),
            )

    def cancel_running(self, s: Session) -> None:
        if s.gateway is not None and s.session_id not in self.cancelling:
            self.cancelling.add(s.session_id)
            self.send(s.gateway, wire.Cancel(session_id=s.session_id))

    def dispatch_all(self) -> None:
        for identity, gw in list(self.gateways.items()):
            if gw.credit:
                self._dispatch(identity, gw)

    def lose(self, identity: bytes) -> None:
        gw = self.gateways.pop(identity)
        self.peers.forget(identity)
        log.warning("gateway %s is silent; requeueing %d sessions", gw.gateway_id, len(gw.sessions))
        self.journal.write("gateway_lost", gateway=gw.gateway_id)
        self.down[gw.gateway_id] = wire.Member("gateway", gw.gateway_id, gw.host, False, detail="silent")
        for sid in gw.sessions:
            self._requeue(sid)
        self.dispatch_all()  # once for them all: no scan of the gateways per session

    def members(self) -> list[wire.Member]:
        up = [wire.Member("gateway", g.gateway_id, g.host, True, len(g.sessions)) for g in self.gateways.values()]
        return up + list(self.down.values())

    def _holder(self, identity: bytes, session_id: str) -> Gateway | None:
        """The registered gateway `identity` if it runs `session_id`; None (refused) otherwise."""
        gw = self.gateways.get(identity)
        if gw is None or session_id not in gw.sessions:
            self.refusals.note(identity, f"refused news of session {session_id!r}: not a gateway running it")
            return None
        return gw

    def _requeue(self, session_id: str) -> None:
        s = self.table.sessions.get(session_id)
        if s is None or s.state in FINAL:
            return
        self.assigned_policy.pop(session_id, None)
        s = self.table.requeue(session_id)
        self.journal.write("requeued", session=s.session_id, previous=session_id, attempt=s.attempt)

    def _dispatch(self, identity: bytes, gw: Gateway) -> None:
        specs = self.table.take(identity, gw.credit)
        if self.table.newly_held:
            self.journal.write_many("held", ({"session": s.session_id, "timeout_s": s.task.timeout_s,
                                              "expected_s": self.table.durations.expected(s.task),
                                              "until": self.table.admit_until, "state": s.state}
                                             for s in self.table.newly_held))
            self.table.newly_held.clear()
        for s in self.table.unsendable:
            error = self.table.results[(s.task.id, s.sample_index)].error
            log.error("session %s: %s", s.session_id, error)
            self.journal.write("result", session=s.session_id, task=s.task.id, sample=s.sample_index,
                               attempt=s.attempt, status="error", reward=None, shard="", n_tokens=0, error=error)
        self.table.unsendable.clear()
        if not specs:
            return
        gw.credit -= len(specs)
        policy = self.policy()
        for spec in specs:
            gw.sessions.add(spec.session_id)
            self.assigned_policy[spec.session_id] = policy
        self.journal.write_many("assigned", ({"session": spec.session_id, "gateway": gw.gateway_id,
                                              "attempt": spec.attempt} for spec in specs))
        self.send(identity, wire.Assign(sessions=specs))


_BY_KIND: dict[type, Callable[[Scheduler, bytes, Any], None]] = {
    wire.Credit: Scheduler.credit, wire.SessionUpdate: Scheduler.update, wire.Result: Scheduler.result}
