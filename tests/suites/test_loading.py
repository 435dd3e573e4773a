"""Suites as input, through the real CLI: Harbor task folders and suite files load into tasks;
every malformed entry is named with its file, line (or row) and field,
exit 2, no traceback, and a run given a bad suite creates nothing."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import polar
from suites.helpers import EXAMPLES, ON_HOST, TASKS, copy_task, suite_file

from polar_hpc import suites


def check_fails(*args) -> str:
    result = polar(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_examples_check_and_load_as_tasks() -> None:
    result = polar("tasks", "check", ON_HOST)
    assert result.returncode == 0, result.stderr
    assert "3 task(s), 3 session(s)" in result.stdout
    tasks = suites.load(EXAMPLES)
    assert [t.id for t in tasks] == list(TASKS)
    median = tasks[0]
    assert median.instruction.startswith("The `median` function")
    assert (median.timeout_s, median.evaluator.kind, median.evaluator.timeout_s) == (300.0, "tests", 60.0)
    assert median.evaluator.dir == str(EXAMPLES / "fix-median" / "tests")
    assert median.solution.dir == str(EXAMPLES / "fix-median" / "solution")
    assert set(median.sandbox.files) == {"stats.py", "README.md"}
    assert (median.sandbox.cpus, median.sandbox.memory_mb, median.sandbox.storage_mb) == (1, 1024, 256)
    assert median.harness.kind == "oracle" and median.metadata["harbor"]["difficulty"] == "easy"
    assert [t.id for t in suites.load(EXAMPLES / "fix-roman")] == ["fix-roman"]  # one task folder


def test_every_problem_of_every_task_named_with_file_line_and_field(tmp_path: Path) -> None:
    bad_toml = copy_task(tmp_path, "a-bad-toml")
    (bad_toml / "task.toml").write_text(
        'version = "1.0"\n\n[agent]\ntimeout_sec = "soon"\n\n[environment]\ncpus = -1\n')
    syntax = copy_task(tmp_path, "b-syntax")
    (syntax / "task.toml").write_text('[agent]\ntimeout_sec = 3\n[[[broken\n')
    missing = copy_task(tmp_path, "c-missing")
    (missing / "instruction.md").unlink()
    (missing / "tests" / "test.sh").unlink()
    linked = copy_task(tmp_path, "d-linked")
    (linked / "solution" / "solve.sh").unlink()
    (linked / "solution" / "solve.sh").symlink_to("/etc/passwd")
    no_env = copy_task(tmp_path, "e-no-env")
    (no_env / "environment" / "Dockerfile").unlink()
    copy_task(tmp_path, "f-fine")
    (tmp_path / "g-link").symlink_to(tmp_path / "f-fine")
    err = check_fails("tasks", "check", tmp_path)
    assert f"{bad_toml}/task.toml:4: agent.timeout_sec: Input should be a valid number" in err
    assert f"{bad_toml}/task.toml:7: environment.cpus: Input should be greater than 0" in err
    assert f"{syntax}/task.toml: not valid TOML: " in err and "line 3" in err
    assert f"{missing}/instruction.md: instruction: no such file" in err
    assert f"{missing}/tests/test.sh: tests/test.sh: no such file" in err
    assert f"{linked}/solution/solve.sh: solution/solve.sh: a symbolic link on the way" in err
    assert f"{no_env}/environment/Dockerfile: environment: neither a Dockerfile nor" in err
    assert f"{tmp_path}/g-link: a symbolic link (not followed): not a task folder" in err
    assert "f-fine" not in err
    run_dir = tmp_path / "never"
    check_fails("run", tmp_path, "--run-dir", run_dir)
    assert not run_dir.exists(), "a run of a bad suite creates nothing"


def test_hostile_task_folders(tmp_path: Path) -> None:
    nul = copy_task(tmp_path, "nul-instruction")
    (nul / "instruction.md").write_text("fix it\0")
    huge = copy_task(tmp_path, "huge-toml")
    (huge / "task.toml").write_text("x = 1\n" * 300_000)
    (tmp_path / "bad id with spaces").mkdir()
    fifo = copy_task(tmp_path, "fifo-instruction")
    (fifo / "instruction.md").unlink()
    os.mkfifo(fifo / "instruction.md")
    inner = copy_task(tmp_path, "link-in-tests")
    (inner / "tests" / "data").mkdir()
    (inner / "tests" / "data" / "expected.txt").symlink_to("/etc/shadow")
    (inner / "tests" / "up").symlink_to(inner / "solution")
    err = check_fails("tasks", "check", tmp_path)
    assert f"{inner}/tests/data/expected.txt: tests: a symbolic link (links are not followed)" in err
    assert f"{inner}/tests/up: tests: a symbolic link (links are not followed)" in err
    assert f"{nul}/instruction.md: instruction: contains a NUL byte" in err
    assert f"{huge}/task.toml: larger than" in err
    assert "bad id with spaces: the folder's name is the task id" in err
    assert f"{fifo}/instruction.md: instruction: not a regular file or folder" in err


def test_oracle_needs_a_solution_noop_does_not(tmp_path: Path) -> None:
    task = copy_task(tmp_path / "suite", "no-solution")
    for f in (task / "solution").iterdir():
        f.unlink()
    (task / "solution").rmdir()
    err = check_fails("tasks", "check", tmp_path / "suite")
    assert f"{task}/solution/solve.sh: missing, and `harness: oracle` runs it" in err
    ref = suite_file(tmp_path / "noop.yaml", tmp_path / "suite", "{kind: noop}")
    result = polar("tasks", "check", ref)
    assert result.returncode == 0 and "noop" in result.stdout, result.stderr


def test_suite_file_errors_name_their_line(tmp_path: Path) -> None:
    ref = tmp_path / "suite.yaml"
    ref.write_text(f"suite: {EXAMPLES}\nnum_samples: 0\nharness:\n  kind: nope\ncolour: blue\n")
    err = check_fails("tasks", "check", ref)
    assert f"{ref}:2: num_samples: Input should be greater than or equal to 1" in err
    assert f"{ref}:4: harness.kind: Input should be" in err
    assert f"{ref}:5: colour: unknown key" in err
    ref.write_text("suite: nowhere\n")
    assert f"{ref}:1: suite: " in check_fails("tasks", "check", ref)
