"""The orchestrator of a Slurm run: CURVE refuses peers without the run's keys; a restarted
orchestrator resumes from its journal; a session its gateway cut short runs again."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import zmq

from polar_hpc import security, wire
from tests.orchestrator.helpers import reply, start_orchestrator

TASK = {"id": "t", "instruction": "hi", "num_samples": 3, "harness": {"command": "true"}}


def _start(run_dir: Path) -> tuple[subprocess.Popen, str]:
    return start_orchestrator(run_dir, "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 5.0\n", TASK)


_reply = reply


def _status(ctx, endpoint: str, run_dir: Path, timeout_s: float = 5.0):
    sock = ctx.socket(zmq.DEALER)
    security.secure_client(sock, run_dir, security.ADMIN)
    sock.connect(endpoint)
    sock.send(wire.encode(wire.StatusRequest()))
    try:
        return _reply(sock, wire.StatusReply, timeout_s)
    finally:
        sock.close(linger=0)


def test_peer_without_the_run_keys_is_refused(tmp_path: Path, ctx) -> None:
    security.create_keys(tmp_path)
    other = tmp_path / "other"
    security.create_keys(other)  # keys of another run: the right format, the wrong keys
    proc, endpoint = _start(tmp_path)
    try:
        assert json.loads((tmp_path / "rendezvous.json").read_text())["curve_server_key"]
        plain = ctx.socket(zmq.DEALER)
        plain.connect(endpoint)
        stranger = ctx.socket(zmq.DEALER)
        client = json.loads((other / "keys" / "client.json").read_text())
        stranger.curve_secretkey, stranger.curve_publickey = client["secret"].encode(), client["public"].encode()
        stranger.curve_serverkey = security.server_public_key(tmp_path).encode()  # even knowing the server key
        stranger.connect(endpoint)
        for peer in (plain, stranger):
            peer.send(wire.encode(wire.Hello(gateway_id="intruder", host="h", slots=1)))
            peer.send(wire.encode(wire.Credit(n=3)))
            peer.send(wire.encode(wire.StatusRequest()))
        assert _reply(plain, wire.Message, 1.5) is None and _reply(stranger, wire.Message, 0.5) is None
        for peer in (plain, stranger):  # their messages can never leave: do not wait for them
            peer.close(linger=0)
        status = _status(ctx, endpoint, tmp_path)  # a member of the run gets its answer
        assert status is not None and status.gateways == 0 and status.states == {"queued": 3}
    finally:
        proc.kill()
        proc.wait()


def test_restart_resumes_from_the_journal(tmp_path: Path, ctx) -> None:
    journal = tmp_path / "journal" / "orchestrator.jsonl"
    journal.parent.mkdir()
    earlier = [
        {"event": "queued", "session": "t#0.0", "task": "t", "sample": 0, "attempt": 0},
        {"event": "queued", "session": "t#1.0", "task": "t", "sample": 1, "attempt": 0},
        {"event": "queued", "session": "t#2.0", "task": "t", "sample": 2, "attempt": 0},
        {"event": "assigned", "session": "t#0.0", "gateway": "g", "attempt": 0},
        {"event": "requeued", "session": "t#0.1", "previous": "t#0.0", "attempt": 1},
        {"event": "result", "session": "t#0.1", "task": "t", "sample": 0, "attempt": 1, "status": "completed",
         "reward": 1.0, "shard": "g-000001.shard", "n_tokens": 7},
        {"event": "assigned", "session": "t#1.0", "gateway": "g", "attempt": 0},
        {"event": "interrupted", "session": "t#1.0", "reason": "orchestrator stopping"},
    ]
    journal.write_text("".join(json.dumps(e) + "\n" for e in earlier) + '{"event": "stat')  # cut by a crash
    proc, endpoint = _start(tmp_path)
    try:
        gw = ctx.socket(zmq.DEALER)
        gw.connect(endpoint)
        gw.send(wire.encode(wire.Hello(gateway_id="g2", host="h", slots=4)))
        gw.send(wire.encode(wire.Credit(n=4)))
        got = sorted((s.sample_index, s.attempt) for s in _reply(gw, wire.Assign).sessions)  # one Assign
        assert got == [(1, 1), (2, 1)]  # sample 0 is not redone; the others run as new attempts
        assert _reply(gw, wire.Assign, 0.5) is None
        status = _status(ctx, endpoint, tmp_path)
        assert status.states.get("completed") == 1 and status.tokens == 7
        # a session its gateway cut short (cancelled) is not the attempt that counts: it runs again
        gw.send(wire.encode(wire.Result(session_id="t#1.1", status="cancelled", reward=None, n_calls=0,
                                        n_traces=0, n_tokens=0, shard="g2-000001.shard")))
        gw.send(wire.encode(wire.Credit(n=1)))
        again = _reply(gw, wire.Assign)
        assert [(s.sample_index, s.attempt) for s in again.sessions] == [(1, 2)]
    finally:
        proc.kill()
        proc.wait()
    events = [json.loads(x) for x in journal.read_text().splitlines()[len(earlier) + 1:]]
    assert events[0]["event"] == "resumed" and events[0]["done"] == 1
    assert not [e for e in events if e["event"] == "result"]
    assert {"event": "interrupted", "session": "t#1.1"}.items() <= next(
        e for e in events if e["event"] == "interrupted").items()
