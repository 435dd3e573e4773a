"""A SWE-bench row over a tiny real repository: its base commit, gold patch and test patch made with
git, written in SWE-bench's published columns only. The repo key is one the swebench package knows
(pallets/flask 2.3: `pytest -rA`, graded by its pytest log parser); the repository is not Flask."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO, VERSION = "pallets/flask", "2.3"
INSTANCE_ID = "pallets__flask-4242"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
HIDDEN = "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
F2P, P2P = ["tests/test_calc.py::test_add"], ["tests/test_calc.py::test_zero"]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def make_repo(repo: Path) -> dict[str, str]:
    """`repo` at its base commit (calc.add is wrong; conftest.py puts the root on pytest's path, as
    an installed package would be); returns base_commit, patch and test_patch."""
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(BUGGY)
    (repo / "conftest.py").write_text("")
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text(FIXED)
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "calc.py")
    (repo / "tests" / "test_calc.py").write_text(TESTS + HIDDEN)
    test_patch = git(repo, "diff")
    git(repo, "checkout", "-q", "tests/test_calc.py")
    return {"base_commit": base, "patch": patch, "test_patch": test_patch}


def row(commits: dict[str, str], **over) -> dict:
    """A row with exactly SWE-bench Verified's columns (lists as JSON text, as published)."""
    published = {
        "repo": REPO, "instance_id": INSTANCE_ID, "base_commit": commits["base_commit"], "patch": commits["patch"],
        "test_patch": commits["test_patch"], "problem_statement": "calc.add(2, 3) returns -1, not 5.",
        "hints_text": "", "created_at": "2024-05-01T00:00:00Z", "version": VERSION,
        "FAIL_TO_PASS": json.dumps(F2P), "PASS_TO_PASS": json.dumps(P2P),
        "environment_setup_commit": commits["base_commit"], "difficulty": "<15 min fix",
    }
    return published | over
