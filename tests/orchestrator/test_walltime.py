"""Walltime admission: a session whose timeout_s cannot end before the allocation does is held,
not dispatched (`held_too_long` when not even a fresh life would fit it); the counts stay true."""

from __future__ import annotations

import time
from collections import Counter

from polar_hpc.config import Task
from polar_hpc.orchestrator.sessions import SessionTable


def _task(task_id: str, n: int, timeout_s: float) -> Task:
    return Task.model_validate({"id": task_id, "instruction": "x", "num_samples": n, "timeout_s": timeout_s,
                                "harness": {"command": "true"}})


def test_sessions_that_cannot_end_in_time_are_held() -> None:
    table = SessionTable.from_tasks([_task("long", 2, 900), _task("short", 3, 60), _task("mid", 1, 400)])
    table.admit_until, table.life_s = time.time() + 300, 600
    specs = table.take(b"gateway", 10)
    assert sorted(s.session_id for s in specs) == ["short#0.0", "short#1.0", "short#2.0"]
    assert {s.session_id: s.state for s in table.newly_held} == {
        "long#0.0": "held_too_long", "long#1.0": "held_too_long", "mid#0.0": "held"}
    reply = table.status(gateways=1)
    assert reply.states == dict(Counter(s.state for s in table.sessions.values()))
    assert reply.states == {"assigned": 3, "held_too_long": 2, "held": 1} and not reply.done
    assert not table.take(b"gateway", 10)  # held sessions are not offered again in this life


def test_without_an_end_every_session_is_dispatched() -> None:
    table = SessionTable.from_tasks([_task("long", 2, 90000)])
    assert len(table.take(b"gateway", 10)) == 2 and not table.newly_held

