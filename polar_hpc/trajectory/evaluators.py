"""Score a finished session: `await evaluate(spec, sandbox, records) -> Outcome(reward, detail)`.

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

Only the command evaluator runs anything; it sees the sandbox as the harness left it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from polar_hpc.config import CommandEvaluator, RegexEvaluator, RewardFileEvaluator
from polar_hpc.sandbox import files
from polar_hpc.sandbox.base import Sandbox
from polar_hpc.trajectory.messages import final_answer
from polar_hpc.wire import CallRecord

DETAIL_TAIL = 2000  # characters of command output kept in a detail
REWARD_FILE_MAX = 4096  # bytes read from a reward file
REWARD_FILE_TIMEOUT_S = 5.0  # the read of a reward file is given up after this


@dataclass(frozen=True)
class Outcome:
    reward: float | None
    detail: str


async def evaluate(
    spec: CommandEvaluator | RewardFileEvaluator | RegexEvaluator | None,
    sandbox: Sandbox,
    records: list[CallRecord],
) -> Outcome:
    if spec is None:
        return Outcome(None, "no evaluator")
    if isinstance(spec, CommandEvaluator):
        return await _command(spec, sandbox)
    if isinstance(spec, RewardFileEvaluator):
        return await _reward_file(spec, sandbox)
    if isinstance(spec, RegexEvaluator):
        return _regex(spec, records)
    raise TypeError(f"unknown evaluator spec {type(spec).__name__}")


async def _command(spec: CommandEvaluator, sandbox: Sandbox) -> Outcome:
    result = await sandbox.exec(spec.command, env={}, timeout_s=spec.timeout_s)
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    tail = output[-DETAIL_TAIL:]
    if result.timed_out:
        return Outcome(0.0, f"evaluator command timed out after {spec.timeout_s:g}s: {tail}")
    return Outcome(1.0 if result.returncode == 0 else 0.0, f"exit {result.returncode}: {tail}")


async def _reward_file(spec: RewardFileEvaluator, sandbox: Sandbox) -> Outcome:
    path = sandbox.workspace / spec.path
    try:
        raw = await files.run(lambda: files.read(sandbox.workspace, spec.path, REWARD_FILE_MAX), REWARD_FILE_TIMEOUT_S)
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
