"""A resumed run adopts what its earlier life wrote but never journaled: a real orchestrator
process on a run directory whose journal says `interrupted` while the shards hold the result."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import zmq

from polar_hpc import wire
from polar_hpc.shards.reader import iter_trajectories
from polar_hpc.shards.writer import ShardWriter
from tests.orchestrator.helpers import start_orchestrator
from tests.shards.helpers import make_trajectory

TASK = {"id": "t", "instruction": "hi", "num_samples": 5, "harness": {"command": "true"}}


def _traj(sample: int, attempt: int, status: str = "completed"):
    t = make_trajectory("t", sample, status, 1.0 if status == "completed" else None)
    return msgspec.structs.replace(t, session_id=f"t#{sample}.{attempt}", attempt=attempt)


def test_a_sealed_result_of_an_interrupted_attempt_is_adopted_not_rerun(tmp_path: Path) -> None:
    run, shards = tmp_path, tmp_path / "shards"
    earlier = [{"event": "queued", "session": f"t#{i}.0", "task": "t", "sample": i, "attempt": 0} for i in range(5)]
    earlier += [{"event": "assigned", "session": f"t#{i}.0", "gateway": "gw-a", "attempt": 0} for i in range(5)]
    earlier += [{"event": "state", "session": "t#0.0", "state": "POSTRUN"},
                {"event": "requeued", "session": "t#3.1", "previous": "t#3.0", "attempt": 1}]
    earlier += [{"event": "interrupted", "session": f"t#{i}.0", "reason": "orchestrator stopping"} for i in (0, 1, 2)]
    (run / "journal").mkdir()
    (run / "journal" / "orchestrator.jsonl").write_text("".join(json.dumps(e) + "\n" for e in earlier))
    with ShardWriter(shards, "gw-a", 1 << 20, 60) as w:  # sealed after the orchestrator had stopped
        w.append(_traj(0, 0))
        w.append(_traj(2, 0, "cancelled"))  # cut short by its stopping gateway: runs again
        w.append(_traj(3, 0))  # requeued while the run went on (its gateway was lost): a stray
    killed = ShardWriter(shards, "gw-b", 1 << 20, 60)  # a gateway killed before it sealed
    killed.append(_traj(1, 0))
    assert [p.name for p in shards.glob(".gw-b-*.tmp")]
    proc, endpoint = start_orchestrator(run, "gateway:\n  heartbeat_s: 0.1\n  peer_timeout_s: 5.0\n", TASK)
    ctx = zmq.Context()
    try:
        gw = ctx.socket(zmq.DEALER)
        gw.connect(endpoint)
        for msg in (wire.Hello(gateway_id="gw-c", host="h", slots=8), wire.Credit(n=8), wire.StatusRequest()):
            gw.send(wire.encode(msg))
        got: list = []
        while not any(isinstance(m, wire.StatusReply) for m in got) and gw.poll(5000):
            got.append(wire.decode(gw.recv()))  # in order: the dispatch first, then the reply
        sessions = sorted(s.session_id for m in got if isinstance(m, wire.Assign) for s in m.sessions)
        assert sessions == ["t#2.1", "t#3.2", "t#4.1"]  # samples 0 and 1 are not run again
        status = next(m for m in got if isinstance(m, wire.StatusReply))  # answered after the dispatch
        assert status.states == {"completed": 2, "assigned": 3}
    finally:
        proc.kill()
        proc.wait()
        ctx.destroy(linger=0)
    events = [json.loads(x) for x in (run / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    adopted = sorted((e["session"], e["shard"]) for e in events if e["event"] == "result")
    assert adopted == [("t#0.0", "gw-a-000001.shard"), ("t#1.0", "gw-b-000001.shard")]
    assert all(e.get("adopted") for e in events if e["event"] == "result")
    assert not list(shards.glob(".*.tmp"))  # the killed writer's shard is sealed, readable
    read = sorted(t.session_id for t in iter_trajectories(run))
    assert read == ["t#0.0", "t#1.0", "t#2.0"]  # the stray is skipped; sample 2 is undecided until it ends
