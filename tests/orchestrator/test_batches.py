"""Batched dispatch over real ZeroMQ: an Assign carries the sessions one Credit bought, in queue
order; Reports carry many sessions' news; no session is lost or run twice, and a gateway killed
mid-batch has exactly its unfinished sessions requeued, once each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq

from polar_hpc import wire
from tests.orchestrator.helpers import HANG_S, Gateway, next_message, reply, start_orchestrator, wait_for


def _gateway(ctx, endpoint: str, name: str, slots: int) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(wire.encode(wire.Hello(gateway_id=name, host="h", slots=slots)))
    sock.send(wire.encode(wire.Credit(n=slots)))
    return sock


def _result(session_id: str) -> wire.Result:
    return wire.Result(session_id=session_id, status="completed", reward=1.0, n_calls=1, n_traces=1, n_tokens=3,
                       shard="g-000001.shard")


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]


def _wait_done(ctx, endpoint: str, serve=None, timeout_s: float = HANG_S) -> wire.StatusReply:
    """Status until the run is done; `serve()` (gateways played by this thread) between asks."""
    client = ctx.socket(zmq.DEALER)
    client.connect(endpoint)
    deadline = time.monotonic() + timeout_s
    while True:
        if serve is not None:
            serve()
        else:
            time.sleep(0.05)
        client.send(wire.encode(wire.StatusRequest()))
        status = next_message(client, wire.StatusReply)
        if status.done:
            return status
        assert time.monotonic() < deadline, status


def test_batched_sessions_each_run_once_in_queue_order(tmp_path: Path, ctx) -> None:
    tasks = [{"id": "a", "instruction": "-", "num_samples": 120, "harness": {"command": "true"}},
             {"id": "b", "instruction": "-", "num_samples": 80, "harness": {"command": "true"}}]
    proc, endpoint = start_orchestrator(tmp_path, "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 30\n", tasks)
    expected = [f"{t['id']}#{i}.0" for t in tasks for i in range(t["num_samples"])]
    slots = {"g7": 7, "g16": 16, "g1": 1}
    socks = {name: _gateway(ctx, endpoint, name, n) for name, n in slots.items()}
    held = {name: 0 for name in slots}  # sessions each gateway runs now: never more than its slots
    got: dict[str, list[list[str]]] = {name: [] for name in slots}
    split = [True]

    def serve() -> None:
        for name, sock in socks.items():
            while (msg := reply(sock, wire.Assign, 0.01)) is not None:
                ids = [s.session_id for s in msg.sessions]
                held[name] += len(ids)
                assert 0 < len(ids) and held[name] <= slots[name], (name, ids)
                got[name].append(ids)
                updates = [wire.SessionUpdate(session_id=sid, state="RUN", t=0.0) for sid in ids]
                if split[0]:  # news of the batch in two Reports: the stage updates, then results and credit
                    sock.send(wire.encode(wire.Report(items=updates)))
                    updates = []
                split[0] = not split[0]
                sock.send(wire.encode(wire.Report(items=[*updates, *map(_result, ids), wire.Credit(n=len(ids))])))
                held[name] -= len(ids)

    try:
        status = _wait_done(ctx, endpoint, serve)
    finally:
        proc.kill()
        proc.wait()
    assert status.states == {"completed": 200} and status.tokens == 600
    events = _events(tmp_path)
    assigned = [e["session"] for e in events if e["event"] == "assigned"]
    assert assigned == expected  # queue order, each once
    for name, batches in got.items():
        for ids in batches:  # each Assign: consecutive sessions of the queue
            start = expected.index(ids[0])
            assert ids == expected[start:start + len(ids)], (name, ids)
    assert sorted(sid for batches in got.values() for ids in batches for sid in ids) == sorted(expected)
    assert max(len(ids) for ids in got["g16"]) > 1  # batched, not one session per message
    results = [e["session"] for e in events if e["event"] == "result"]
    assert sorted(results) == sorted(expected)
    assert {e["session"] for e in events if e["event"] == "state"} == set(expected)
    assert not [e for e in events if e["event"] in ("requeued", "interrupted")]
    assert "refused" not in proc.stdout.read().decode()


KILLED = """
import json, sys, time, zmq
from polar_hpc import wire
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(sys.argv[1])
sock.send(wire.encode(wire.Hello(gateway_id="doomed", host="h", slots=6)))
sock.send(wire.encode(wire.Credit(n=6)))
while not isinstance(msg := wire.decode(sock.recv()), wire.Assign):
    pass
ids = [s.session_id for s in msg.sessions]
done = [wire.Result(session_id=sid, status="completed", reward=1.0, n_calls=0, n_traces=0, n_tokens=1,
                    shard="doomed-000001.shard") for sid in ids[:2]]
sock.send(wire.encode(wire.Report(items=[wire.SessionUpdate(session_id=ids[2], state="RUN", t=0.0), *done])))
print(json.dumps(ids), flush=True)
time.sleep(600)
"""


def test_a_gateway_killed_mid_batch_has_its_unfinished_sessions_requeued_once(tmp_path: Path, ctx) -> None:
    task = {"id": "t", "instruction": "-", "num_samples": 8, "harness": {"command": "true"}}
    proc, endpoint = start_orchestrator(tmp_path, "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 2.0\n", task)
    doomed = subprocess.Popen([sys.executable, "-c", KILLED, endpoint], stdout=subprocess.PIPE, text=True)
    survivor = None
    try:
        first = json.loads(doomed.stdout.readline())  # its batch of 6; 2 reported done, 1 running
        assert first == [f"t#{i}.0" for i in range(6)]
        wait_for(lambda: sum(e["event"] == "result" for e in _events(tmp_path)) >= 2, "its Report was taken")
        os.kill(doomed.pid, signal.SIGKILL)  # mid-batch: 4 of its sessions unfinished
        doomed.wait()
        survivor = Gateway(ctx, endpoint, "survivor", 3,  # heartbeats from its own thread, so never lost
                           serve=lambda ids: [wire.Report(items=[*map(_result, ids), wire.Credit(n=len(ids))])])
        status = _wait_done(ctx, endpoint)
        ran = survivor.ran
    finally:
        if survivor is not None:
            survivor.stop()
        doomed.kill()
        proc.kill()
        proc.wait()
    assert status.states == {"completed": 8}
    events = _events(tmp_path)
    requeued = [(e["previous"], e["session"]) for e in events if e["event"] == "requeued"]
    assert sorted(requeued) == [(f"t#{i}.0", f"t#{i}.1") for i in range(2, 6)]  # once each, the finished not
    assert sorted(ran) == ["t#2.1", "t#3.1", "t#4.1", "t#5.1", "t#6.0", "t#7.0"]
    results = {e["sample"]: e["session"] for e in events if e["event"] == "result"}
    assert len([e for e in events if e["event"] == "result"]) == 8 and len(results) == 8
    assert results[0] == "t#0.0" and results[1] == "t#1.0" and results[3] == "t#3.1"
    assert [e["gateway"] for e in events if e["event"] == "gateway_lost"] == ["doomed"]
