"""Scheduling by credit: which gateway runs which session, and what becomes of its result.

A gateway registers (`hello`) and sends Credit, one unit per free INIT slot; each unit takes the
next queued session (journaled `assigned`, remembered with the newest weight version at its
dispatch); the sessions one Credit takes go out as one Assign. A Report is handled item by item,
in order, as if each had come alone. News of a session (SessionUpdate, Result) counts only from
the gateway running it; from any other peer it is refused and logged. The first result of a
(task, sample) is journaled `result`, `"stale": true` when more weight versions passed during it
than its batch allows; a `cancelled` result nobody asked for (its gateway stopped under it) is journaled
`interrupted` and the session runs again. A lost gateway's sessions go back to the front of the
queue as new attempts (`lose`), offered at once to every gateway with credit. A session cancelled
on purpose (`cancel`) ends at once if it had not started (journaled as a `cancelled` result), else
it is asked of its gateway; one cancelled on purpose is never run again, even if its gateway is lost.
A session the allocation's end leaves no time for is not dispatched but journaled `held`
(SessionTable: walltime admission). Early acceptance (groups.py): a result that decides its task's
group is followed by a `decided` event (task, accepted, cancelled, reason) and the tail is
cancelled; a tail session's result is journaled `cancelled` with no shard (`written`: where its
gateway put its record), whatever it reports, so no reader ever takes it; `decide_due` (each tick)
decides the groups whose grace has passed; `resume` applies an earlier life's decisions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from polar_hpc import wire
from polar_hpc.config import Task
from polar_hpc.orchestrator.groups import Groups
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
        self.groups = Groups()
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
        self.cancelling.discard(msg.session_id)
        s = self.table.sessions.get(msg.session_id)
        extra: dict[str, Any] = {}
        if s is not None and self.groups.cut(s.task.id, s.sample_index):  # a decided group's tail
            extra = {"written": msg.shard, "reported": msg.status}
            msg = msgspec.structs.replace(msg, status="cancelled", reward=None, shard="")
        s = self.table.finish(msg)
        if s is None:  # not the first result of its (task, sample)
            return
        self.rate.note()
        if self.batches.is_stale(s.task.id, dispatched, self.policy()):
            extra["stale"] = True
        self._journal_result(s, msg.status, msg.reward, msg.shard, msg.n_tokens, **extra)
        if msg.status != "cancelled" and (group := self.groups.finished(s.task, s.sample_index, time.time())):
            self._decide(s.task, group)

    def cancel(self, s: Session) -> None:
        """End `s` on purpose: at once if it has not started, else through its gateway."""
        if self.table.cancel_unstarted(s.session_id) is not None:
            self._journal_result(s, "cancelled")
        elif s.gateway is not None and s.session_id not in self.cancelling:
            self.cancelling.add(s.session_id)
            self.send(s.gateway, wire.Cancel(session_id=s.session_id))

    def decide_due(self) -> None:
        """Decide the groups whose grace has passed with enough samples finished."""
        for task, group in self.groups.due(time.time()):
            self._decide(task, group)

    def resume(self, done: dict[tuple[str, int], dict], decided: dict[str, frozenset[int]]) -> None:
        """An earlier life's groups: its decisions kept (their tails cancelled again if they were
        queued anew), its finished samples noted, in the order they finished, in undecided groups."""
        for task_id, group in decided.items():
            self.groups.decide(task_id, group)
        for (task_id, sample), event in sorted(done.items(), key=lambda kv: kv[1].get("t", 0.0)):
            s = self.table.keys.get((task_id, sample))
            if s is not None and event.get("status") != "cancelled":
                if decision := self.groups.finished(s.task, sample, event.get("t", time.time())):
                    self._decide(s.task, decision)
        for task_id in decided:
            if (first := self.table.keys.get((task_id, 0))) is not None:
                self._cancel_tail(first.task)

    def _decide(self, task: Task, group: frozenset[int]) -> None:
        self.groups.decide(task.id, group)
        reason = "accept" if task.accept is not None and len(group) >= task.accept else "fraction"
        self.journal.write("decided", task=task.id, accepted=sorted(group), reason=reason,
                           cancelled=[i for i in range(task.num_samples) if i not in group])
        self._cancel_tail(task)

    def _cancel_tail(self, task: Task) -> None:
        for sample in range(task.num_samples):
            s = self.table.keys.get((task.id, sample))
            if s is not None and s.state not in FINAL and self.groups.cut(task.id, sample):
                self.cancel(s)

    def _journal_result(self, s: Session, status: str, reward: float | None = None, shard: str = "",
                        n_tokens: int = 0, **extra: Any) -> None:
        """The `result` event of the attempt that counts for (task, sample)."""
        self.journal.write("result", session=s.session_id, task=s.task.id, sample=s.sample_index, attempt=s.attempt,
                           status=status, reward=reward, shard=shard, n_tokens=n_tokens, **extra)

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
        if session_id in self.cancelling:  # cancelled on purpose: it ends so, and never runs again
            self.cancelling.discard(session_id)
            self.table.finish(wire.Result(session_id=session_id, status="cancelled", reward=None, n_calls=0,
                                          n_traces=0, n_tokens=0, shard=""))
            self._journal_result(s, "cancelled", reason="gateway lost")
            return
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
            self._journal_result(s, "error", error=error)
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
