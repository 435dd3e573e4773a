"""A harness stopped from outside by a stop signal ends its session `cancelled` (the orchestrator
journals it `interrupted` and runs it again), never `error`, when its gateway's own stop follows: a
Slurm stop (scancel of a grow job, preemption, requeue) signals every process of the step, and the
harness may die and be seen dead before its gateway notices its own SIGTERM. With no stop of the
gateway within the grace, it is the harness's own error: a harness that signals itself or exits 143
cannot have itself run again forever. Held in flight: each harness writes its pid and sleeps until
the test signals it. A session that ends `error` once the drain has begun is `cancelled` too (held
in POSTRUN by its proxy's close until the drain begins).
Real pipeline, `none` sandboxes, real harness processes, a real shard writer; the proxy link is the
one part played here."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from polar_hpc import wire
from polar_hpc.config import PoolConfig, SandboxConfig, Task
from polar_hpc.gateway.pipeline import Pipeline
from polar_hpc.sandbox import backend
from polar_hpc.shards.reader import iter_trajectories
from polar_hpc.shards.writer import ShardWriter
from tests.gateway.test_drain import _Link


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gateway_stops", [True, False])
def test_a_harness_killed_by_a_stop_signal_is_cancelled_if_its_gateway_stops(tmp_path: Path,
                                                                              gateway_stops: bool) -> None:
    make_sandbox, _ = backend(SandboxConfig(backend="none"), tmp_path)
    commands = {  # task -> harness; each writes its pid, then waits for the test's signal
        "term": f"echo $$ > {tmp_path}/term.pid && exec sleep 600",  # dies of SIGTERM: -15
        "shell": f"trap 'exit 143' TERM; echo $$ > {tmp_path}/shell.pid; sleep 600 & wait",  # 128 + 15, as bwrap says it
        "hup": f"echo $$ > {tmp_path}/hup.pid && exec sleep 600",
        "killed": f"echo $$ > {tmp_path}/killed.pid && exec sleep 600",  # SIGKILL is no stop signal (an OOM kill)
        "crash": f"echo $$ > {tmp_path}/crash.pid; exit 3",  # its own failure
    }
    sent: list[wire.Message] = []

    async def main() -> None:
        writer = ShardWriter(tmp_path / "shards", "gw", 1 << 30, 3600)
        link = _Link()
        link.release.set()  # closes answered at once
        pipeline = Pipeline(PoolConfig(), make_sandbox, tmp_path / "work", link, writer, sent.append)
        if not gateway_stops:
            pipeline.stop_grace_s = 0.2  # no stop comes: the grace only delays the error
        for name, command in commands.items():
            task = Task.model_validate({"id": name, "instruction": "x", "timeout_s": 600, "harness": {"command": command}})
            pipeline.assign(wire.SessionSpec(session_id=f"{name}#0.0", task=task.model_dump(mode="json"),
                                             sample_index=0, attempt=0, deadline=time.time() + 600))
        pids = {name: tmp_path / f"{name}.pid" for name in commands}
        while not all(p.exists() and p.read_text().strip() for p in pids.values()):
            await asyncio.sleep(0.05)  # every harness running
        os.kill(int(pids["term"].read_text()), signal.SIGTERM)
        os.kill(int(pids["shell"].read_text()), signal.SIGTERM)
        os.kill(int(pids["hup"].read_text()), signal.SIGHUP)
        os.kill(int(pids["killed"].read_text()), signal.SIGKILL)
        if gateway_stops:  # once the pipeline has seen every harness end, the gateway's stop begins
            while not all(f"{name}#0.0" in pipeline._finishing or f"{name}#0.0" not in pipeline.sessions
                          for name in commands):
                await asyncio.sleep(0.05)
            await pipeline.drain(60)
        while pipeline.sessions:
            await asyncio.sleep(0.05)
        writer.close()

    asyncio.run(main())
    results = {m.session_id.split("#")[0]: (m.status, m.error) for m in sent if isinstance(m, wire.Result)}
    if gateway_stops:  # the stop's signals: cancelled (run again)
        stopped = {name: ("cancelled", f"harness stopped by {sig} from outside the gateway")
                   for name, sig in (("term", "SIGTERM"), ("shell", "SIGTERM"), ("hup", "SIGHUP"))}
    else:  # signals with no stop: the harness's own error
        stopped = {name: ("error", f"harness exited with code {code} ({sig}; no stop of the gateway followed "
                                   "within 0.2s)")
                   for name, code, sig in (("term", -15, "SIGTERM"), ("shell", 143, "SIGTERM"), ("hup", -1, "SIGHUP"))}
    assert results == {**stopped, "killed": ("error", "harness exited with code -9"),
                       "crash": ("error", "harness exited with code 3")}, results
    written = {t.task_id: t.status for t in iter_trajectories(tmp_path / "shards")}
    assert written == {name: status for name, (status, _) in results.items()}


@pytest.mark.timeout(120)
def test_an_error_that_ends_once_the_drain_began_is_cancelled(tmp_path: Path) -> None:
    make_sandbox, _ = backend(SandboxConfig(backend="none"), tmp_path)
    sent: list[wire.Message] = []

    async def main() -> None:
        writer = ShardWriter(tmp_path / "shards", "gw", 1 << 30, 3600)
        link = _Link()  # closes held until released: the sessions stay in POSTRUN
        pipeline = Pipeline(PoolConfig(), make_sandbox, tmp_path / "work", link, writer, sent.append)
        for name, command in {"fails": "exit 1", "works": "true"}.items():
            task = Task.model_validate({"id": name, "instruction": "x", "timeout_s": 600, "harness": {"command": command}})
            pipeline.assign(wire.SessionSpec(session_id=f"{name}#0.0", task=task.model_dump(mode="json"),
                                             sample_index=0, attempt=0, deadline=time.time() + 600))
        while sum(isinstance(m, wire.SessionUpdate) and m.state == "POSTRUN" for m in sent) < 2:
            await asyncio.sleep(0.05)  # both harnesses ended; their closes held
        drain = asyncio.create_task(pipeline.drain(within_s=60.0))
        await asyncio.sleep(0)  # the drain has begun
        link.release.set()
        await drain
        writer.close()

    asyncio.run(main())
    results = {m.session_id.split("#")[0]: (m.status, m.error) for m in sent if isinstance(m, wire.Result)}
    assert results == {"fails": ("cancelled", "harness exited with code 1 (while the gateway stopped)"),
                       "works": ("completed", None)}, results
