"""How a gateway's pipeline ends sessions early. A stopping gateway's drain fits its budget:
sessions are cancelled and written as such, and one whose proxy never answers (a proxy already
gone) is cut at the budget instead of holding the stop, so the shard is sealed while Slurm's
KillWait still runs. A Cancel that reaches a session after its harness has ended (a decided group's
tail that finished as the group was decided) leaves it to write its result, in POSTRUN and waiting
for a POSTRUN slot: cancelled there, the session used to end with no result, and the orchestrator
waited for it forever (bench/async.py's over-provisioned run never drained). Real pipeline, `none`
sandboxes running real harness processes, a real shard writer; the proxy link is the one part
played here."""

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
    """A proxy that answers a session's close once `release` is set (as one waiting for the
    session's calls in flight to stop), and never `silent`'s."""

    url = "http://127.0.0.1:9"
    socket = None

    def __init__(self, silent: str | None = None) -> None:
        self.silent = silent
        self.release = asyncio.Event()
        self.closing: list[str] = []

    async def open(self, session_id: str, token: str, task_id: str) -> None:
        return None

    async def close(self, session_id: str) -> list[wire.CallRecord]:
        self.closing.append(session_id)
        if session_id == self.silent:
            await asyncio.Event().wait()
        await self.release.wait()
        return []


def _start(tmp_path: Path, link: _Link, pools: PoolConfig, command: str,
           sent: list[wire.Message]) -> tuple[Pipeline, ShardWriter]:
    """A pipeline running two samples of a task whose harness is `command`."""
    make_sandbox, _ = backend(SandboxConfig(backend="none"), tmp_path)
    task = Task.model_validate({"id": "t", "instruction": "x", "num_samples": 2, "timeout_s": 600,
                                "harness": {"command": command}})
    writer = ShardWriter(tmp_path / "shards", "gw", 1 << 30, 3600)
    pipeline = Pipeline(pools, make_sandbox, tmp_path / "work", link, writer, sent.append)
    for i in range(2):
        pipeline.assign(wire.SessionSpec(session_id=f"t#{i}.0", task=task.model_dump(mode="json"),
                                         sample_index=i, attempt=0, deadline=time.time() + 600))
    return pipeline, writer


def _written(tmp_path: Path) -> list[tuple[str, str]]:
    return sorted((t.session_id, t.status) for t in iter_trajectories(tmp_path / "shards"))


@pytest.mark.timeout(300)
def test_drain_writes_what_it_can_and_cuts_a_session_whose_proxy_is_gone(tmp_path: Path) -> None:
    sent: list[wire.Message] = []

    async def main() -> None:
        link = _Link(silent="t#1.0")
        link.release.set()
        pipeline, writer = _start(tmp_path, link, PoolConfig(), "sleep 600", sent)
        while sum(isinstance(m, wire.SessionUpdate) and m.state == "RUN" for m in sent) < 2:
            await asyncio.sleep(0.05)  # both harnesses running
        await pipeline.drain(within_s=15.0)  # the silent one is cut then; the other is written well before on a busy machine
        assert not pipeline.sessions
        writer.close()

    asyncio.run(main())
    assert _written(tmp_path) == [("t#0.0", "cancelled")]
    assert not list((tmp_path / "shards").glob(".*.tmp"))
    assert [m.session_id for m in sent if isinstance(m, wire.Result)] == ["t#0.0"]


@pytest.mark.timeout(120)
def test_a_cancel_after_the_harness_ended_still_gets_the_result(tmp_path: Path) -> None:
    sent: list[wire.Message] = []

    async def main() -> None:
        link = _Link()
        pools = PoolConfig(init=2, ready=2, run=2, postrun=1)  # one session in POSTRUN, the other waits for it
        pipeline, writer = _start(tmp_path, link, pools, "true", sent)
        while not (link.closing and len(pipeline._finishing) == 2):
            await asyncio.sleep(0.02)  # both harnesses ended: one session closing in POSTRUN, one waiting for the slot
        for sid in ("t#0.0", "t#1.0"):
            pipeline.cancel(sid)
        for _ in range(3):  # the cancels are delivered on the loop's next turns
            await asyncio.sleep(0)
        link.release.set()
        while len([m for m in sent if isinstance(m, wire.Result)]) < 2:
            assert pipeline.sessions, "a session ended without a result"
            await asyncio.sleep(0.02)
        writer.close()

    asyncio.run(main())
    assert {m.session_id: m.status for m in sent if isinstance(m, wire.Result)} == {"t#0.0": "completed",
                                                                                    "t#1.0": "completed"}
    assert _written(tmp_path) == [("t#0.0", "completed"), ("t#1.0", "completed")]
