"""The session table keeps StatusReply's counts as sessions move (status costs nothing per session):
after every step of a long random run of dispatches, stage updates, results, requeues, cancels and
added tasks, the counts equal those recounted from the sessions themselves."""

from __future__ import annotations

import random
from collections import Counter

from polar_hpc import wire
from polar_hpc.config import Task
from polar_hpc.orchestrator.sessions import FINAL, SessionTable


def _task(task_id: str, n: int) -> Task:
    return Task.model_validate({"id": task_id, "instruction": "x", "num_samples": n, "harness": {"command": "true"}})


def _recounted(table: SessionTable) -> tuple:
    sessions, results = list(table.sessions.values()), list(table.results.values())
    rewards = [r.reward for r in results if r.reward is not None]
    return (dict(Counter(s.state for s in sessions)), all(s.state in FINAL for s in sessions),
            sum(rewards) / len(rewards) if rewards else None, sum(r.n_tokens for r in results))


def test_counts_follow_every_move() -> None:
    rng = random.Random(7)
    done = {("t0", 1): {"attempt": 2, "status": "completed", "reward": 0.5, "n_tokens": 7}}  # a resumed run
    table = SessionTable.from_tasks([_task(f"t{i}", 5) for i in range(3)], done, {("t1", 0): 3})
    for step in range(3000):
        held = [s for s in table.sessions.values() if s.state not in FINAL and s.state != "queued"]
        queued = [s for s in table.sessions.values() if s.state == "queued"]
        op = rng.random()
        if op < 0.2:
            table.take(b"gateway", 1)
        elif op < 0.4 and held:
            table.update(rng.choice(held).session_id, rng.choice(["INIT", "READY", "RUN", "POSTRUN"]))
        elif op < 0.6 and held:
            s = rng.choice(held)
            table.finish(wire.Result(session_id=s.session_id, status=rng.choice(FINAL), n_calls=0, n_traces=0,
                                     reward=rng.choice([None, 1.0, 0.25]), n_tokens=rng.randint(0, 9), shard=""))
        elif op < 0.7 and held:
            table.requeue(rng.choice(held).session_id)
        elif op < 0.8 and queued:
            table.cancel_unstarted(rng.choice(queued).session_id)
        elif op < 0.83:
            table.add(_task(f"added{step}", 2))
        reply = table.status(gateways=1)
        assert (reply.states, reply.done, reply.mean_reward, reply.tokens) == _recounted(table), step
        assert reply.total == len(table.sessions)
    assert reply.states.get("completed", 0) > 50 and reply.states.get("queued", 0) + len(held) > 0
