"""`polar-hpc run` with network `none`: the harness reaches the real proxy through its Unix socket
and the relay, reaches nothing else, and a fork bomb ends its own session with an error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


from conftest import polar
from bwrap_required import needs_bwrap
from polar_hpc.shards.reader import iter_trajectories


@needs_bwrap
def test_network_none_run(tmp_path: Path, calculator_dir: Path) -> None:
    shutil.copy(calculator_dir / "agent.py", tmp_path)  # sandbox files come from the task file's folder
    none = {"network": "none"}
    tasks = [
        {"id": "calc", "instruction": "What is 6 * 7?", "num_samples": 2, "harness": {"command": "python agent.py"},
         "sandbox": none | {"files": {"agent.py": "agent.py"}},
         "evaluator": {"kind": "regex", "pattern": "\\b42\\b"}},
        {"id": "outside", "instruction": "-", "sandbox": none, "harness": {"command":
         "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=5)\""}},
        {"id": "bomb", "instruction": "-", "sandbox": none, "timeout_s": 20,
         "harness": {"command": "f() { f | f & }; f; sleep 100"}},
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "topology.yaml").write_text("sandbox:\n  max_pids: 64\n")
    run_dir = tmp_path / "run"
    result = polar("run", tmp_path / "tasks.jsonl", "-c", tmp_path / "topology.yaml", "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    by_task = {}
    for t in iter_trajectories(run_dir):
        by_task.setdefault(t.task_id, []).append(t)
    calc = by_task["calc"]
    assert [(t.status, t.reward) for t in calc] == [("completed", 1.0)] * 2, [t.metadata for t in calc]
    assert all(t.traces and "untrainable" not in t.metadata for t in calc), [t.metadata for t in calc]
    [outside] = by_task["outside"]
    assert outside.status == "error" and "Network is unreachable" in outside.metadata["stderr_tail"], outside.metadata
    [bomb] = by_task["bomb"]
    assert bomb.status in ("error", "timeout"), bomb.metadata
    if bomb.status == "error":  # a pids cgroup here: the session is ended as soon as the limit is hit
        assert bomb.metadata["error"] == "harness killed: process limit reached (max_pids=64)"
    assert bomb.t_end - bomb.t_start < 50


def test_fresh_evaluator_sandbox_is_not_the_one_the_harness_tampered_with(tmp_path: Path) -> None:
    """The harness rewrites the task's check script to always pass; only a fresh sandbox sees the original."""
    (tmp_path / "check.sh").write_text('test "$(cat submission/answer.txt)" = 42\n')
    tamper = "echo 41 > answer.txt; echo 'exit 0' > check.sh"
    tasks = [{"id": f"tamper-{where}", "instruction": "-", "harness": {"command": tamper},
              "sandbox": {"files": {"check.sh": str(tmp_path / "check.sh")}, "prepare": ["mkdir -p submission"]},
              "evaluator": {"kind": "command", "command": "sh check.sh", "sandbox": where}}
             for where in ("session", "fresh")]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    result = polar("run", tmp_path / "tasks.jsonl", "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    rewards = {t.task_id: (t.status, t.reward, "untrainable" in t.metadata) for t in iter_trajectories(tmp_path / "run")}
    assert rewards == {"tamper-session": ("completed", 1.0, False), "tamper-fresh": ("completed", 0.0, False)}
