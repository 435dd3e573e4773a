"""The gateway's Outbox: what a flush tells the orchestrator, coalesced but with nothing lost."""

from __future__ import annotations

from polar_hpc import wire
from polar_hpc.gateway.server import Outbox


def _result(session_id: str, status: str = "completed") -> wire.Result:
    return wire.Result(session_id=session_id, status=status, reward=None, n_calls=0, n_traces=0, n_tokens=0,
                       shard="g-000001.shard")


def _update(session_id: str, state: str) -> wire.SessionUpdate:
    return wire.SessionUpdate(session_id=session_id, state=state, t=0.0)


def test_a_flush_keeps_each_running_sessions_latest_state_every_result_and_the_credit_summed() -> None:
    box = Outbox()
    assert box.take() is None  # nothing to say: no message
    for msg in (_update("a", "INIT"), wire.Credit(n=1), _update("b", "INIT"), _update("a", "RUN"),
                _update("c", "INIT"), _update("c", "RUN"), _result("c"), _result("d", "error"), wire.Credit(n=2),
                _update("b", "READY")):
        box.add(msg)
    report = box.take()
    assert report.items == [_update("a", "RUN"), _update("b", "READY"), _result("c"), _result("d", "error"),
                            wire.Credit(n=3)]  # c's updates went with its result; results in their order
    assert wire.decode(wire.encode(report)) == report  # one wire message
    assert box.take() is None  # taken once


def test_credit_alone_or_zero() -> None:
    box = Outbox()
    box.add(wire.Credit(n=0))
    assert box.take() is None
    box.add(wire.Credit(n=4))
    assert box.take().items == [wire.Credit(n=4)]
