"""Bad sandbox settings are refused before anything starts: exit 2, FILE:LINE: FIELD."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import polar


def test_bad_sandbox_topology_and_task_fields(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("sandbox:\n  backend: docker\n  max_pids: 4\n  apptainer:\n    starts_per_node: 0\n")
    task = {"id": "t", "instruction": "-", "harness": {"command": "true"},
            "evaluator": {"kind": "command", "command": "true", "sandbox": "other"}}
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(task | {"evaluator": None}) + "\n")
    run_dir = tmp_path / "run"
    bad_topo = polar("run", tasks, "-c", topo, "--run-dir", run_dir)
    assert bad_topo.returncode == 2 and "Traceback" not in bad_topo.stderr
    for expected in (f"{topo}:2: sandbox.backend:", f"{topo}:3: sandbox.max_pids:",
                     f"{topo}:5: sandbox.apptainer.starts_per_node:"):
        assert expected in bad_topo.stderr, bad_topo.stderr
    topo.write_text("sandbox:\n  backend: bwrap\n")
    tasks.write_text(json.dumps(task) + "\n")
    bad_task = polar("run", tasks, "-c", topo, "--run-dir", run_dir)
    assert bad_task.returncode == 2 and f"{tasks}:1: evaluator.sandbox:" in bad_task.stderr, bad_task.stderr
    assert not run_dir.exists()
