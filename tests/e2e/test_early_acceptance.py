"""`polar-hpc run` with early acceptance: a group of 2 + 2 whose tail never ends on its own is decided
at 2, the tail is cancelled (its sandboxes' processes gone), status counts the tail's session time
as discarded, and a trainer gets the decided group only."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from conftest import polar
from e2e.helpers import live_processes_matching, trajectories, write_jsonl
from polar_hpc.shards import Follower, iter_trajectories

CALCULATOR = Path(__file__).resolve().parents[2] / "examples" / "calculator"


def test_group_is_decided_at_accept_and_its_slow_tail_cancelled(tmp_path: Path) -> None:
    shutil.copy(CALCULATOR / "agent.py", tmp_path)
    marker = f"97{os.getpid() % 10000:04d}1"
    harness = (f'case "$POLAR_SESSION_ID" in *"#0."* | *"#1."*) exec python agent.py ;; esac; '
               f"sleep {marker} & sleep {marker}")  # samples 2 and 3 end only when cancelled
    task = {"id": "grp", "instruction": "What is 2 + 3?", "num_samples": 4, "accept": 2, "timeout_s": 3600,
            "harness": {"command": harness}, "sandbox": {"files": {"agent.py": "agent.py"}},
            "evaluator": {"kind": "regex", "pattern": "\\b5\\b"}}
    run_dir = tmp_path / "run"
    result = polar("run", write_jsonl(tmp_path / "tasks.jsonl", [task]), "--run-dir", run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert live_processes_matching(marker) == [], "the cancelled tail's processes must be gone"

    events = [json.loads(line) for line in (run_dir / "journal" / "orchestrator.jsonl").read_text().splitlines()]
    (decided,) = [e for e in events if e["event"] == "decided"]
    assert (decided["accepted"], decided["cancelled"]) == ([0, 1], [2, 3])
    results = {e["sample"]: (e["status"], e["shard"]) for e in events if e["event"] == "result"}
    assert results[2] == results[3] == ("cancelled", "")
    shown = polar("status", run_dir)  # the tail ran (its processes were there to end): its time was discarded
    assert shown.returncode == 0 and "discarded by over-provisioning: 2 sessions" in shown.stdout, shown.stdout

    (group,) = list(Follower(run_dir, group_by_task=True, poll_s=0.01, idle_timeout_s=10))
    assert [(t.sample_index, t.status, t.reward) for t in group] == [(0, "completed", 1.0), (1, "completed", 1.0)]
    assert [t.sample_index for t in trajectories(run_dir)] == [0, 1]
    tail = sorted((t.sample_index, t.status) for t in iter_trajectories(run_dir, unique=False) if t.sample_index > 1)
    assert tail == [(2, "cancelled"), (3, "cancelled")]  # written, as every session is, never handed out
