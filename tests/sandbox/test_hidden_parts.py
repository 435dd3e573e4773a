"""A sandbox sees none of its task's hidden parts, nor the checkouts holding them, nor polar-hpc's
own checkout, nor their git histories (docs/sandbox.md, threat model).

The task lives in a git worktree outside /tmp (so the private /tmp is not what hides it), whose
repository is elsewhere; its tests, its solution and an old commit hold secrets. The harness
(`hidden_search.py`) reads every file and every git history under the folder holding both, and
runs the audit's `git show HEAD:examples/swe/fix-median/solution/solve.sh` on polar-hpc's
checkout, through a real `polar-hpc run`, in every network mode. bwrap is the one backend here
that isolates (`none` isolates nothing by definition; apptainer cannot run here and binds only the
workspace, /tmp, /dev/shm and its own files into an image).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bwrap_required import needs_bwrap
from conftest import polar
from polar_hpc.sandbox import checkouts
from polar_hpc.shards.reader import iter_trajectories

HERE = Path(__file__).parent
MODES = ("none", "proxy-only", "host")
SHOW = "examples/swe/fix-median/solution/solve.sh"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@needs_bwrap
def test_a_harness_that_searches_everything_finds_no_hidden_part(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="polar-hidden-", dir="/var/tmp"))  # not behind the private /tmp
    base.chmod(0o755)  # readable by the sandbox's user: what hides the parts is the sandbox
    words = {k: f"SECRET_{k}_{secrets.token_hex(8)}" for k in ("tests", "solution", "history")}
    repo, suite = base / "repo", base / "suite"
    try:
        repo.mkdir()
        _git(repo, "init", "-q")
        (repo / "old.txt").write_text(words["history"])
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "old")
        (repo / "old.txt").unlink()
        (repo / "tests").mkdir()
        (repo / "tests" / "test.sh").write_text(f"# {words['tests']}\nexit 0\n")
        (repo / "solution").mkdir()
        (repo / "solution" / "solve.sh").write_text(f"# {words['solution']}\n")
        shutil.copy(HERE / "hidden_search.py", repo / "search.py")
        spec = {"secrets": list(words.values()), "roots": [str(base)], "skip": [sys.prefix],
                "project": checkouts.project()[0], "show": SHOW}
        tasks = [{"id": f"search-{mode}", "instruction": "-", "timeout_s": 300, "sandbox": {
            "network": mode, "files": {"search.py": "search.py"}},
            "harness": {"command": f"python3 search.py '{json.dumps(spec)}'"},
            "evaluator": {"kind": "tests", "dir": "tests", "command": 'sh "$POLAR_TESTS_DIR/test.sh"',
                          "sandbox": "fresh", "reward": "exit_code"},  # the harness's own output stays its own
            "solution": {"dir": "solution"}} for mode in MODES]
        (repo / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "task")
        _git(repo, "worktree", "add", "-q", str(suite))  # its .git is a file naming the repository
        for folder in (base, repo, suite):
            subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
        on_host = subprocess.run([sys.executable, str(HERE / "hidden_search.py"), json.dumps(spec)],
                                 capture_output=True, text=True, check=True)
        assert len(json.loads(on_host.stderr)["found"]) >= 6  # the search finds them where they can be seen
        run_dir = tmp_path / "run"
        result = polar("run", suite / "tasks.jsonl", "--run-dir", run_dir, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        reports = {t.task_id: (t, json.loads(t.metadata["stderr_tail"].strip().splitlines()[-1]))
                   for t in iter_trajectories(run_dir)}
    finally:
        shutil.rmtree(base)
    assert sorted(reports) == [f"search-{mode}" for mode in sorted(MODES)]
    for task_id, (trajectory, report) in reports.items():
        assert trajectory.status == "completed", (task_id, trajectory.metadata)
        assert report["found"] == [] and report["repositories"] == [], (task_id, report)
        assert report["shown"] == "", (task_id, report)  # the audit's `git show` reads nothing
        assert report["project"] in (None, [Path(sys.prefix).name]), (task_id, report)  # only its virtualenv
        assert trajectory.reward == 1.0  # the hidden tests still ran, in the evaluator's own sandbox
