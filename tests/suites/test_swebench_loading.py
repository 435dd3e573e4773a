"""SWE-bench rows exactly as published (JSON Lines, a JSON array, `.json` lines as `datasets`
writes them, Parquet) load into tasks graded by the swebench package, their image named by
SWE-bench's convention unless a suite file's `image` template overrides it; bad rows are named
with file, line (or row) and field, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from suites.swebench_rows import F2P, INSTANCE_ID, P2P, VERSION, make_repo, row
from suites.test_loading import check_fails

from polar_hpc import suites
from polar_hpc.suites.swebench import PREPARE
from polar_hpc.trajectory import swebench as grading

IMAGE = "docker://docker.io/swebench/sweb.eval.x86_64.pallets_1776_flask-4242:latest"


@pytest.fixture(scope="module")
def commits(tmp_path_factory) -> dict[str, str]:
    return make_repo(tmp_path_factory.mktemp("repo") / "repo")


def test_a_published_row_becomes_a_task_graded_by_the_package(tmp_path: Path, commits) -> None:
    path = tmp_path / "verified.jsonl"
    path.write_text(json.dumps(row(commits)) + "\n")
    [task] = suites.load(path)
    assert (task.id, task.sandbox.image, task.sandbox.prepare) == (INSTANCE_ID, IMAGE, [PREPARE])
    assert task.metadata["image_source"] == f"{path}:1: instance_id (SWE-bench's image name)"
    assert task.solution.patch == commits["patch"] and task.instruction.startswith("calc.add(2, 3)")
    assert task.evaluator.kind == "swebench"
    assert task.evaluator.instance == {"instance_id": INSTANCE_ID, "repo": "pallets/flask", "version": VERSION,
                                       "base_commit": commits["base_commit"], "test_patch": commits["test_patch"],
                                       "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P}
    # the package's own eval script: reset the test files, apply test_patch, its test command in `testbed`
    script = grading.test_spec(task.evaluator.instance).eval_script
    reset = f"git checkout {commits['base_commit']} tests/test_calc.py"
    assert script.count(reset) == 2 and "conda activate testbed" in script
    assert "pytest -rA tests/test_calc.py" in script and commits["test_patch"] in script
    assert "hints_text" not in task.model_dump_json()


def test_every_published_file_shape_loads_the_same(tmp_path: Path, commits) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [row(commits), row(commits, instance_id="pallets__flask-4243")]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # datasets' to_json
    (tmp_path / "array.json").write_text(json.dumps(rows, indent=2))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    loaded = {name: suites.load(tmp_path / name) for name in ("a.jsonl", "lines.json", "array.json", "a.parquet")}
    dumps = {name: [t.model_dump(exclude={"metadata"}) for t in tasks] for name, tasks in loaded.items()}
    assert all(d == dumps["a.jsonl"] for d in dumps.values())
    assert [t.sandbox.image for t in loaded["array.json"]] == [
        IMAGE, "docker://docker.io/swebench/sweb.eval.x86_64.pallets_1776_flask-4243:latest"]
    second = (tmp_path / "array.json").read_text().splitlines().index("  {", 2) + 1
    assert loaded["array.json"][1].metadata["image_source"].startswith(f"{tmp_path / 'array.json'}:{second}: ")
    # a JSON array of our own tasks is still ours
    (tmp_path / "ours.json").write_text(json.dumps([{"id": "t", "instruction": "x", "harness": {"kind": "noop"}}]))
    assert [t.id for t in suites.load(tmp_path / "ours.json")] == ["t"]


def test_bad_rows_are_named_with_file_line_and_field(tmp_path: Path, commits) -> None:
    path = tmp_path / "swe.jsonl"
    rows = [row(commits, instance_id=f"ok-{i}") for i in range(5)]
    rows[1] = row(commits, instance_id="bad id", FAIL_TO_PASS="not json")
    rows[2] = row(commits, instance_id="ok-2", version="9.9")
    rows[3] = row(commits, instance_id="ok-3", repo="nobody/nothing")
    rows[4] = {k: v for k, v in row(commits, instance_id="ok-4").items() if k != "test_patch"}
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, "{not json")
    path.write_text("\n".join(lines) + "\n")
    err = check_fails("tasks", "check", path)
    assert f"{path}:2: instance_id: not usable as a task id" in err
    assert f"{path}:2: FAIL_TO_PASS: neither a list nor JSON text of one" in err
    assert f"{path}:3: not valid JSON" in err
    assert f"{path}:4: repo, version: the swebench package has no spec for pallets/flask 9.9 (its versions: " in err
    assert f"{path}:5: repo, version: the swebench package has no spec for nobody/nothing 2.3" in err
    assert f"{path}:6: test_patch: missing required field" in err
    path.write_text(json.dumps(row(commits, patch="")) + "\n")
    assert f"{path}:1: patch: missing, and `harness: oracle` applies it" in check_fails("tasks", "check", path)
    array = tmp_path / "swe.json"
    array.write_text("[\n" + json.dumps(row(commits)) + ",\n" + json.dumps(row(commits, version=3)) + "\n]\n")
    assert f"{array}:3: version: Input should be a valid string" in check_fails("tasks", "check", array)


def test_a_suite_file_names_the_images(tmp_path: Path, commits) -> None:
    data = tmp_path / "verified.jsonl"
    data.write_text(json.dumps(row(commits)) + "\n")
    ref = tmp_path / "suite.yaml"
    ref.write_text("suite: verified.jsonl\nharness: {kind: noop}\nimage: 'registry.site:5000/swe/{docker_id}:v1'\n")
    [task] = suites.load(ref)
    assert task.sandbox.image == "docker://registry.site:5000/swe/pallets_1776_flask-4242:v1"
    assert task.metadata["image_source"] == f"{ref}:3: image"
    ref.write_text("suite: verified.jsonl\nimage: 'x/{instance_id}-{arch}'\n")
    assert f"{ref}:2: image: unknown placeholder(s) arch" in check_fails("tasks", "check", ref)
    data.write_text(json.dumps(row(commits, instance_id="Pallets__flask-4242")) + "\n")
    ref.write_text("suite: verified.jsonl\nimage: 'x/{instance_id}'\n")  # upper case: no reference
    assert f"{data}:1: image: not an image reference" in check_fails("tasks", "check", ref)
    (tmp_path / "harbor").mkdir()
    ref.write_text("suite: harbor\nimage: 'x/{docker_id}'\n")
    assert f"{ref}:2: image: only for a SWE-bench dataset" in check_fails("tasks", "check", ref)


def test_without_the_package_the_dataset_is_refused_with_advice(tmp_path: Path, commits) -> None:
    """An install without the `swebench` extra: its import fails (here: blocked in sys.modules)."""
    path = tmp_path / "verified.jsonl"
    path.write_text(json.dumps(row(commits)) + "\n")
    code = ("import sys; sys.modules['swebench'] = None; sys.argv = ['polar-hpc', 'tasks', 'check', sys.argv[1]]; "
            "from polar_hpc.cli import app; app()")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{path}: SWE-bench rows are graded by the swebench package" in r.stderr
    assert "pip install 'polar-hpc[swebench]'" in r.stderr
