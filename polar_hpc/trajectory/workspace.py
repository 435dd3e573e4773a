"""A session's workspace base and the harness's diff against it, taken with git INSIDE the sandbox.

- `snapshot(sandbox)`: commit the workspace as it stands after start (task files + prepare) as
  the base, `refs/polar/base` (a `git init` first where it is no repository yet, as in a Harbor
  task; a SWE-bench checkout keeps its history). The harness's own files (its config under HOME,
  which is the workspace, the instruction file, caches, `__pycache__`) are excluded through
  .git/info/exclude. SandboxError when git fails (e.g. no git in the image).
- `capture(sandbox) -> bytes`: `git diff --binary` of everything in the workspace (what .gitignore
  does not hide) against that base: the harness's changes, binary files included (what git cannot
  add, such as a nested repository without a commit, is left out). DiffError when
  git fails (the harness broke .git) or the diff exceeds MAX_DIFF_BYTES.
- `apply(sandbox, rel)`: `git apply` the diff file `rel` of the workspace; DiffError with git's
  output when it does not apply.
git runs with no system or global configuration, hooks off and a fixed identity. Whatever the
harness does to .git can only spoil its own diff: the diff is applied in a fresh sandbox, where it
cannot reach the tests or the reward (evaluators, TestsEvaluator).
"""

from __future__ import annotations

import shlex

from polar_hpc.errors import PolarError
from polar_hpc.sandbox import Sandbox, SandboxError

MAX_DIFF_BYTES = 16 << 20
GIT_TIMEOUT_S = 120.0
GIT = ("git -c user.name=polar -c user.email=polar@localhost -c core.hooksPath=/dev/null -c commit.gpgsign=false "
       "-c init.defaultBranch=main -c core.fsmonitor=false -c safe.directory='*'")
ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}
EXCLUDED = ("/instruction.txt", "/.polar/", "/.codex/", "/.claude/", "/.claude.json", "/.qwen/", "/opencode.json",
            "/.cache/", "/.config/", "/.local/", "/.npm/", "__pycache__/", "*.pyc")
_SNAPSHOT = (f"{{ [ -d .git ] || {GIT} init -q; }} && mkdir -p .git/info && "
             f"printf '%s\\n' {' '.join(map(shlex.quote, EXCLUDED))} >> .git/info/exclude && {GIT} add -A && "
             f"{GIT} commit -q --allow-empty --no-verify -m 'polar: base' && {GIT} update-ref refs/polar/base HEAD")
_CAPTURE = (f"{GIT} add -A --ignore-errors; "
            f"{GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv refs/polar/base")


class DiffError(PolarError):
    """The workspace's diff could not be taken or applied."""


async def snapshot(sandbox: Sandbox) -> None:
    result = await sandbox.exec(_SNAPSHOT, ENV, GIT_TIMEOUT_S)
    if result.returncode != 0 or result.timed_out:
        raise SandboxError(f"cannot snapshot the workspace with git (exit {result.returncode}): "
                           f"{_tail(result.stderr)}")


async def capture(sandbox: Sandbox) -> bytes:
    result = await sandbox.exec(_CAPTURE, ENV, GIT_TIMEOUT_S, max_output=MAX_DIFF_BYTES + 1)
    if result.timed_out:
        raise DiffError(f"git diff did not finish within {GIT_TIMEOUT_S:g}s")
    if result.returncode != 0:
        raise DiffError(f"git diff against the base failed (exit {result.returncode}): {_tail(result.stderr)}")
    if len(result.stdout) > MAX_DIFF_BYTES:
        raise DiffError(f"the workspace diff is larger than {MAX_DIFF_BYTES} bytes")
    return result.stdout


async def apply(sandbox: Sandbox, rel: str) -> None:
    result = await sandbox.exec(f"{GIT} apply --binary --whitespace=nowarn {shlex.quote(rel)}", ENV, GIT_TIMEOUT_S)
    if result.returncode != 0 or result.timed_out:
        raise DiffError(f"git apply failed (exit {result.returncode}): {_tail(result.stderr)}")


def _tail(raw: bytes) -> str:
    return raw[-1000:].decode(errors="replace").strip()
