"""The tests evaluator on real sandboxes (backend none) and real git: the harness's diff, captured
in its sandbox, applied in a fresh one, or the tests run in the harness's own sandbox; rewards
read as Harbor reads them (reward.json first, every key kept, then reward.txt); no reward file,
or a hostile one, is an error with its reason, never the exit code; hostile diffs score 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar_hpc import config
from polar_hpc.gateway.pipeline import MOUNTS
from polar_hpc.sandbox.none import NoneSandbox
from polar_hpc.trajectory import workspace
from polar_hpc.trajectory.evaluators import evaluate


def box(root: Path, repo: Path) -> NoneSandbox:
    return NoneSandbox(root, files={"code.py": str(repo / "code.py")}, prepare=[], network="host", mounts=MOUNTS)


async def session(tmp_path: Path, harness: str) -> bytes | str:
    """Run `harness` in a sandbox of the base repository; its diff (or why there is none)."""
    sb = box(tmp_path / f"s-{abs(hash(harness))}", tmp_path / "repo")
    await sb.start()
    await workspace.snapshot(sb)
    await sb.exec(harness, {}, 30)
    try:
        return await workspace.capture(sb)
    except workspace.DiffError as e:
        return str(e)
    finally:
        await sb.stop()


def score(tmp_path: Path, diff: bytes | str, test_sh: str, patch: str | None = None):
    async def go():
        fresh = box(tmp_path / "fresh", tmp_path / "repo")
        await fresh.start()
        await workspace.snapshot(fresh)
        try:
            spec = config.TestsEvaluator(kind="tests", dir=str(tmp_path / "tests"), patch=patch, timeout_s=20,
                                         sandbox="fresh")
            return await evaluate(spec, fresh, [], diff)
        finally:
            await fresh.stop()

    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test.sh").write_text(test_sh)
    return asyncio.run(go())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "code.py").write_text("VALUE = 1\n")
    return tmp_path / "repo"


CHECK = 'grep -q "VALUE = 2" code.py && r=1 || r=0; echo $r > "$POLAR_LOGS_DIR/reward.txt"\n'


def test_reward_files_in_harbor_s_order(tmp_path: Path, repo: Path) -> None:
    fixed = asyncio.run(session(tmp_path, "echo 'VALUE = 2' > code.py"))
    assert fixed.startswith(b"diff --git a/code.py b/code.py")
    assert score(tmp_path, fixed, CHECK).reward == 1.0
    assert score(tmp_path, b"", CHECK).reward == 0.0  # nothing changed
    out = score(tmp_path, fixed, 'echo 0.25 > "$POLAR_LOGS_DIR/reward.txt"; exit 1')
    assert (out.reward, out.rewards, out.error) == (0.25, {"reward": 0.25}, None)
    assert "reward.txt: 0.25; tests exit 1" in out.detail and set(out.timings) == {"apply_s", "tests_s"}
    both = ('echo \'{"reward": 0.5, "tests_passed": 3, "name": "x"}\' > "$POLAR_LOGS_DIR/reward.json"; '
            'echo 0.9 > "$POLAR_LOGS_DIR/reward.txt"')
    out = score(tmp_path, fixed, both)  # reward.json first, every number in it kept
    assert (out.reward, out.rewards) == (0.5, {"reward": 0.5, "tests_passed": 3.0})
    out = score(tmp_path, fixed, 'echo \'{"passed": 0.75}\' > "$POLAR_LOGS_DIR/reward.json"')
    assert (out.reward, out.rewards, out.error) == (None, {"passed": 0.75}, None)  # no "reward" key: no scalar
    out = score(tmp_path, fixed, 'echo \'{"passed": 2}\' > "$POLAR_LOGS_DIR/reward.json"; '
                                 'echo 1 > "$POLAR_LOGS_DIR/reward.txt"')
    assert (out.reward, out.rewards) == (1.0, {"passed": 2.0, "reward": 1.0})  # reward.txt gives the scalar


def test_no_reward_file_is_an_error_not_the_exit_code(tmp_path: Path, repo: Path) -> None:
    for test_sh in ("exit 0", "exit 1", 'touch "$POLAR_LOGS_DIR/other.txt"'):
        out = score(tmp_path, b"", test_sh)
        assert out.reward is None and out.error is not None and out.error.startswith("no reward file"), out


def test_hostile_reward_files_are_errors(tmp_path: Path, repo: Path) -> None:
    for test_sh, why in [
        ('ln -s /etc/passwd "$POLAR_LOGS_DIR/reward.txt"', "a symbolic link"),
        ('mkfifo "$POLAR_LOGS_DIR/reward.txt"', "not a regular file"),
        ('head -c 100000 /dev/zero > "$POLAR_LOGS_DIR/reward.txt"', "larger than"),
        ('echo inf > "$POLAR_LOGS_DIR/reward.txt"', "not a finite number"),
        (': > "$POLAR_LOGS_DIR/reward.txt"', "empty"),
        ('echo \'[1, 2]\' > "$POLAR_LOGS_DIR/reward.json"', "not a JSON object"),
        ('echo \'{"reward": 1\' > "$POLAR_LOGS_DIR/reward.json"', "not JSON"),
        ('echo \'{"reward": NaN}\' > "$POLAR_LOGS_DIR/reward.json"', "not a finite number"),
    ]:
        out = score(tmp_path, b"", test_sh)
        assert out.reward is None and out.error and why in out.error, (test_sh, out)
    out = score(tmp_path, b"", 'echo \'{"reward": true}\' > "$POLAR_LOGS_DIR/reward.json"')
    assert (out.reward, out.rewards, out.error) == (None, {}, None)  # a boolean is no number, as in Harbor


def test_session_mode_tests_see_the_sandbox_as_the_harness_left_it(tmp_path: Path, repo: Path) -> None:
    async def go():
        sb = box(tmp_path / "s", repo)
        await sb.start()
        try:
            await sb.exec('echo installed > "$HOME/../tool"; mkdir -p stale; '
                          f'echo 1 > {sb.seen_at("/logs/verifier")}/reward.txt; echo fake > {sb.seen_at("/tests")}/x', {}, 30)
            spec = config.TestsEvaluator(kind="tests", dir=str(tmp_path / "tests"), timeout_s=20)
            return await evaluate(spec, sb, [], None), sorted(p.name for p in sb.mounts["/tests"].iterdir())
        finally:
            await sb.stop()

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text('cat "$HOME/../tool" && [ -d stale ] && echo 0.5 > "$POLAR_LOGS_DIR/reward.txt"')
    out, shown = asyncio.run(go())
    assert (out.reward, out.error, shown) == (0.5, None, ["test.sh"])  # what the harness planted is gone


def test_hostile_diffs_score_zero(tmp_path: Path, repo: Path) -> None:
    out = score(tmp_path, b"diff --git a/nothing b/nothing\n--- a/nothing\n+++ b/nothing\n@@ -1 +1 @@\n-x\n+y\n", CHECK)
    assert out.reward == 0.0 and "does not apply" in out.detail
    escape = (b"diff --git a/../../evil b/../../evil\nnew file mode 100644\n--- /dev/null\n+++ b/../../evil\n"
              b"@@ -0,0 +1 @@\n+x\n")
    out = score(tmp_path, escape, CHECK)
    assert out.reward == 0.0 and "does not apply" in out.detail and not (tmp_path / "evil").exists()
    into_git = asyncio.run(session(tmp_path, "echo 'VALUE = 2' > code.py && mkdir -p sub && cd sub && "
                                              "git init -q && echo x > f && git add f"))
    assert score(tmp_path, into_git, CHECK).reward == 1.0  # all but the nested repository
    assert score(tmp_path, "git diff against the base failed", CHECK).detail.startswith("no workspace diff")
    broken = asyncio.run(session(tmp_path, "rm -rf .git"))
    assert isinstance(broken, str) and "git diff against the base failed" in broken


def test_a_test_patch_that_does_not_apply_is_the_task_s_fault(tmp_path: Path, repo: Path) -> None:
    out = score(tmp_path, b"", CHECK, patch="diff --git a/zz b/zz\n--- a/zz\n+++ b/zz\n@@ -1 +1 @@\n-a\n+b\n")
    assert out.reward is None and out.error and out.detail.startswith("the task's tests could not be put in place")
    good = "diff --git a/code.py b/code.py\n--- a/code.py\n+++ b/code.py\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n"
    assert score(tmp_path, b"", CHECK, patch=good).reward == 1.0


def test_exit_code_reward_reads_no_file(tmp_path: Path, repo: Path) -> None:
    async def go(test_sh: str):
        (tmp_path / "tests" / "test.sh").write_text(test_sh)
        fresh = box(tmp_path / "fresh", repo)
        await fresh.start()
        await workspace.snapshot(fresh)
        try:
            spec = config.TestsEvaluator(kind="tests", dir=str(tmp_path / "tests"), timeout_s=20, sandbox="fresh",
                                         reward="exit_code")
            return await evaluate(spec, fresh, [], b"")
        finally:
            await fresh.stop()

    (tmp_path / "tests").mkdir()
    assert asyncio.run(go("exit 0")).reward == 1.0
    out = asyncio.run(go('echo 1 > "$POLAR_LOGS_DIR/reward.txt"; exit 1'))
    assert (out.reward, out.error) == (0.0, None)  # SWE-bench rows: their test command's exit code
