"""The orchestrator over real ZeroMQ: credit-based dispatch, silent gateways requeued, shutdown."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from polar_hpc import wire
from tests.orchestrator.helpers import next_message, start_orchestrator

TASK = {"id": "t", "instruction": "hi", "num_samples": 2, "harness": {"command": "true"}}


@pytest.fixture
def orchestrator(tmp_path: Path):
    proc, endpoint = start_orchestrator(tmp_path, "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 1.0\n", TASK)
    ctx = zmq.Context()
    yield tmp_path, endpoint, ctx, proc
    proc.kill()
    proc.wait()
    ctx.destroy(linger=0)


def _peer(ctx, endpoint):
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    return sock


_next = next_message


def test_silent_gateway_sessions_are_requeued_to_another(orchestrator) -> None:
    run_dir, endpoint, ctx, proc = orchestrator
    silent = _peer(ctx, endpoint)
    silent.send(wire.encode(wire.Hello(gateway_id="silent", host="h", slots=1)))
    silent.send(wire.encode(wire.Credit(n=1)))
    (first,) = _next(silent, wire.Assign).sessions
    assert first.attempt == 0 and first.deadline > time.time()
    _next(silent, wire.Heartbeat)  # the orchestrator heartbeats its gateways

    alive = _peer(ctx, endpoint)
    alive.send(wire.encode(wire.Hello(gateway_id="alive", host="h", slots=4)))
    alive.send(wire.encode(wire.Credit(n=4)))
    got = _next(alive, wire.Assign).sessions  # the second sample, at once
    t_silent = time.monotonic()
    while len(got) < 2:  # the silent gateway's session, once it is declared lost
        alive.send(wire.encode(wire.Heartbeat(sender="alive", t=time.time())))
        try:
            got += _next(alive, wire.Assign, timeout_s=0.2).sessions
        except AssertionError:
            pass
        assert time.monotonic() - t_silent < 10
    requeued = got[1]
    assert (requeued.task["id"], requeued.sample_index, requeued.attempt) == ("t", first.sample_index, 1)
    assert time.monotonic() - t_silent >= 0.8, "lost only after peer_timeout_s of silence"

    for spec in got:
        alive.send(wire.encode(wire.Result(session_id=spec.session_id, status="completed", reward=1.0,
                                           n_calls=1, n_traces=1, n_tokens=10, shard="x")))
    client = _peer(ctx, endpoint)
    status = None
    for _ in range(50):
        client.send(wire.encode(wire.StatusRequest()))
        status = _next(client, wire.StatusReply)
        if status.done:
            break
        time.sleep(0.05)
    assert status.done and status.states == {"completed": 2} and status.mean_reward == 1.0 and status.tokens == 20

    journal = [json.loads(x) for x in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    events = [e["event"] for e in journal]
    assert "gateway_lost" in events and "requeued" in events and events.count("result") == 2

    client.send(wire.encode(wire.Shutdown(reason="test")))
    _next(alive, wire.Shutdown)
    assert proc.wait(10) == 0
