"""Early acceptance over real ZeroMQ: a task's group is decided at `accept` finished samples (or a
fraction after a grace), its tail is cancelled (queued at once, running at its gateway) and is never
run again: not after its gateway is lost, not after the orchestrator restarts from its journal
(a requeued job), where the decided group is never reopened and a tail's record never adopted; a
task a trainer submits to a service run is decided the same way."""

from __future__ import annotations

import json
from pathlib import Path

import zmq

from polar_hpc import wire
from polar_hpc.shards import ShardWriter
from polar_hpc.shards.decisions import Decisions
from tests.orchestrator.helpers import Gateway, next_message, start_orchestrator, wait_for
from tests.shards.helpers import make_trajectory

TOPOLOGY = "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: {timeout}\n"


def _task(**fields) -> dict:
    return {"id": "g", "instruction": "hi", "harness": {"command": "true"}, **fields}


def _sample(session_id: str) -> int:
    return int(session_id.split("#")[1].split(".")[0])


def _result(session_id: str, status: str = "completed", shard: str = "gw-000001.shard") -> wire.Result:
    return wire.Result(session_id=session_id, status=status, reward=1.0 if status == "completed" else None,
                       n_calls=1, n_traces=1, n_tokens=10, shard=shard)


def _finish(samples: tuple[int, ...]):
    """A gateway's `serve`: these samples finish at once, the others run until cancelled."""
    return lambda ids: [_result(sid) for sid in ids if _sample(sid) in samples]


def _events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def _results(run_dir: Path) -> dict[int, dict]:
    return {e["sample"]: e for e in _events(run_dir, "result")}


def _status(ctx, endpoint: str) -> wire.StatusReply:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    try:
        sock.send(wire.encode(wire.StatusRequest()))
        return next_message(sock, wire.StatusReply)
    finally:
        sock.close(linger=0)


def _cancels(gw: Gateway) -> set[str]:
    return {m.session_id for m in gw.messages if isinstance(m, wire.Cancel)}


def test_decided_group_is_never_reopened_after_a_restart(tmp_path: Path, ctx) -> None:
    task = _task(num_samples=5, accept=2)
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY.format(timeout=30), task)
    gw = Gateway(ctx, endpoint, "gw", 4, serve=_finish((0, 1)))  # 2 and 3 run on; 4 waits in the queue
    try:
        wait_for(lambda: _cancels(gw) == {"g#2.0", "g#3.0"}, "the running tail cancelled at its gateway")
        (decided,) = _events(tmp_path, "decided")
        assert (decided["accepted"], decided["cancelled"], decided["reason"]) == ([0, 1], [2, 3, 4], "accept")
        queued_tail = _results(tmp_path)[4]
        assert (queued_tail["status"], queued_tail["shard"]) == ("cancelled", "")  # never started
        tail = make_trajectory("g", 2)  # the gateway wrote the tail's record, completed, as the job stopped
        with ShardWriter(tmp_path / "shards", "gw", max_bytes=1 << 20, max_age_s=60) as w:
            w.append(tail)
    finally:
        gw.stop()
        proc.terminate()
        assert proc.wait(30) == 0
    assert {e["session"] for e in _events(tmp_path, "interrupted")} == {"g#2.0", "g#3.0"}

    (tmp_path / "rendezvous.json").unlink()
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY.format(timeout=30), task)  # the requeued job
    again = Gateway(ctx, endpoint, "gw2", 4, serve=_finish((0, 1, 2, 3, 4)))
    try:
        wait_for(lambda: _status(ctx, endpoint).done, "the run done without running anything")
        status = _status(ctx, endpoint)
        assert status.states == {"completed": 2, "cancelled": 3}
        assert again.ran == []
    finally:
        again.stop()
        proc.kill()
        proc.wait()
    assert len(_events(tmp_path, "decided")) == 1  # decided once, never reopened
    results = _results(tmp_path)
    assert {i: (results[i]["status"], results[i]["shard"]) for i in (2, 3)} == {
        2: ("cancelled", ""), 3: ("cancelled", "")}  # cancelled again, not run, not adopted from its record
    assert not any(e.get("adopted") for e in _events(tmp_path, "result"))
    decisions = Decisions(tmp_path)
    decisions.update()
    assert decisions.groups == {"g": frozenset({0, 1})} and decisions.complete() and not decisions.problems


def test_running_tail_is_cancelled_and_its_late_result_does_not_count(tmp_path: Path, ctx) -> None:
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY.format(timeout=30), _task(num_samples=4, accept=2))

    def answer(msg: wire.Message) -> list[wire.Message]:  # sample 3 had finished when its Cancel came
        if not isinstance(msg, wire.Cancel):
            return []
        late = _sample(msg.session_id) == 3
        return [_result(msg.session_id, "completed" if late else "cancelled", "gw-000002.shard")]

    gw = Gateway(ctx, endpoint, "gw", 4, serve=_finish((0, 1)), answer=answer)
    try:
        wait_for(lambda: _status(ctx, endpoint).done, "every session ended")
        assert _status(ctx, endpoint).states == {"completed": 2, "cancelled": 2}
    finally:
        gw.stop()
        proc.kill()
        proc.wait()
    results = _results(tmp_path)
    assert (results[3]["status"], results[3]["shard"], results[3]["reward"]) == ("cancelled", "", None)
    assert (results[3]["reported"], results[3]["written"]) == ("completed", "gw-000002.shard")
    assert (results[2]["status"], results[2]["shard"]) == ("cancelled", "")


def test_tail_of_a_lost_gateway_is_not_requeued(tmp_path: Path, ctx) -> None:
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY.format(timeout=1.0), _task(num_samples=3, accept=1))
    gw = Gateway(ctx, endpoint, "gw", 3, serve=_finish((0,)))
    try:
        wait_for(lambda: _cancels(gw) == {"g#1.0", "g#2.0"}, "the tail cancelled at its gateway")
        gw.stop()  # silent from now on, the Cancels unanswered
        other = Gateway(ctx, endpoint, "other", 3, serve=_finish((0, 1, 2)))
        wait_for(lambda: _status(ctx, endpoint).done, "the lost gateway's tail ended, cancelled")
        assert other.ran == [] and not _events(tmp_path, "requeued")
        other.stop()
    finally:
        proc.kill()
        proc.wait()
    assert {e["session"]: e["status"] for e in _events(tmp_path, "result")} == {
        "g#0.0": "completed", "g#1.0": "cancelled", "g#2.0": "cancelled"}


def test_group_decided_by_fraction_after_its_grace(tmp_path: Path, ctx) -> None:
    task = _task(num_samples=4, accept=4, accept_fraction=0.5, accept_grace_s=0.2)
    proc, endpoint = start_orchestrator(tmp_path, TOPOLOGY.format(timeout=30), task)
    gw = Gateway(ctx, endpoint, "gw", 4, serve=_finish((0, 1)),
                 answer=lambda m: [_result(m.session_id, "cancelled")] if isinstance(m, wire.Cancel) else [])
    try:
        wait_for(lambda: _status(ctx, endpoint).done, "the group decided by its fraction, the rest cancelled")
    finally:
        gw.stop()
        proc.kill()
        proc.wait()
    (decided,) = _events(tmp_path, "decided")
    assert (decided["accepted"], decided["cancelled"], decided["reason"]) == ([0, 1], [2, 3], "fraction")


def test_a_task_submitted_to_a_service_run_is_decided_too(tmp_path: Path, ctx) -> None:
    topology = TOPOLOGY.format(timeout=30) + "service:\n  enabled: true\n"
    proc, endpoint = start_orchestrator(tmp_path, topology, None)
    gw = Gateway(ctx, endpoint, "gw", 3, serve=_finish((0,)),
                 answer=lambda m: [_result(m.session_id, "cancelled")] if isinstance(m, wire.Cancel) else [])
    trainer = ctx.socket(zmq.DEALER)
    trainer.connect(endpoint)
    try:
        trainer.send(wire.encode(wire.SubmitTasks(batch_id="b", tasks=[_task(num_samples=3, accept=1)])))
        assert next_message(trainer, wire.Submitted).added == ["g"]

        def batch() -> wire.BatchState:
            trainer.send(wire.encode(wire.BatchStatusRequest(batch_id="b")))
            return next_message(trainer, wire.BatchStatus).batches["b"]

        wait_for(lambda: batch().done, "the batch done: its group decided, its tail cancelled")
        assert batch().states == {"completed": 1, "cancelled": 2}
    finally:
        trainer.close(linger=0)
        gw.stop()
        proc.kill()
        proc.wait()
    (decided,) = _events(tmp_path, "decided")
    assert (decided["accepted"], decided["cancelled"]) == ([0], [1, 2])
