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

- TestsEvaluator, as Harbor verifies: `sandbox` is the harness's own sandbox as it left it
  (`spec.sandbox` "session"), or a FRESH one of the task ("fresh": its base snapshotted, never seen
  by the harness) where `diff`, the harness's workspace diff (trajectory.workspace), is applied
  first in a folder of a random name made only now (`.polar-eval-<hex>`; one that does not apply,
  or no diff at all, scores 0.0). Then the task's test patch is applied, its tests folder is put at
  /tests (the sandbox's mount, emptied first: $POLAR_TESTS_DIR), /logs/verifier is emptied
  ($POLAR_LOGS_DIR), and `spec.command` runs with `spec.env` under `spec.timeout_s`. The rewards,
  read as Harbor reads them: /logs/verifier/reward.json if it is there (a JSON object; every
  number in it kept, in `Outcome.rewards`; without a "reward" key, reward.txt's number, if any, is
  its "reward"), else reward.txt (one number: "reward"); the reward is rewards["reward"] (None
  without it). No reward file, or one that is empty, malformed, linked, special, over
  REWARD_FILE_MAX or non-finite, is an error (`Outcome.error`, the reason), never the exit code
  (unless `spec.reward` is "exit_code": then 1.0 on exit 0, else 0.0, and no file is read).
  The detail ends with the tail of the tests' output.

- SwebenchEvaluator: graded by the official swebench package (trajectory.swebench) in a FRESH
  sandbox with the harness's diff; its report goes to the Outcome's metadata["swebench"].

The command evaluator sees the sandbox as the harness left it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from polar_hpc.config import CommandEvaluator, RegexEvaluator, RewardFileEvaluator, SwebenchEvaluator, TestsEvaluator
from polar_hpc.sandbox import SandboxError, files
from polar_hpc.sandbox.base import ExecResult, Sandbox
from polar_hpc.trajectory import swebench, workspace
from polar_hpc.trajectory.messages import final_answer
from polar_hpc.wire import CallRecord

DETAIL_TAIL = 2000  # characters of command output kept in a detail
REWARD_FILE_MAX = 4096  # bytes read from a reward file
REWARD_FILE_TIMEOUT_S = 5.0  # the read of a reward file is given up after this
TESTS, VERIFIER = "/tests", "/logs/verifier"  # Harbor's container paths: the sandbox's mounts


Run = Callable[[str, dict[str, str], float], Awaitable[ExecResult]]


@dataclass(frozen=True)
class Outcome:
    reward: float | None
    detail: str
    timings: dict[str, float] = field(default_factory=dict)  # TestsEvaluator: apply_s, tests_s
    metadata: dict = field(default_factory=dict)  # for the trajectory's metadata (SwebenchEvaluator: its report)
    rewards: dict[str, float] = field(default_factory=dict)  # TestsEvaluator: every number of reward.json
    error: str | None = None  # TestsEvaluator: why there is no reward (the session ends `error`)


async def evaluate(
    spec: CommandEvaluator | RewardFileEvaluator | RegexEvaluator | TestsEvaluator | SwebenchEvaluator | None,
    sandbox: Sandbox,
    records: list[CallRecord],
    diff: bytes | str | None = None,
    run: Run | None = None,
) -> Outcome:
    """`diff`: the harness's workspace diff (TestsEvaluator), or why it could not be taken; `run`
    runs the tests' command (command, env, timeout_s) in place of `sandbox.exec`."""
    if spec is None:
        return Outcome(None, "no evaluator")
    if isinstance(spec, CommandEvaluator):
        return await _command(spec, sandbox)
    if isinstance(spec, RewardFileEvaluator):
        return await _reward_file(sandbox, spec.path)
    if isinstance(spec, TestsEvaluator):
        return await _tests(spec, sandbox, diff, run)
    if isinstance(spec, RegexEvaluator):
        return _regex(spec, records)
    if isinstance(spec, SwebenchEvaluator):
        graded = await swebench.grade(spec, sandbox, diff)
        return Outcome(graded.reward, graded.detail, graded.timings, metadata={"swebench": graded.report})
    raise TypeError(f"unknown evaluator spec {type(spec).__name__}")


async def _command(spec: CommandEvaluator | TestsEvaluator, sandbox: Sandbox, env: dict[str, str] | None = None,
                   what: str = "evaluator command", run: Run | None = None) -> Outcome:
    result = await (run or sandbox.exec)(spec.command, env or {}, spec.timeout_s)
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    tail = output[-DETAIL_TAIL:]
    if result.timed_out:
        return Outcome(0.0, f"{what} timed out after {spec.timeout_s:g}s: {tail}")
    return Outcome(1.0 if result.returncode == 0 else 0.0, f"exit {result.returncode}: {tail}")


async def _tests(spec: TestsEvaluator, sandbox: Sandbox, diff: bytes | str | None, run: Run | None) -> Outcome:
    folder, t0 = f".polar-eval-{secrets.token_hex(8)}", time.monotonic()
    try:
        if spec.sandbox == "fresh":
            if not isinstance(diff, bytes):
                return Outcome(0.0, f"no workspace diff to test: {diff or 'not captured'}")
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
            await sandbox.put(TESTS, Path(spec.dir))
        await sandbox.put(VERIFIER, None)
    except (workspace.DiffError, SandboxError, OSError) as e:
        reason = f"the task's tests could not be put in place: {e}"
        return Outcome(None, reason, error=reason)
    env = spec.env | {"POLAR_TESTS_DIR": sandbox.seen_at(TESTS), "POLAR_LOGS_DIR": sandbox.seen_at(VERIFIER)}
    t1 = time.monotonic()
    try:
        ran = await _command(spec, sandbox, env, "tests", run)
    except (SandboxError, files.FileError) as e:  # e.g. a held command's gate spoiled from inside
        return Outcome(None, f"the tests could not run: {e}", error=f"the tests could not run: {e}")
    timings = {"apply_s": round(t1 - t0, 6), "tests_s": round(time.monotonic() - t1, 6)}
    if spec.reward == "exit_code":
        return Outcome(ran.reward, f"tests {ran.detail}", timings)
    found = await _rewards(sandbox.mounts[VERIFIER], sandbox.seen_at(VERIFIER))
    if isinstance(found, str):
        return Outcome(None, f"{found}; tests {ran.detail}", timings, error=found)
    rewards, source = found
    reward = rewards.get("reward")
    scalar = f"{reward:g}" if reward is not None else "no \"reward\" key: reward None"
    return Outcome(reward, f"{source}: {scalar}; tests {ran.detail}", timings, rewards=rewards)


async def _rewards(host: Path, shown: str) -> tuple[dict[str, float], str] | str:
    """Harbor's rewards in the folder `host` (shown as `shown`) and the file they came from, or why none."""
    text = {}
    for name in ("reward.json", "reward.txt"):
        try:
            raw = await files.run(functools.partial(files.read, host, name, REWARD_FILE_MAX), REWARD_FILE_TIMEOUT_S)
        except files.FileError as e:
            if str(e) == f"{host / name}: not found":
                continue
            return f"reward file {shown}/{name}: {str(e).removeprefix(str(host / name) + ': ')}"
        except (OSError, TimeoutError) as e:
            return f"reward file {shown}/{name}: cannot read: {getattr(e, 'strerror', None) or 'timed out'}"
        if len(raw) > REWARD_FILE_MAX:
            return f"reward file {shown}/{name}: larger than {REWARD_FILE_MAX} bytes"
        text[name] = raw.decode(errors="replace").strip()
    if not text:
        return f"no reward file: the tests wrote neither {shown}/reward.json nor {shown}/reward.txt"
    try:
        if "reward.json" not in text:
            return {"reward": _number(text["reward.txt"])}, f"{shown}/reward.txt"
        rewards = _json_rewards(text["reward.json"])
        if "reward" not in rewards and "reward.txt" in text:
            rewards["reward"] = _number(text["reward.txt"])
        return rewards, f"{shown}/reward.json"
    except ValueError as e:
        return f"reward file {shown}/{'reward.json' if 'reward.json' in text else 'reward.txt'}: {e}"


def _number(text: str) -> float:
    if not text:
        raise ValueError("empty")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text[:60]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text[:60]!r}")
    return value


def _json_rewards(text: str) -> dict[str, float]:
    """Every number of reward.json's object (other values left out, as Harbor leaves them)."""
    if not text:
        raise ValueError("empty")
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"not JSON: {text[:60]!r}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    rewards = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if bad := [k for k, v in rewards.items() if not math.isfinite(v)]:
        raise ValueError(f"not a finite number: {bad[0]!r}")
    return rewards


async def _reward_file(sandbox: Sandbox, rel: str) -> Outcome:
    """The reward in `rel`."""
    path = sandbox.workspace / rel
    try:
        raw = await files.run(lambda: files.read(sandbox.workspace, rel, REWARD_FILE_MAX), REWARD_FILE_TIMEOUT_S)
    except files.FileError as e:
        return Outcome(None, f"reward file: {e}")
    except OSError as e:
        return Outcome(None, f"reward file {path}: cannot read: {e.strerror}")
    except TimeoutError:
        return Outcome(None, f"reward file {path}: not read within {REWARD_FILE_TIMEOUT_S:g}s")
    if len(raw) > REWARD_FILE_MAX:
        return Outcome(None, f"reward file {path}: larger than {REWARD_FILE_MAX} bytes, not a float")
    text = raw.decode(errors="replace").strip()
    try:
        reward = float(text)
    except ValueError:
        return Outcome(None, f"reward file {path}: not a float: {text[:60]!r}")
    if not math.isfinite(reward):
        return Outcome(None, f"reward file {path}: not a finite number: {text!r}")
    return Outcome(reward, f"reward file {path}: {reward:g}")


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
