"""The README's first command, end to end: 8 calculator sessions, real processes, real tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import polar
from e2e.helpers import check_fidelity, engine_samples, trajectories, write_jsonl


@pytest.fixture(scope="module")
def calculator_run(tmp_path_factory, calculator_dir: Path) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("calc")
    topo = tmp / "topology.yaml"
    topo.write_text("engine:\n  sample_log: true\n")
    run_dir = tmp / "run"
    result = polar("run", calculator_dir / "task.yaml", "-c", topo, "--run-dir", run_dir, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result.stdout


@pytest.fixture(scope="module")
def calculator_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "calculator"


def test_summary_reports_all_sessions_completed(calculator_run) -> None:
    run_dir, out = calculator_run
    assert "8 written: 8 completed" in out
    assert "1.000" in out  # mean reward
    assert str(run_dir / "shards") in out


def test_prefix_merge_gives_one_trace_per_session(calculator_run) -> None:
    run_dir, _ = calculator_run
    trajs = trajectories(run_dir)
    assert [(t.task_id, t.sample_index) for t in trajs] == [("calculator-basic", i) for i in range(8)]
    for t in trajs:
        assert t.status == "completed" and t.reward == 1.0
        assert len(t.traces) == 1, "tool call + answer must merge into one token-exact trace"
        assert len(t.traces[0].call_indices) == 2


def test_token_fidelity_against_the_engine_log(calculator_run) -> None:
    """Every sampled token and logprob in the shards is what the engine sampled for that prompt."""
    run_dir, _ = calculator_run
    samples = engine_samples(run_dir)
    for t in trajectories(run_dir):
        assert check_fidelity(t.traces[0], samples) == 2


def test_shards_show_json(calculator_run) -> None:
    run_dir, _ = calculator_run
    result = polar("shards", "show", run_dir, "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 8
    for row in rows:
        assert set(row) == {"task_id", "sample_index", "status", "reward", "traces", "tokens"}
        assert row["status"] == "completed" and row["reward"] == 1.0 and row["traces"] == 1
        assert row["tokens"] > 50
    table = polar("shards", "show", run_dir)
    assert table.returncode == 0 and "calculator-basic" in table.stdout


def test_per_request_gives_one_trace_per_call(tmp_path: Path, calculator_dir: Path) -> None:
    shutil.copy(calculator_dir / "agent.py", tmp_path)  # sandbox files come from the task file's folder
    task = {
        "id": "calc-per-request",
        "instruction": "What is 6 * 7?",
        "num_samples": 2,
        "harness": {"command": "python agent.py"},
        "sandbox": {"files": {"agent.py": "agent.py"}},
        "evaluator": {"kind": "regex", "pattern": "\\b42\\b"},
        "builder": "per_request",
    }
    topo = tmp_path / "topology.yaml"
    topo.write_text("engine:\n  sample_log: true\n")
    run_dir = tmp_path / "run"
    result = polar("run", write_jsonl(tmp_path / "t.jsonl", [task]), "-c", topo, "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    samples = engine_samples(run_dir)
    for t in trajectories(run_dir):
        assert t.status == "completed" and t.reward == 1.0
        assert len(t.traces) == 2
        for trace in t.traces:
            engine = samples[tuple(trace.prompt_ids)]
            assert trace.response_ids.tolist() == engine["output_ids"]
            assert trace.logprobs.tolist() == engine["output_logprobs"]
            assert trace.loss_mask.tolist() == [1] * len(trace.response_ids)
