"""Real harnesses, installed from their registries, run unchanged in the sandbox through the proxy
(tito mode) and the scripted engine (examples/harnesses/rules.yaml), and solve the calculator task:
each session is one token-exact trace over the API its harness speaks.

The npm harnesses are looked up under .ci/node (where .ci/run installs them) and on PATH; a
missing one is skipped with its install line, or fails when POLAR_REQUIRE_HARNESSES is set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import polar
from e2e.helpers import check_fidelity, engine_samples, trajectories

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harnesses"
NODE_BIN = EXAMPLES.parents[1] / ".ci" / "node" / "node_modules" / ".bin"
PATH = f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"

pytestmark = pytest.mark.timeout(300)  # one harness run: two sessions, a few engine calls each


class Harness(NamedTuple):
    kind: str
    api: str
    streamed: bool
    exe: str | None = None  # the npm harness's command, None for mini (in the dev group)
    package: str | None = None  # its npm package, pinned as .ci/run pins it


HARNESSES = [
    Harness("mini_swe_agent", "openai_chat", streamed=False),
    Harness("codex", "openai_responses", True, "codex", "@openai/codex@0.171.0"),
    Harness("claude_code", "anthropic_messages", True, "claude", "@anthropic-ai/claude-code@2.1.332"),
    Harness("opencode", "openai_chat", True, "opencode", "opencode-ai@1.18.33"),
    Harness("qwen_code", "openai_chat", True, "qwen", "@qwen-code/qwen-code@0.24.4"),
]


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


@pytest.mark.parametrize("harness", HARNESSES, ids=[h.kind for h in HARNESSES])
def test_harness_solves_the_calculator(harness: Harness, tmp_path: Path) -> None:
    if harness.exe and shutil.which(harness.exe, path=PATH) is None:
        if os.environ.get("POLAR_REQUIRE_HARNESSES"):
            pytest.fail(f"{harness.exe} is not installed (.ci/run installs it under .ci/node)")
        pytest.skip(f"{harness.exe} is not installed: npm install --prefix .ci/node {harness.package}")
    run_dir = tmp_path / "run"
    result = polar("run", EXAMPLES / f"{harness.kind}.yaml", "-c", EXAMPLES / "topology.yaml",
                   "--run-dir", run_dir, timeout=280, env={**os.environ, "PATH": PATH})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 written: 2 completed" in result.stdout
    task_id = "calculator-" + harness.kind.replace("_", "-")
    check_sessions(run_dir, task_id, 2, harness.api, harness.streamed)
