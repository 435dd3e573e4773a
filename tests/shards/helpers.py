"""Trajectories for shard tests; logprobs are float32 values, as the engine's are."""

from __future__ import annotations

import struct

from polar_hpc.shards.format import encode_record
from polar_hpc.trajectory.model import Trace, Trajectory


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def record_bytes(traj: Trajectory) -> bytes:
    """The on-disk bytes of `traj`'s record (the writer hands its header and payload to the OS
    as separate buffers)."""
    return b"".join(encode_record(traj))


def make_trajectory(
    task: str = "t1", sample: int = 0, status: str = "completed", reward: float | None = 1.0, n: int = 6
) -> Trajectory:
    response = [(7919 * i + sample) % 150000 for i in range(n)]
    trace = Trace(
        prompt_ids=[0, 1, 2**31 - 1, 151643],
        response_ids=response,
        loss_mask=[1 if i % 3 else 0 for i in range(n)],
        logprobs=[0.0 if i % 3 == 0 else f32(-0.1 * i - 1e-7) for i in range(n)],
        messages=[{"role": "user", "content": "hi ünïcode"}, {"role": "assistant", "content": "yo"}],
        tools=[{"type": "function", "function": {"name": "sh", "parameters": {}}}],
        finish_reason="stop",
        weight_versions=["v0", "v1"],
        call_indices=[0, 1],
    )
    return Trajectory(
        session_id=f"{task}#{sample}.0",
        task_id=task,
        sample_index=sample,
        attempt=0,
        status=status,
        reward=reward,
        traces=[trace],
        metadata={"builder": "prefix_merge", "chain_breaks": [], "nested": {"k": [1, 2.5, None]}},
        t_start=1700000000.125,
        t_end=1700000042.5,
    )



def journal(run, *events: dict) -> None:
    """Append orchestrator journal events (as polar_hpc.orchestrator.journal writes them)."""
    import json

    path = run / "journal" / "orchestrator.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def queued(task: str, sample: int) -> dict:
    return {"event": "queued", "session": f"{task}#{sample}.0", "task": task, "sample": sample}


def result(traj: Trajectory, shard: str) -> dict:
    return {"event": "result", "session": traj.session_id, "task": traj.task_id, "sample": traj.sample_index,
            "attempt": traj.attempt, "status": traj.status, "reward": traj.reward, "shard": shard}


def attempt(traj: Trajectory, n: int) -> Trajectory:
    """The same key's trajectory as attempt `n` (its own session id)."""
    import msgspec

    return msgspec.structs.replace(traj, attempt=n, session_id=f"{traj.task_id}#{traj.sample_index}.{n}")
