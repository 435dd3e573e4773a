"""Real harnesses, installed from their registries, run unchanged in the sandbox through the proxy
(tito mode) and the scripted engine (examples/harnesses/rules.yaml), and solve the calculator task.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import polar
from e2e.helpers import check_fidelity, engine_samples, trajectories

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harnesses"


CODEX_BIN = EXAMPLES.parents[1] / ".ci" / "node" / "node_modules" / ".bin"


def run(task: str, run_dir: Path, **kwargs) -> str:
    result = polar("run", EXAMPLES / task, "-c", EXAMPLES / "topology.yaml", "--run-dir", run_dir,
                   timeout=300, **kwargs)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def check_sessions(run_dir: Path, task_id: str, n: int, api: str, streamed: bool) -> None:
    samples = engine_samples(run_dir)
    trajs = trajectories(run_dir)
    assert [(t.task_id, t.sample_index) for t in trajs] == [(task_id, i) for i in range(n)]
    for t in trajs:
        assert (t.status, t.reward) == ("completed", 1.0), t.metadata
        assert t.metadata["chains"] == 1 and t.metadata["chain_breaks"] == []
        assert len(t.traces) == 1, "each agent thread is one token-exact trace"
        calls = check_fidelity(t.traces[0], samples)
        assert calls == len(t.traces[0].call_indices) >= 2
        assert t.metadata["apis"] == [api]
        assert (t.metadata["streamed_calls"] == calls) is streamed


def test_mini_swe_agent_solves_the_calculator(tmp_path: Path) -> None:
    out = run("mini_swe_agent.yaml", tmp_path / "run")
    assert "2 written: 2 completed" in out
    check_sessions(tmp_path / "run", "calculator-mini-swe-agent", 2, "openai_chat", streamed=False)


def test_codex_solves_the_calculator(tmp_path: Path) -> None:
    path = f"{CODEX_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("codex", path=path) is None:
        if os.environ.get("POLAR_REQUIRE_HARNESSES"):
            pytest.fail("codex is not installed (.ci/run installs it under .ci/node)")
        pytest.skip("codex is not installed: npm install --prefix .ci/node @openai/codex@0.171.0")
    out = run("codex.yaml", tmp_path / "run", env={**os.environ, "PATH": path})
    assert "2 written: 2 completed" in out
    check_sessions(tmp_path / "run", "calculator-codex", 2, "openai_responses", streamed=True)
