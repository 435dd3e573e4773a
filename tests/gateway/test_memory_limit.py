"""A task's `sandbox.memory_mb` at the gateway (sandbox/cgroups.py): a real gateway (its proxy, real
bwrap sandboxes) driven by the scripted orchestrator of test_sandbox_cgroups; a session that allocates
past its memory limit ends `error` naming the limit, benign sessions beside it complete, the gateway
keeps heartbeating and exits cleanly when told."""

from __future__ import annotations

import time

import pytest

from gateway.test_sandbox_cgroups import _Orchestrator, _run_folders, orchestrator  # noqa: F401 (a fixture)
from polar_hpc import wire
from polar_hpc.config import Task

HOG = "python3 -c 'b = bytearray(512 << 20); print(len(b))'"


def _assign(orch: _Orchestrator, task_id: str, command: str, memory_mb: int | None) -> None:
    task = Task(id=task_id, instruction="-", timeout_s=60, harness={"command": command},
                sandbox={"memory_mb": memory_mb})
    orch.send(wire.Assign(sessions=[wire.SessionSpec(session_id=task_id, task=task.model_dump(mode="json"),
                                                     sample_index=0, attempt=0, deadline=time.time() + 60)]))


@pytest.mark.timeout(300)
def test_a_session_over_its_memory_limit_ends_error_and_only_it(orchestrator: _Orchestrator) -> None:  # noqa: F811
    gateway = orchestrator.start_gateway()
    _assign(orchestrator, "hog", HOG, 64)
    _assign(orchestrator, "within", "python3 -c 'b = bytearray(16 << 20)' && sleep 2", 64)
    _assign(orchestrator, "unbounded", "python3 -c 'b = bytearray(128 << 20)' && sleep 1", None)
    orchestrator.pump(lambda: len(orchestrator.results) == 3, 120)
    results = orchestrator.results
    assert (results["hog"].status, results["hog"].error) == (
        "error", "harness killed: memory limit exceeded (memory_mb=64)"), results["hog"]
    assert results["within"].status == "completed" and results["unbounded"].status == "completed", results
    assert gateway.poll() is None, "the gateway must not have stopped"
    orchestrator.send(wire.Shutdown(reason="test over"))
    assert gateway.wait(30) == 0
    assert not _run_folders(orchestrator.run_dir)
