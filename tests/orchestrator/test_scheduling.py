"""The orchestrator over real ZeroMQ: credit-based dispatch, silent gateways requeued, shutdown."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from polar_hpc import wire
from tests.orchestrator.helpers import Gateway, next_message, start_orchestrator, wait_for

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

    alive = Gateway(ctx, endpoint, "alive", 4, serve=lambda ids: [  # it heartbeats from a thread of its own
        wire.Result(session_id=sid, status="completed", reward=1.0, n_calls=1, n_traces=1, n_tokens=10, shard="x")
        for sid in ids])
    client = _peer(ctx, endpoint)

    def status() -> wire.StatusReply:
        client.send(wire.encode(wire.StatusRequest()))
        return _next(client, wire.StatusReply)

    try:
        wait_for(lambda: len(alive.specs) >= 1, "the second sample, at once")
        t_silent = time.monotonic()
        wait_for(lambda: len(alive.specs) >= 2, "the silent gateway's session, once it is declared lost")
        assert time.monotonic() - t_silent >= 0.8, "lost only after peer_timeout_s of silence"
        requeued = alive.specs[1]
        assert (requeued.task["id"], requeued.sample_index, requeued.attempt) == ("t", first.sample_index, 1)
        wait_for(lambda: status().done, "both results taken")
        final = status()
        assert final.states == {"completed": 2} and final.mean_reward == 1.0 and final.tokens == 20
        journal = [json.loads(x) for x in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
        events = [e["event"] for e in journal]
        assert "gateway_lost" in events and "requeued" in events and events.count("result") == 2

        client.send(wire.encode(wire.Shutdown(reason="test")))
        wait_for(lambda: any(isinstance(m, wire.Shutdown) for m in alive.messages), "the gateway is told to stop")
    finally:
        alive.stop()
    assert proc.wait(60) == 0
