"""The orchestrator's receive loop against hostile peers, with and without the run's keys: any
frame count, size or content is dropped and logged; each role sends only its own message kinds;
a real gateway's session still completes afterwards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from polar_hpc import security, wire
from tests.orchestrator.helpers import reply, start_orchestrator
from tests.orchestrator.hostile import raw_tcp_junk, send_junk

TOPOLOGY = "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 5.0\n"
TASK = {"id": "t", "instruction": "hi", "num_samples": 2, "harness": {"command": "true"}}


def _peer(ctx, endpoint: str, run_dir: Path, role: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    security.secure_client(sock, run_dir, role)
    sock.connect(endpoint)
    return sock


_reply = reply


def _ask(sock: zmq.Socket, msg: wire.Message, kind=wire.Message):
    sock.send(wire.encode(msg))
    return _reply(sock, kind)


def _result(session_id: str) -> wire.Result:
    return wire.Result(session_id=session_id, status="completed", reward=1.0, n_calls=1, n_traces=1, n_tokens=5,
                       shard="g-000001.shard")


def _run_one_session(ctx, endpoint: str, run_dir: Path) -> None:
    """A gateway takes both sessions and finishes them; the admin sees the run done and stops it."""
    gw = _peer(ctx, endpoint, run_dir, security.GATEWAY)
    gw.send(wire.encode(wire.Hello(gateway_id="g", host="h", slots=2)))
    gw.send(wire.encode(wire.Credit(n=2)))
    for spec in _reply(gw, wire.Assign).sessions:
        gw.send(wire.encode(_result(spec.session_id)))
    admin = _peer(ctx, endpoint, run_dir, security.ADMIN)
    deadline = time.monotonic() + 60
    while not (status := _ask(admin, wire.StatusRequest(), wire.StatusReply)).done:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert status.states == {"completed": 2}
    admin.send(wire.encode(wire.Shutdown(reason="test")))
    assert _reply(gw, wire.Shutdown) is not None


@pytest.mark.parametrize("keyed", [True, False], ids=["keys", "no-keys"])
def test_any_multipart_leaves_the_loop_alive(tmp_path: Path, ctx, keyed: bool) -> None:
    if keyed:
        security.create_keys(tmp_path)
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY, TASK)
    try:
        hostile = _peer(ctx, endpoint, tmp_path, security.CLIENT)  # keyed: a holder of the client key
        send_junk(hostile)
        raw_tcp_junk(endpoint)
        send_junk(hostile)  # again, after the oversized frame dropped its connection
        assert _ask(hostile, wire.StatusRequest(), wire.StatusReply).states == {"queued": 2}
        _run_one_session(ctx, endpoint, tmp_path)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    log = proc.stdout.read().decode()
    assert "4 frames where 2 belong" in log and "51 frames where 2 belong" in log and "undecodable" in log
    assert "Traceback" not in log


def test_each_role_sends_only_its_own_kinds(tmp_path: Path, ctx) -> None:
    security.create_keys(tmp_path)
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY, TASK)
    try:
        gw = _peer(ctx, endpoint, tmp_path, security.GATEWAY)
        gw.send(wire.encode(wire.Hello(gateway_id="g", host="h", slots=1)))
        gw.send(wire.encode(wire.Credit(n=1)))
        (spec,) = _reply(gw, wire.Assign).sessions

        client = _peer(ctx, endpoint, tmp_path, security.CLIENT)
        engine = _peer(ctx, endpoint, tmp_path, security.ENGINE)
        other_gw = _peer(ctx, endpoint, tmp_path, security.GATEWAY)
        other_gw.send(wire.encode(wire.Hello(gateway_id="g2", host="h", slots=1)))
        for intruder in (client, engine, other_gw):  # none of them runs the session
            intruder.send(wire.encode(wire.SessionUpdate(session_id=spec.session_id, state="POSTRUN", t=0.0)))
            intruder.send(wire.encode(_result(spec.session_id)))
        for intruder in (client, engine):
            intruder.send(wire.encode(wire.Hello(gateway_id="fake", host="h", slots=9)))
            intruder.send(wire.encode(wire.Credit(n=9)))
            intruder.send(wire.encode(wire.Shutdown(reason="intruder")))
        client.send(wire.encode(wire.EngineHello(engine_id="e", url="http://evil:1", weight_version="v9", host="h")))
        client.send(wire.encode(wire.Assign(sessions=[spec])))  # a kind nobody sends the orchestrator
        for intruder in (client, engine, other_gw):  # the same news in one Report
            intruder.send(wire.encode(wire.Report(items=[wire.SessionUpdate(session_id=spec.session_id, state="RUN",
                                                                            t=0.0), _result(spec.session_id)])))
        assert _reply(client, wire.Assign, 0.5) is None and _reply(engine, wire.Assign, 0.1) is None
        for request in (wire.SubmitTasks(batch_id="b", tasks=[TASK | {"id": "u"}]),
                        wire.UpdateWeights(model_path="/w", weight_version="v1"),
                        wire.CancelTasks(task_id="t"), wire.Drain()):  # service-run requests, in a batch run
            refused = _ask(client, request, wire.Refused)
            assert refused is not None and "not a service run" in refused.error, request
        refused = _ask(gw, wire.StatusRequest(), wire.Refused)  # a gateway asks no status
        assert refused is not None and "the gateway key may not send it" in refused.error

        status = _ask(client, wire.StatusRequest(), wire.StatusReply)
        assert status.states == {"assigned": 1, "queued": 1} and status.gateways == 2, status
        assert not [m for m in status.members if m.kind == "engine"]  # the client's EngineHello was refused
        gw.send(wire.encode(_result(spec.session_id)))  # from the gateway that runs it
        deadline = time.monotonic() + 60
        while _ask(client, wire.StatusRequest(), wire.StatusReply).states.get("completed") != 1:
            assert time.monotonic() < deadline
        admin = _peer(ctx, endpoint, tmp_path, security.ADMIN)
        admin.send(wire.encode(wire.Shutdown(reason="test")))
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    events = [json.loads(x) for x in (tmp_path / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    assert [e["session"] for e in events if e["event"] == "result"] == [spec.session_id]
    assert not [e for e in events if e["event"] in ("engine_up", "state") or e.get("gateway") == "fake"]
    assert [e["reason"] for e in events if e["event"] == "shutdown"] == ["test"]
    log = proc.stdout.read().decode()
    assert "not a gateway running it" in log and "refused Shutdown: the client key may not send it" in log
    assert "refused Hello: the engine key may not send it" in log and "Traceback" not in log
    assert "refused Report: the client key may not send it" in log
