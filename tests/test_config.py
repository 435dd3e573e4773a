"""Bad task files and topologies are refused before anything starts: exit 2, FILE:LINE: FIELD."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import polar

GOOD = {"id": "t", "instruction": "What is 1+1?", "harness": {"command": "true"}}


def _refused(result, *expected: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    return result.stderr


def test_yaml_missing_field_wrong_type_unknown_key(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        "id: t\n"
        "instruction: hi\n"
        "num_samples: many\n"          # line 3: wrong type
        "harness:\n"                   # line 4: command missing
        "  kind: shell\n"
        "  comand: python agent.py\n"  # line 6: unknown key
    )
    run_dir = tmp_path / "run"
    result = polar("run", task, "--run-dir", run_dir)
    _refused(
        result,
        f"{task}:3: num_samples:",
        f"{task}:4: harness.command: missing required field",
        f"{task}:6: harness.comand: unknown key",
    )
    assert not run_dir.exists(), "nothing may be started or created on bad input"


def test_jsonl_names_the_bad_record_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    bad = dict(GOOD, id="b", evaluator={"kind": "regex"})
    tasks.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(bad) + "\n{not json\n")
    result = polar("run", tasks, "--run-dir", tmp_path / "run")
    _refused(result, f"{tasks}:3: evaluator.pattern: missing required field", f"{tasks}:4: not valid JSON")


def test_topology_unknown_key_and_bad_value(tmp_path: Path, calculator_dir: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("gateway:\n  pools:\n    run: 0\n  colour: blue\n")
    result = polar("run", calculator_dir / "task.yaml", "-c", topo, "--run-dir", tmp_path / "run")
    _refused(result, f"{topo}:3: gateway.pools.run:", f"{topo}:4: gateway.colour: unknown key")


def test_missing_sandbox_file_and_duplicate_ids(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    with_file = dict(GOOD, sandbox={"files": {"a.py": "nope.py"}})
    tasks.write_text(json.dumps(with_file) + "\n")
    _refused(polar("run", tasks), "sandbox.files: no such file", "nope.py")
    tasks.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    _refused(polar("run", tasks), "duplicate task id(s): t")


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    _refused(polar("run", tmp_path / "absent.yaml"), "absent.yaml: cannot read")
    broken = tmp_path / "broken.yaml"
    broken.write_text("id: t\ninstruction: [unclosed\n")
    _refused(polar("run", broken), f"{broken}:3: not valid YAML")
