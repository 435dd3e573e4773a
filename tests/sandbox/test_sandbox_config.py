"""Bad sandbox settings are refused before anything starts: exit 2, FILE:LINE: FIELD."""

from __future__ import annotations

import json
import os
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


def test_sandbox_files_must_stay_inside_the_task_folder(tmp_path: Path) -> None:
    folder = tmp_path / "suite"
    (folder / "real").mkdir(parents=True)
    (folder / "ok.py").write_text("print(1)\n")
    (folder / "real" / "data.txt").write_text("fine\n")
    os.symlink("/etc/shadow", folder / "shadow")  # a link to a host file
    os.symlink(folder / "real", folder / "linked")  # a linked folder, even one pointing inside
    os.mkfifo(folder / "pipe")
    lines = ["- id: t", "  instruction: '-'", "  harness: {command: 'true'}", "  sandbox:", "    files:",
             "      a: ok.py", "      b: /etc/shadow", "      c: ../outside.txt", "      d: shadow",
             "      e: linked/data.txt", "      f: pipe", "      ../g: ok.py", "      h: real/data.txt",
             f"      i: {folder / 'ok.py'}"]
    tasks = folder / "tasks.yaml"
    tasks.write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    result = polar("run", tasks, "--run-dir", run_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for line, problem in ((7, "source outside the task's folder"), (8, "'..' is not allowed in a source"),
                          (9, "a symbolic link on the way"), (10, "a symbolic link on the way"),
                          (11, "not a regular file or folder"), (12, "destination leaves the workspace")):
        assert f"{tasks}:{line}: sandbox.files: {problem}" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 6, result.stderr  # a, h and i are fine
    assert not run_dir.exists(), "nothing is started"
