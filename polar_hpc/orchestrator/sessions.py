"""The session table: every (task, sample) of the run, its current attempt and state.

Sessions wait in a FIFO queue until a gateway with credit takes them. A session whose gateway is
lost goes back to the front of the queue with its attempt number raised. In service mode tasks are
added while the run goes (`add`). A session not started yet (queued or held) can be cancelled
(`cancel_unstarted`). `keys` finds a (task, sample)'s current session. Pure bookkeeping: no I/O.
Every change of state goes through the table, which keeps the counts `status` answers with (sessions
by state, rewards, tokens) as it goes, so a status costs the same for ten sessions or a million.
A key's result is the first its live attempt sends (`results`, shards.decisions.FirstResults): a
session in a final state takes no other, and an attempt requeued since is no longer in the table.
Walltime admission: with `admit_until` (the unix time by which a session must end: the Slurm
driver's, from the allocation's end) a queued session whose expected time (`durations`: its
`timeout_s`, or what its task's completed sessions took, by `slurm.admit_by`) would end later is not
dispatched but `held` (`held_too_long` when it would not fit even a fresh life of `life_s`
seconds); held sessions stay unfinished, for the next life of the job, and are listed in `newly_held`.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from polar_hpc import wire
from polar_hpc.config import Task
from polar_hpc.orchestrator.durations import Durations
from polar_hpc.shards.decisions import FirstResults

FINAL = ("completed", "error", "timeout", "cancelled")
HELD = ("held", "held_too_long")  # not started: the allocation ends before the session could
ADMIT_UNTIL_ENV = "POLAR_ADMIT_UNTIL"  # unix time by which a dispatched session must end (the driver sets it)
LIFE_ENV = "POLAR_LIFE_S"  # how long a fresh life of the job can run sessions


@dataclass
class Session:
    task: Task
    sample_index: int
    attempt: int = 0
    state: str = "queued"
    gateway: bytes | None = None
    dispatched_at: float = 0.0  # unix time `take` dispatched this attempt
    session_id: str = field(init=False)  # `<task>#<sample>.<attempt>`, made once

    def __post_init__(self) -> None:
        self.session_id = f"{self.task.id}#{self.sample_index}.{self.attempt}"


@dataclass
class SessionTable:
    sessions: dict[str, Session] = field(default_factory=dict)
    keys: dict[tuple[str, int], Session] = field(default_factory=dict)  # (task, sample) -> its current session
    queue: deque = field(default_factory=deque)
    _dumped: dict[str, Any] = field(default_factory=dict)  # task id -> the task, encoded once (wire.raw), or why not
    unsendable: list[Session] = field(default_factory=list)  # ended by `take` (a task it cannot encode), to journal
    states: Counter = field(default_factory=Counter)  # state -> sessions in it
    results: FirstResults[wire.Result] = field(default_factory=FirstResults)  # (task, sample) -> the result that counts
    _rewards: list[float] = field(default_factory=lambda: [0.0, 0])  # sum and count of the rewards
    _tokens: int = 0
    admit_until: float | None = None
    life_s: float | None = None
    durations: Durations = field(default_factory=Durations)
    newly_held: list[Session] = field(default_factory=list)  # held by `take` since the caller last looked

    @classmethod
    def from_tasks(cls, tasks: list[Task], done: dict | None = None, attempts: dict | None = None) -> "SessionTable":
        """Every (task, sample), queued; on resume, `done` maps finished keys to their journaled
        result event (not redone) and the others start at the attempt after `attempts[key]`."""
        table = cls()
        done, attempts = done or {}, attempts or {}
        for task in tasks:
            for i in range(task.num_samples):
                key = (task.id, i)
                s = Session(task, i, attempts[key] + 1 if key in attempts else 0)
                if key in done:
                    s = Session(task, i, done[key]["attempt"], done[key]["status"])
                    table.results[key] = result = wire.Result(
                        session_id=s.session_id, status=s.state, reward=done[key].get("reward"), n_calls=0,
                        n_traces=0, n_tokens=done[key].get("n_tokens", 0), shard=done[key].get("shard", ""),
                    )
                    table._count(result)
                else:
                    table.queue.append(s)
                table.sessions[s.session_id] = table.keys[key] = s
                table.states[s.state] += 1
        return table

    def add(self, task: Task) -> list[Session]:
        """A task submitted while the run is going (service mode): its samples join the queue's end."""
        added = [Session(task, i) for i in range(task.num_samples)]
        for s in added:
            self.sessions[s.session_id] = self.keys[(task.id, s.sample_index)] = s
            self.queue.append(s)
        self.states["queued"] += len(added)
        return added

    def cancel_unstarted(self, session_id: str) -> Session | None:
        """A queued or held session ends `cancelled`; None when it is neither."""
        s = self.sessions.get(session_id)
        if s is None or s.state not in ("queued", *HELD):
            return None
        if s.state == "queued":
            self.queue.remove(s)
        self._move(s, "cancelled")
        return s

    def take(self, gateway: bytes, n: int) -> list[wire.SessionSpec]:
        """Dispatch up to `n` queued sessions to `gateway`, in queue order; their deadlines start now.
        A session whose task cannot be encoded ends `error` instead, into `unsendable`."""
        specs: list[wire.SessionSpec] = []
        now = time.time()
        while self.queue and len(specs) < n:
            s = self.queue.popleft()
            expected = self.durations.expected(s.task) if self.admit_until is not None else 0.0
            if self.admit_until is not None and now + expected > self.admit_until:
                too_long = self.life_s is not None and expected > self.life_s
                self._move(s, "held_too_long" if too_long else "held")
                self.newly_held.append(s)
                continue
            task = self._dumped.get(s.task.id)
            if task is None:  # dumped and encoded once per task, not per session
                try:
                    task = wire.raw(s.task.model_dump(mode="json"))
                except Exception as e:  # whatever one task holds, it fails alone (its reason kept)
                    task = f"the task cannot be sent to a gateway: {type(e).__name__}: {str(e)[:200]}"
                self._dumped[s.task.id] = task
            if isinstance(task, str):
                self.finish(wire.Result(session_id=s.session_id, status="error", reward=None, n_calls=0,
                                        n_traces=0, n_tokens=0, shard="", error=task))
                self.unsendable.append(s)
                continue
            s.state, s.gateway, s.dispatched_at = "assigned", gateway, now
            specs.append(wire.SessionSpec(session_id=s.session_id, task=task, sample_index=s.sample_index,
                                          attempt=s.attempt, deadline=now + s.task.timeout_s))
        self.states["queued"] -= len(specs)
        self.states["assigned"] += len(specs)
        return specs

    def update(self, session_id: str, state: str) -> Session | None:
        s = self.sessions.get(session_id)
        if s is not None and s.state not in FINAL:
            self._move(s, state)
        return s

    def finish(self, result: wire.Result) -> Session | None:
        s = self.sessions.get(result.session_id)  # an attempt requeued since is gone: its result is too late
        if s is None or s.state in FINAL or not self.results.offer((s.task.id, s.sample_index), result):
            return None
        self._move(s, result.status)
        self._count(result)
        if result.status == "completed" and s.dispatched_at:
            self.durations.add(s.task.id, time.time() - s.dispatched_at)
        return s

    def requeue(self, session_id: str) -> Session:
        """A lost gateway's session starts again, as a new attempt, ahead of the queue."""
        old = self.sessions.pop(session_id)
        self.states[old.state] -= 1
        s = Session(old.task, old.sample_index, old.attempt + 1)
        self.sessions[s.session_id] = self.keys[(s.task.id, s.sample_index)] = s
        self.states[s.state] += 1
        self.queue.appendleft(s)
        return s

    def status(self, gateways: int, members: list | None = None, rate: float = 0.0) -> wire.StatusReply:
        states = {state: n for state, n in self.states.items() if n}
        left = sum(n for state, n in states.items() if state not in FINAL)
        total, count = self._rewards
        return wire.StatusReply(
            states=states,
            total=len(self.sessions),
            done=left == 0,
            gateways=gateways,
            mean_reward=total / count if count else None,
            tokens=self._tokens,
            members=members or [],
            sessions_per_s=rate,
            eta_s=left / rate if rate > 0 else None,
        )

    def _move(self, s: Session, state: str) -> None:
        self.states[s.state] -= 1
        self.states[state] += 1
        s.state = state

    def _count(self, result: wire.Result) -> None:
        self._tokens += result.n_tokens
        if result.reward is not None:
            self._rewards[0] += result.reward
            self._rewards[1] += 1
