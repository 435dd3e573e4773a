"""Suites run end to end (`polar-hpc run`, bubblewrap): the oracle scores 1.0 and the no-op 0.0 on
every example; hostile harnesses gain nothing from the hidden tests or reward files; the workspace
diff is captured binary-safe into the trajectory (and applied in a fresh sandbox with
`verifier_sandbox: fresh`)."""

from __future__ import annotations

import base64
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import polar
from e2e.helpers import check_fidelity, engine_samples, trajectories
from sandbox.bwrap_required import needs_bwrap
from suites.helpers import EXAMPLES, ON_HOST, TASKS, copy_task

pytestmark = [needs_bwrap, pytest.mark.timeout(300)]
TOPOLOGY = "sandbox: {backend: bwrap}\n"
FIX = (r"sed -i 's|^    return ordered\[middle\]$|"
       r"    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2|' stats.py")


def run(tmp_path: Path, tasks: Path, name: str) -> list:
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    run_dir = tmp_path / name
    result = polar("run", tasks, "-c", topology, "--run-dir", run_dir, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    return trajectories(run_dir)


def diff_of(traj) -> bytes:
    d = traj.metadata["workspace_diff"]
    return d["data"].encode() if d["encoding"] == "utf-8" else base64.b64decode(d["data"])


def test_oracle_scores_one_and_noop_zero_on_every_example(tmp_path: Path) -> None:
    oracle = run(tmp_path, ON_HOST, "oracle")
    assert [(t.task_id, t.status, t.reward) for t in oracle] == [(name, "completed", 1.0) for name in TASKS]
    for t in oracle:
        diff = diff_of(t)
        assert diff.startswith(b"diff --git") and b".polar" not in diff and b"instruction.txt" not in diff
        assert set(t.metadata["evaluation_timings"]) == {"capture_s", "apply_s", "tests_s"}  # in its own sandbox
        assert "Ran " in t.metadata["evaluation"] and "OK" in t.metadata["evaluation"]
    ref = tmp_path / "noop.yaml"
    ref.write_text(f"suite: {EXAMPLES}\nharness: {{kind: noop}}\ndockerfile: host\n")
    noop = run(tmp_path, ref, "noop")
    assert [(t.task_id, t.status, t.reward) for t in noop] == [(name, "completed", 0.0) for name in TASKS]
    assert all(t.metadata["workspace_diff"]["bytes"] == 0 for t in noop)
    assert all("FAILED" in t.metadata["evaluation"] for t in noop)


def test_hostile_harnesses_gain_nothing(tmp_path: Path) -> None:
    # under /var/tmp, not /tmp: the sandbox would hide all of /tmp anyway, and we check that the
    # task's own tests/ and solution/ are hidden from the harness by name
    suite = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="polar-suite-"))
    suite.chmod(0o755)  # readable by the harness's user: only hiding keeps tests/ and solution/ from it
    try:
        for case in ("tamper", "binary", "nogit", "commit", "disk"):
            copy_task(suite, f"{case}-median")
        toml = suite / "disk-median" / "task.toml"
        toml.write_text(toml.read_text().replace("storage_mb = 256", "storage_mb = 2"))
        tamper = suite / "tamper-median"
        command = f"""
case "$POLAR_SESSION_ID" in
tamper*)
  mkdir -p tests logs/verifier .polar-eval-0000000000000000/logs
  printf '#!/bin/sh\\necho 1 > "$POLAR_LOGS_DIR/reward.txt"\\nexit 0\\n' > tests/test.sh
  echo 1 > reward.txt; echo 1 > logs/verifier/reward.txt; echo '{{"reward": 1}}' > reward.json
  echo 1 > .polar-eval-0000000000000000/logs/reward.txt
  {{ cat {tamper}/tests/test_stats.py; cat {tamper}/solution/solve.sh; ls {tamper}; }} > saw.txt 2>&1
  exit 0;;
binary*) {FIX} && python3 -c 'open("blob.bin", "wb").write(bytes(range(256)) * 4)';;
nogit*) {FIX} && rm -rf .git;;
commit*) {FIX} && git -c user.name=a -c user.email=a@b commit -qam fixed;;
disk*) head -c 8000000 /dev/zero > big; sleep 5;;
esac
"""
        ref = tmp_path / "hostile.yaml"
        ref.write_text(f"suite: {suite}\nverifier_sandbox: fresh\ndockerfile: host\nharness:\n  kind: shell\n  command: |\n"
                       + "".join(f"    {line}\n" for line in command.strip().splitlines()))
        by_id = {t.task_id: t for t in run(tmp_path, ref, "hostile")}
    finally:
        shutil.rmtree(suite)

    t = by_id["tamper-median"]
    assert (t.status, t.reward) == ("completed", 0.0), t.metadata
    diff = diff_of(t)
    assert b"tests/test.sh" in diff and b"reward.txt" in diff  # its plants are in its diff...
    assert b"MedianTest" not in diff and b"ordered[middle - 1]" not in diff  # ...the hidden files are not
    assert b"+environment\n" not in diff and b"+instruction.md\n" not in diff  # the task's folder is covered...
    assert diff.count(b"No such file") == 2, diff.decode(errors="replace")  # ...and the two hidden files unread
    assert "FAILED" in t.metadata["evaluation"]  # the real tests ran, on the unfixed code

    t = by_id["binary-median"]
    assert (t.status, t.reward) == ("completed", 1.0), t.metadata
    assert t.metadata["workspace_diff"]["encoding"] in ("utf-8", "base64")
    assert b"GIT binary patch" in diff_of(t) and b"blob.bin" in diff_of(t)

    t = by_id["nogit-median"]
    assert (t.status, t.reward) == ("completed", 0.0)
    assert "workspace_diff" not in t.metadata
    assert "git diff against the base failed" in t.metadata["workspace_diff_error"]
    assert t.metadata["evaluation"].startswith("no workspace diff to test")

    t = by_id["commit-median"]
    assert (t.status, t.reward) == ("completed", 1.0), t.metadata  # the diff is against the base, not HEAD

    t = by_id["disk-median"]  # task.toml's storage_mb bounds the session's disk
    assert (t.status, t.reward) == ("error", None)
    assert t.metadata["error"] == f"harness killed: disk limit exceeded (max_disk_bytes={2 << 20})"


def test_mini_swe_agent_fixes_a_task_token_exact(tmp_path: Path) -> None:
    """mini-swe-agent (unchanged) edits fix-median through the proxy (examples/swe/rules.yaml); the
    hidden tests pass in the fresh sandbox, and each session is one token-exact trace."""
    run_dir = tmp_path / "mini"
    result = polar("run", EXAMPLES / "mini_swe_agent.yaml", "-c", EXAMPLES / "topology.yaml",
                   "--run-dir", run_dir, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    samples = engine_samples(run_dir)
    trajs = trajectories(run_dir)
    assert [(t.task_id, t.status, t.reward) for t in trajs] == [("fix-median", "completed", 1.0)] * 2
    for t in trajs:
        assert t.metadata["workspace_diff"]["data"].startswith("diff --git a/stats.py b/stats.py")
        assert t.metadata["workspace_diff"]["data"].count("diff --git") == 1  # its own files left out
        assert len(t.traces) == 1 and check_fidelity(t.traces[0], samples) == 2
