"""A SWE-bench row as published, run by the real `polar-hpc run` in an image shaped like SWE-bench's
(swebench_image.py), pulled under the name SWE-bench gives it (docker.io/swebench/sweb.eval...)
through a registries.conf mirror on loopback, graded by the swebench package: the oracle (gold
patch) resolves it (1.0), a no-op does not (0.0: its FAIL_TO_PASS test fails), and an agent that
fixes the code AND rewrites the test file is still graded on the row's own tests (1.0), because
the eval script resets test files to base_commit before applying test_patch. The package's
per-test report is in each trajectory's metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import polar
from e2e.helpers import trajectories
from images import swebench_image
from images.conftest import Registry, needs_tools
from sandbox.bwrap_required import needs_bwrap
from suites.swebench_rows import F2P, INSTANCE_ID, P2P, row

pytestmark = [needs_tools, needs_bwrap, pytest.mark.timeout(900)]
IMAGE = "docker.io/swebench/sweb.eval.x86_64.pallets_1776_flask-4242:latest"  # SWE-bench's name for the row's image

# fixes the code and vandalises the test file the row's test_patch touches
AGENT = ("sed -i 's/a - b/a + b/' calc.py && printf 'def test_zero():\\n    assert False\\n' > tests/test_calc.py")


@pytest.fixture(scope="module")
def published(registry: Registry, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The dataset (one row, JSONL) and the environment naming the mirror and the image cache,
    which holds the row's image, pulled by `image pull` under SWE-bench's name for it."""
    folder = tmp_path_factory.mktemp("swebench")
    root, commits = swebench_image.build(folder)
    swebench_image.push(root, folder, f"{registry.address}/{IMAGE.removeprefix('docker.io/')}")
    conf = folder / "registries.conf"
    conf.write_text(f'[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n\n'
                    f'[[registry.mirror]]\nlocation = "{registry.address}"\ninsecure = true\n')
    env = os.environ | {"POLAR_REGISTRIES_CONF": str(conf), "POLAR_IMAGE_CACHE": str(folder / "cache")}
    data = folder / "verified.jsonl"
    data.write_text(json.dumps(row(commits)) + "\n")
    pulled = polar("image", "pull", data, env=env, timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert f"docker://{IMAGE}" in pulled.stdout, pulled.stdout
    check = polar("tasks", "check", data, env=env)
    assert "(pulled: rootfs)" in check.stdout and "swebench (pallets/flask 2.3" in check.stdout, (
        check.stdout + check.stderr)
    return data, env


@pytest.mark.parametrize("harness, reward", [
    ("{kind: oracle}", 1.0),
    ("{kind: noop}", 0.0),
    (json.dumps({"kind": "shell", "command": AGENT}), 1.0),
], ids=["oracle", "noop", "agent-edits-tests"])
def test_graded_by_the_swebench_package(tmp_path: Path, published, harness: str, reward: float) -> None:
    data, env = published
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"suite: {data}\nharness: {harness}\n")
    topology = tmp_path / "topology.yaml"
    topology.write_text("sandbox: {backend: bwrap}\n")
    run = polar("run", suite, "-c", topology, "--run-dir", tmp_path / "run", timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    [traj] = trajectories(tmp_path / "run")
    assert (traj.task_id, traj.status, traj.reward) == (INSTANCE_ID, "completed", reward), (
        traj.metadata.get("evaluation"), traj.metadata.get("error"))
    report = traj.metadata["swebench"]
    assert report["resolved"] is (reward == 1.0) and report["patch_successfully_applied"], report
    tests = report["tests_status"]
    if reward == 1.0:
        assert tests["FAIL_TO_PASS"] == {"success": F2P, "failure": []}, report
        assert tests["PASS_TO_PASS"] == {"success": P2P, "failure": []}, report
    else:
        assert tests["FAIL_TO_PASS"] == {"success": [], "failure": F2P} and report.get("empty_patch"), report
    if "sed" in harness:  # the vandalised test file was in the diff, and the eval reset it
        assert "assert False" in traj.metadata["workspace_diff"]["data"]
