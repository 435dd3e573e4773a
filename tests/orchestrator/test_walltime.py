"""Walltime admission: a session whose timeout_s cannot end before the allocation does is held,
not dispatched (`held_too_long` when not even a fresh life would fit it); the counts stay true.
With `slurm.admit_by: observed` a task's sessions are planned for what its completed sessions took."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from polar_hpc import wire
from polar_hpc.config import Task
from polar_hpc.orchestrator.durations import Durations
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



@pytest.mark.parametrize("observed", [False, True])
def test_admission_by_observed_durations(observed: bool) -> None:
    """Three sessions of a task with a one-hour timeout complete (in well under a minute) while the
    allocation has no end; then it has ten minutes left. By timeout the rest are held; by what the
    task's sessions took they run. A task with too few completions stays judged by its timeout."""
    table = SessionTable.from_tasks([_task("quick", 6, 3600), _task("new", 1, 3600)])
    table.durations = Durations(0.9 if observed else None, min_samples=3)
    for spec in table.take(b"gateway", 3):
        assert table.finish(wire.Result(session_id=spec.session_id, status="completed", reward=1.0, n_calls=1,
                                        n_traces=1, n_tokens=1, shard="s")) is not None
    table.admit_until = time.time() + 600
    specs = table.take(b"gateway", 10)
    held = {s.session_id for s in table.newly_held}
    if observed:
        assert table.durations.expected(_task("quick", 1, 3600)) < 60
        assert sorted(s.session_id for s in specs) == ["quick#3.0", "quick#4.0", "quick#5.0"] and held == {"new#0.0"}
    else:
        assert specs == [] and held == {"quick#3.0", "quick#4.0", "quick#5.0", "new#0.0"}


def test_observed_quantile_never_exceeds_the_timeout() -> None:
    d = Durations(0.5, min_samples=2)
    for seconds in (10, 20, 30, 40):
        d.add("t", seconds)
    assert d.expected(_task("t", 1, 3600)) == 20  # the median of what was observed
    assert d.expected(_task("t", 1, 15)) == 15  # a timeout below what was observed still bounds it
    assert d.expected(_task("other", 1, 99)) == 99  # nothing observed: the timeout
