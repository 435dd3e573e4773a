"""Score a finished session: `await evaluate(spec, sandbox, records, diff) -> Outcome(reward, detail)`.

`spec` is a task's evaluator model from polar_hpc.config (or None, giving reward None):

- CommandEvaluator: run `spec.command` in the sandbox under `spec.timeout_s`; exit 0 -> 1.0,
  anything else (a timeout included) -> 0.0; the detail ends with the tail of its output.
- RewardFileEvaluator: the float in `sandbox.workspace / spec.path`, read from the host with
  `sandbox.files.read` (no link followed on any component, regular files only, at most
  REWARD_FILE_MAX bytes, given up after REWARD_FILE_TIMEOUT_S); a missing, linked, special
  (FIFO...), oversized, unreadable or non-numeric (or non-finite) file gives reward None and a
  detail naming the file and the problem.
- RegexEvaluator: `re.search(spec.pattern, final answer)` -> 1.0 / 0.0, where the final answer is
  the last call's reply: its text and the arguments of its tool calls (`messages.final_answer`);
  an invalid pattern or an unreadable final answer gives reward None.

- TestsEvaluator: `sandbox` is a FRESH sandbox of the task (its base snapshotted, never seen by
  the harness) and `diff` the harness's workspace diff (trajectory.workspace). In a folder of a
  random name in the workspace (`.polar-eval-<hex>`, made only now): the diff is applied (one that
  does not apply, or no diff at all, scores 0.0), then the task's test patch, then its tests
  folder is copied to `tests/` ($POLAR_TESTS_DIR), then `spec.command` runs under
  `spec.timeout_s` with $POLAR_LOGS_DIR an empty folder. The reward is the float in
  $POLAR_LOGS_DIR/reward.txt, else reward.json's "reward" (or its one number), read as reward
  files are; without either, exit 0 -> 1.0, else 0.0. A reward file that is there but unreadable
  gives None. The detail ends with the tail of the tests' output.

- SwebenchEvaluator: graded by the official swebench package (trajectory.swebench) in a FRESH
  sandbox with the harness's diff; its report goes to the Outcome's metadata["swebench"].

The command evaluator sees the sandbox as the harness left it.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from polar_hpc.config import CommandEvaluator, RegexEvaluator, RewardFileEvaluator, SwebenchEvaluator, TestsEvaluator
from polar_hpc.sandbox import SandboxError, files
from polar_hpc.sandbox.base import Sandbox
from polar_hpc.trajectory import swebench, workspace
from polar_hpc.trajectory.messages import final_answer
from polar_hpc.wire import CallRecord

DETAIL_TAIL = 2000  # characters of command output kept in a detail
REWARD_FILE_MAX = 4096  # bytes read from a reward file
REWARD_FILE_TIMEOUT_S = 5.0  # the read of a reward file is given up after this


@dataclass(frozen=True)
class Outcome:
    reward: float | None
    detail: str
    timings: dict[str, float] = field(default_factory=dict)  # TestsEvaluator: apply_s, tests_s
    metadata: dict = field(default_factory=dict)  # for the trajectory's metadata (SwebenchEvaluator: its report)


async def evaluate(
    spec: CommandEvaluator | RewardFileEvaluator | RegexEvaluator | TestsEvaluator | SwebenchEvaluator | None,
    sandbox: Sandbox,
    records: list[CallRecord],
    diff: bytes | str | None = None,
) -> Outcome:
    """`diff`: the harness's workspace diff (TestsEvaluator), or why it could not be taken."""
    if spec is None:
        return Outcome(None, "no evaluator")
    if isinstance(spec, CommandEvaluator):
        return await _command(spec, sandbox)
    if isinstance(spec, RewardFileEvaluator):
        outcome = await _reward_file(sandbox, spec.path)
        assert outcome is not None  # None only when optional
        return outcome
    if isinstance(spec, TestsEvaluator):
        return await _tests(spec, sandbox, diff)
    if isinstance(spec, RegexEvaluator):
        return _regex(spec, records)
    if isinstance(spec, SwebenchEvaluator):
        graded = await swebench.grade(spec, sandbox, diff)
        return Outcome(graded.reward, graded.detail, graded.timings, {"swebench": graded.report})
    raise TypeError(f"unknown evaluator spec {type(spec).__name__}")


async def _command(spec: CommandEvaluator | TestsEvaluator, sandbox: Sandbox, env: dict[str, str] | None = None,
                   what: str = "evaluator command") -> Outcome:
    result = await sandbox.exec(spec.command, env=env or {}, timeout_s=spec.timeout_s)
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    tail = output[-DETAIL_TAIL:]
    if result.timed_out:
        return Outcome(0.0, f"{what} timed out after {spec.timeout_s:g}s: {tail}")
    return Outcome(1.0 if result.returncode == 0 else 0.0, f"exit {result.returncode}: {tail}")


async def _tests(spec: TestsEvaluator, sandbox: Sandbox, diff: bytes | str | None) -> Outcome:
    if not isinstance(diff, bytes):
        return Outcome(0.0, f"no workspace diff to test: {diff or 'not captured'}")
    folder, t0 = f".polar-eval-{secrets.token_hex(8)}", time.monotonic()
    try:
        await files.run(lambda: files.write(sandbox.workspace, f"{folder}/logs/.polar", b""), REWARD_FILE_TIMEOUT_S)
        if diff:
            await files.run(lambda: files.write(sandbox.workspace, f"{folder}/submission.diff", diff), None)
            await workspace.apply(sandbox, f"{folder}/submission.diff")
    except workspace.DiffError as e:
        return Outcome(0.0, f"the harness's workspace diff does not apply: {e}")
    try:
        if patch := spec.patch:
            await files.run(lambda: files.write(sandbox.workspace, f"{folder}/tests.patch", patch.encode()), None)
            await workspace.apply(sandbox, f"{folder}/tests.patch")
        if spec.dir:
            await sandbox.upload(Path(spec.dir), f"{folder}/tests")
    except (workspace.DiffError, SandboxError) as e:
        return Outcome(None, f"the task's tests could not be put in place: {e}")
    env = {"POLAR_TESTS_DIR": str(sandbox.workspace / folder / "tests"),
           "POLAR_LOGS_DIR": str(sandbox.workspace / folder / "logs")}
    t1 = time.monotonic()
    ran = await _command(spec, sandbox, env, "tests")
    timings = {"apply_s": round(t1 - t0, 6), "tests_s": round(time.monotonic() - t1, 6)}
    for name in ("reward.txt", "reward.json"):
        found = await _reward_file(sandbox, f"{folder}/logs/{name}", optional=True)
        if found is not None:
            return Outcome(found.reward, f"{found.detail}; tests {ran.detail}", timings)
    return Outcome(ran.reward, f"tests {ran.detail}", timings)


async def _reward_file(sandbox: Sandbox, rel: str, optional: bool = False) -> Outcome | None:
    """The reward in `rel`; None when `optional` and there is no such file."""
    path = sandbox.workspace / rel
    try:
        raw = await files.run(lambda: files.read(sandbox.workspace, rel, REWARD_FILE_MAX), REWARD_FILE_TIMEOUT_S)
    except files.FileError as e:
        if optional and str(e) == f"{path}: not found":
            return None
        return Outcome(None, f"reward file: {e}")
    except OSError as e:
        return Outcome(None, f"reward file {path}: cannot read: {e.strerror}")
    except TimeoutError:
        return Outcome(None, f"reward file {path}: not read within {REWARD_FILE_TIMEOUT_S:g}s")
    if len(raw) > REWARD_FILE_MAX:
        return Outcome(None, f"reward file {path}: larger than {REWARD_FILE_MAX} bytes, not a float")
    text = raw.decode(errors="replace").strip()
    try:
        reward = _json_reward(text) if rel.endswith(".json") else float(text)
    except ValueError:
        return Outcome(None, f"reward file {path}: not a {'reward' if rel.endswith('.json') else 'float'}: "
                             f"{text[:60]!r}")
    if not math.isfinite(reward):
        return Outcome(None, f"reward file {path}: not a finite number: {text!r}")
    return Outcome(reward, f"reward file {path}: {reward:g}")


def _json_reward(text: str) -> float:
    """reward.json's "reward", or its one value: {"reward": 1.0} or {"passed": 0.5}."""
    data = json.loads(text)
    if isinstance(data, dict):
        data = data["reward"] if "reward" in data else next(iter(data.values())) if len(data) == 1 else None
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise ValueError("no reward")
    return float(data)


def _regex(spec: RegexEvaluator, records: list[CallRecord]) -> Outcome:
    try:
        pattern = re.compile(spec.pattern)
    except re.error as e:
        return Outcome(None, f"invalid regex {spec.pattern!r}: {e}")
    try:
        answer = final_answer(records)
    except ValueError as e:
        return Outcome(None, f"no final answer: {e}")
    match = pattern.search(answer)
    if match:
        return Outcome(1.0, f"pattern {spec.pattern!r} matched {match.group(0)[:200]!r}")
    return Outcome(0.0, f"pattern {spec.pattern!r} not found in final answer ({len(answer)} chars)")
