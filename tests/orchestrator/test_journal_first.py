"""The journal is written before the orchestrator tells anyone: killed (SIGKILL) right after it
answered, the journal holds every assignment a gateway received and every result a status
reported, though heartbeats (which also write it) are 30 s apart."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import zmq

from polar_hpc import wire
from tests.orchestrator.helpers import next_message, start_orchestrator

TASK = {"id": "t", "instruction": "hi", "num_samples": 3, "harness": {"command": "true"}}


def test_what_peers_were_told_survives_a_kill(tmp_path: Path) -> None:
    proc, endpoint = start_orchestrator(tmp_path, "gateway:\n  heartbeat_s: 30\n  peer_timeout_s: 60\n", TASK)
    ctx = zmq.Context()
    try:
        gw, client = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        gw.connect(endpoint)
        client.connect(endpoint)
        gw.send(wire.encode(wire.Hello(gateway_id="g", host="h", slots=3)))
        gw.send(wire.encode(wire.Credit(n=3)))
        assigned = [s.session_id for s in next_message(gw, wire.Assign).sessions]
        gw.send(wire.encode(wire.SessionUpdate(session_id=assigned[0], state="RUN", t=0.0)))
        gw.send(wire.encode(wire.Result(session_id=assigned[0], status="completed", reward=1.0, n_calls=1,
                                        n_traces=1, n_tokens=4, shard="g-000001.shard")))
        deadline = time.monotonic() + 60
        while True:  # the two links are read fairly: the result may come after a status request
            client.send(wire.encode(wire.StatusRequest()))
            if next_message(client, wire.StatusReply).states == {"completed": 1, "assigned": 2}:
                break
            assert time.monotonic() < deadline
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
        ctx.destroy(linger=0)
    events = [json.loads(x) for x in (tmp_path / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    assert sorted(e["session"] for e in events if e["event"] == "assigned") == sorted(assigned)
    assert [(e["session"], e["state"]) for e in events if e["event"] == "state"] == [(assigned[0], "RUN")]
    assert [(e["session"], e["n_tokens"]) for e in events if e["event"] == "result"] == [(assigned[0], 4)]
