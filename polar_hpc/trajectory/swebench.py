"""SWE-bench grading through the official `swebench` package (the `swebench` extra), never by hand.

- `test_spec(instance, namespace)`: the package's TestSpec for a row (its published columns:
  instance_id, repo, version, base_commit, test_patch, FAIL_TO_PASS, PASS_TO_PASS), with the eval
  script the package writes for it (`make_eval_script_list`: reset the test files to base_commit,
  apply test_patch, run the repository's own test command in the `testbed` conda env, reset
  again) and its image name (`instance_image_key`: `swebench/sweb.eval.x86_64.<id>:latest`, the
  id lower-cased with `__` as `_1776_`). make_test_spec itself also renders the image-building
  scripts, which fetch requirements files from GitHub; the image is built already, so those are
  left empty. ValueError when the package does not know the repo / version; SwebenchMissing when
  the package is not installed.
- `await grade(spec, sandbox, diff) -> Graded`: in `sandbox` (a FRESH sandbox of the task's
  image, as SWE-bench's harness uses a fresh container; reward None when its /testbed is not a
  writable git checkout: no image, or a read-only one), the harness's diff is applied to /testbed
  with SWE-bench's own patch commands in their order (none applying: 0.0, as SWE-bench counts it);
  an empty diff is not applied and the unchanged repository is graded. Then the eval script runs
  (`bash eval.sh 2>&1`: one stream, as docker exec gives the package; its first MAX_LOG_BYTES
  kept, not the sandbox's usual output bound), its log is graded by
  `get_eval_report`: the reward is 1.0 when resolved, else 0.0 (a timeout: 0.0); the report
  (resolved, patch applied, FAIL_TO_PASS / PASS_TO_PASS per test) is Graded.report. The
  package's import (seconds) and grading run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from polar_hpc.errors import ToolFailed
from polar_hpc.config import SwebenchEvaluator
from polar_hpc.sandbox import files
from polar_hpc.sandbox.base import Sandbox

NAMESPACE = "swebench"  # SWE-bench's own default (run_evaluation --namespace): its Docker Hub images
REPO_DIR = "/testbed"  # where SWE-bench's images hold the repository (its DOCKER_WORKDIR)
APPLY_TIMEOUT_S = 300.0
GRADED = ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
LOG_TAIL = 2000  # characters of the eval log kept in the detail
MAX_LOG_BYTES = 64 << 20  # of the eval log read (its first bytes); a longer one is graded on those


@dataclass(frozen=True)
class Graded:
    reward: float | None
    detail: str
    timings: dict[str, float] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)  # the package's report for the instance


class SwebenchMissing(ToolFailed):
    """The `swebench` package is not installed."""


def _package() -> Any:
    try:
        import swebench.harness.grading as grading
        import swebench.harness.run_evaluation as run_evaluation
        from swebench.harness import constants
        from swebench.harness.test_spec import create_scripts, test_spec
    except ImportError as e:
        raise SwebenchMissing(f"SWE-bench rows are graded by the swebench package, not importable here ({e}): "
                              "pip install 'polar-hpc[swebench]'") from None
    return constants, create_scripts, test_spec, grading, run_evaluation


def test_spec(instance: dict[str, Any], namespace: str | None = NAMESPACE) -> Any:
    """The package's TestSpec for `instance` (FAIL_TO_PASS / PASS_TO_PASS lists or JSON text)."""
    constants, create_scripts, spec_module, _, _ = _package()
    repo, version = instance["repo"], instance["version"]
    specs = constants.MAP_REPO_VERSION_TO_SPECS.get(repo, {}).get(version)
    if specs is None:
        known = ", ".join(sorted(constants.MAP_REPO_VERSION_TO_SPECS.get(repo, {}))) or "none: unknown repo"
        raise ValueError(f"the swebench package has no spec for {repo} {version} (its versions: {known})")
    lists = {k: json.loads(v) if isinstance(v, str) else v for k, v in instance.items()
             if k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    script = create_scripts.make_eval_script_list(instance, specs, "testbed", REPO_DIR, instance["base_commit"],
                                                  instance["test_patch"])
    return spec_module.TestSpec(
        instance_id=instance["instance_id"], repo=repo, version=version, repo_script_list=[],
        eval_script_list=script, env_script_list=[], arch="x86_64", FAIL_TO_PASS=lists["FAIL_TO_PASS"],
        PASS_TO_PASS=lists["PASS_TO_PASS"], language=constants.MAP_REPO_TO_EXT[repo],
        docker_specs=specs.get("docker_specs", {}), namespace=namespace)


async def grade(spec: SwebenchEvaluator, sandbox: Sandbox, diff: bytes | str | None) -> Graded:
    if not isinstance(diff, bytes):
        return Graded(0.0, f"no workspace diff to grade: {diff or 'not captured'}")
    try:
        tspec = await asyncio.to_thread(test_spec, spec.instance)
        _, _, _, grading, run_evaluation = _package()
    except (SwebenchMissing, ValueError) as e:
        return Graded(None, str(e))
    where = await sandbox.exec(f"test -d {REPO_DIR}/.git || echo missing; test -w {REPO_DIR} || echo read-only", {},
                               APPLY_TIMEOUT_S)
    if problem := where.stdout.decode(errors="replace").split():
        return Graded(None, f"SWE-bench's eval script needs the image's repository at {REPO_DIR}, writable: "
                            f"here it is {' and '.join(problem)} (is the image pulled? does the sandbox give a "
                            "writable image root?)")
    folder, t0 = f".polar-eval-{secrets.token_hex(8)}", time.monotonic()
    await files.run(lambda: files.write(sandbox.workspace, f"{folder}/eval.sh", tspec.eval_script.encode()), None)
    patch = shlex.quote(str(sandbox.workspace / folder / "patch.diff"))
    if diff:
        await files.run(lambda: files.write(sandbox.workspace, f"{folder}/patch.diff", diff), None)
        for command in run_evaluation.GIT_APPLY_CMDS:
            applied = await sandbox.exec(f"cd {REPO_DIR} && {command} {patch} 2>&1", {}, APPLY_TIMEOUT_S)
            if applied.returncode == 0:
                break
        else:
            tail = applied.stdout.decode(errors="replace")[-LOG_TAIL:]
            report = {"resolved": False, "patch_successfully_applied": False}
            return Graded(0.0, f"the harness's diff does not apply to {REPO_DIR}: {tail}", report=report)
    t1 = time.monotonic()
    ran = await sandbox.exec(f"/bin/bash {shlex.quote(str(sandbox.workspace / folder / 'eval.sh'))} 2>&1", {},
                             spec.timeout_s, max_output=MAX_LOG_BYTES)
    timings = {"apply_s": round(t1 - t0, 6), "tests_s": round(time.monotonic() - t1, 6)}
    log = ran.stdout.decode(errors="replace")
    if ran.timed_out:
        return Graded(0.0, f"eval script timed out after {spec.timeout_s:g}s: {log[-LOG_TAIL:]}", timings,
                      {"resolved": False, "timed_out": True})
    report = await asyncio.to_thread(_report, grading, tspec, log, bool(diff))
    resolved = bool(report.get("resolved"))
    return Graded(1.0 if resolved else 0.0, f"swebench: {'resolved' if resolved else 'not resolved'}; eval "
                   f"script exit {ran.returncode}: {log[-LOG_TAIL:]}", timings, report)


def _report(grading: Any, tspec: Any, log: str, patched: bool) -> dict[str, Any]:
    """get_eval_report over `log` (the package reads it from a file)."""
    prediction = {"instance_id": tspec.instance_id, "model_name_or_path": "polar-hpc", "model_patch": "diff"}
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        report = grading.get_eval_report(tspec, prediction, f.name, include_tests_status=True)
    return report[tspec.instance_id] | ({} if patched else {"empty_patch": True})
