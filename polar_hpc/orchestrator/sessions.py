"""The session table: every (task, sample) of the run, its current attempt and state.

Sessions wait in a FIFO queue until a gateway with credit takes them. A session whose gateway is
lost goes back to the front of the queue with its attempt number raised. Pure bookkeeping: no I/O.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from polar_hpc import wire
from polar_hpc.config import Task

FINAL = ("completed", "error", "timeout", "cancelled")


@dataclass
class Session:
    task: Task
    sample_index: int
    attempt: int = 0
    state: str = "queued"
    gateway: bytes | None = None
    result: wire.Result | None = None

    @property
    def session_id(self) -> str:
        return f"{self.task.id}#{self.sample_index}.{self.attempt}"


@dataclass
class SessionTable:
    sessions: dict[str, Session] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)

    @classmethod
    def from_tasks(cls, tasks: list[Task]) -> "SessionTable":
        table = cls()
        for task in tasks:
            for i in range(task.num_samples):
                s = Session(task, i)
                table.sessions[s.session_id] = s
                table.queue.append(s)
        return table

    def take(self, gateway: bytes) -> wire.SessionSpec | None:
        """Dispatch the next queued session to `gateway`; its deadline starts now."""
        if not self.queue:
            return None
        s = self.queue.popleft()
        s.state, s.gateway = "assigned", gateway
        return wire.SessionSpec(
            session_id=s.session_id,
            task=s.task.model_dump(mode="json"),
            sample_index=s.sample_index,
            attempt=s.attempt,
            deadline=time.time() + s.task.timeout_s,
        )

    def update(self, session_id: str, state: str) -> Session | None:
        s = self.sessions.get(session_id)
        if s is not None and s.state not in FINAL:
            s.state = state
        return s

    def finish(self, result: wire.Result) -> Session | None:
        s = self.sessions.get(result.session_id)
        if s is None or s.state in FINAL:
            return None
        s.state, s.result = result.status, result
        return s

    def requeue(self, session_id: str) -> Session:
        """A lost gateway's session starts again, as a new attempt, ahead of the queue."""
        old = self.sessions.pop(session_id)
        s = Session(old.task, old.sample_index, old.attempt + 1)
        self.sessions[s.session_id] = s
        self.queue.appendleft(s)
        return s

    def status(self, gateways: int) -> wire.StatusReply:
        states = Counter(s.state for s in self.sessions.values())
        rewards = [s.result.reward for s in self.sessions.values() if s.result and s.result.reward is not None]
        return wire.StatusReply(
            states=dict(states),
            total=len(self.sessions),
            done=all(s.state in FINAL for s in self.sessions.values()),
            gateways=gateways,
            mean_reward=sum(rewards) / len(rewards) if rewards else None,
            tokens=sum(s.result.n_tokens for s in self.sessions.values() if s.result),
        )
