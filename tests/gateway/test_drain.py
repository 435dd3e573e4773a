"""A stopping gateway's drain fits its budget: sessions are cancelled and written as such, and one
whose proxy never answers (a proxy already gone) is cut at the budget instead of holding the stop,
so the shard is sealed while Slurm's KillWait still runs. Real pipeline, `none` sandboxes running
real harness processes, a real shard writer; the proxy link is the one part played here."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from polar_hpc import wire
from polar_hpc.config import PoolConfig, SandboxConfig, Task
from polar_hpc.gateway.pipeline import Pipeline
from polar_hpc.sandbox import backend
from polar_hpc.shards.reader import iter_trajectories
from polar_hpc.shards.writer import ShardWriter


class _Link:
    """A proxy that answers every session's close but `silent`'s, which it never answers."""

    url = "http://127.0.0.1:9"
    socket = None

    def __init__(self, silent: str) -> None:
        self.silent = silent

    async def open(self, session_id: str, token: str, task_id: str) -> None:
        return None

    async def close(self, session_id: str) -> list[wire.CallRecord]:
        if session_id == self.silent:
            await asyncio.Event().wait()
        return []


@pytest.mark.timeout(300)
def test_drain_writes_what_it_can_and_cuts_a_session_whose_proxy_is_gone(tmp_path: Path) -> None:
    make_sandbox, _ = backend(SandboxConfig(backend="none"), tmp_path)
    task = Task.model_validate({"id": "t", "instruction": "x", "num_samples": 2, "timeout_s": 600,
                                "harness": {"command": "sleep 600"}})
    sent: list[wire.Message] = []

    async def main() -> None:
        writer = ShardWriter(tmp_path / "shards", "gw", 1 << 30, 3600)
        pipeline = Pipeline(PoolConfig(), make_sandbox, tmp_path / "work", _Link("t#1.0"), writer, sent.append)
        for i in range(2):
            pipeline.assign(wire.SessionSpec(session_id=f"t#{i}.0", task=task.model_dump(mode="json"),
                                             sample_index=i, attempt=0, deadline=time.time() + 600))
        while sum(isinstance(m, wire.SessionUpdate) and m.state == "RUN" for m in sent) < 2:
            await asyncio.sleep(0.05)  # both harnesses running
        await pipeline.drain(within_s=15.0)  # the silent one is cut then; the other is written well before on a busy machine
        assert not pipeline.sessions
        writer.close()

    asyncio.run(main())
    assert [(t.session_id, t.status) for t in iter_trajectories(tmp_path / "shards")] == [("t#0.0", "cancelled")]
    assert not list((tmp_path / "shards").glob(".*.tmp"))
    assert [m.session_id for m in sent if isinstance(m, wire.Result)] == ["t#0.0"]
