"""`polar-hpc image pull` against a real registry on loopback, then `polar-hpc run` in the pulled
root filesystem (bubblewrap): the image is fetched once into a cache keyed by digest; a pull killed
midway leaves no entry and the rerun completes from the blobs it kept; a second pull of the same
image while one is under way waits for it and reuses its entry; the oracle's session runs inside
the image (a file only the image has) and scores 1.0; a bad reference and an unreachable registry
are named with the task's file and line (exit 2), and what could be pulled is pulled; with
`apptainer` on PATH (a stand-in: none is installed here) the entry is the SIF it builds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import polar
from e2e.helpers import live_processes_matching, trajectories
from images.conftest import Image, Registry, harbor_task, needs_tools
from sandbox.bwrap_required import needs_bwrap

pytestmark = [needs_tools, needs_bwrap, pytest.mark.timeout(300)]


def _pull(suite: Path, cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "polar_hpc", "image", "pull", str(suite), "--cache", str(cache)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(check, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _waits_for_a_lock(pid: int) -> bool:
    """The kernel lists `pid` as blocked on a file lock (a `->` line of /proc/locks)."""
    return any(fields[1:2] == ["->"] and str(pid) in fields
               for fields in map(str.split, Path("/proc/locks").read_text().splitlines()))


def test_pull_resumes_waits_reuses_and_the_run_uses_the_image(tmp_path: Path, registry: Registry, image: Image) -> None:
    suite = harbor_task(tmp_path / "suite" / "in-image", image.reference, image.marker).parent
    cache = tmp_path / "cache"
    partial = cache / "partial"

    killed = _pull(suite, cache)  # killed while unpacking: every blob fetched, no entry yet
    _wait_for(lambda: any(partial.glob("*/bundle")))
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert not list(cache.glob("sha256-*.rootfs")) and not list((cache / "refs").iterdir())
    assert registry.blob_gets(image.layer) == 1

    first = _pull(suite, cache)  # resumes; stopped with its unpack (before it publishes), holding the lock
    _wait_for(lambda: live_processes_matching(str(partial), "umoci"))
    os.killpg(first.pid, signal.SIGSTOP)  # the pull and its umoci: nothing can publish meanwhile
    assert not list(cache.glob("sha256-*.rootfs"))
    second = _pull(suite, cache)
    _wait_for(lambda: _waits_for_a_lock(second.pid) or second.poll() is not None)
    assert second.poll() is None, "the second pull waits for the first"
    os.killpg(first.pid, signal.SIGCONT)
    out1, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert " pulled " in out1 and "reused (waited" in out2, out1 + out2
    assert registry.blob_gets(image.layer) == 1, "the layer was fetched once, before the kill"
    [entry] = cache.glob("sha256-*.rootfs")
    assert (entry / "etc" / "polar-image").read_text() == image.marker + "\n"
    assert not list(partial.iterdir())

    again = polar("image", "pull", suite, "--cache", cache)
    assert again.returncode == 0 and " cached " in again.stdout, again.stdout + again.stderr

    check = polar("tasks", "check", suite, env=os.environ | {"POLAR_IMAGE_CACHE": str(cache)})
    assert f"docker://{image.reference} (pulled: rootfs)" in check.stdout, check.stdout + check.stderr

    topology = tmp_path / "topology.yaml"
    topology.write_text("sandbox: {backend: bwrap}\n")
    assert not Path("/etc/polar-image").exists()
    run = polar("run", suite, "-c", topology, "--run-dir", tmp_path / "run", timeout=280,
                env=os.environ | {"POLAR_IMAGE_CACHE": str(cache)})
    assert run.returncode == 0, run.stdout + run.stderr
    [traj] = trajectories(tmp_path / "run")
    assert (traj.status, traj.reward) == ("completed", 1.0), traj.metadata
    assert traj.metadata["workspace_diff"]["bytes"] == 0  # answer.txt is /answer.txt: with no WORKDIR it starts at /
    [task] = [json.loads(line) for line in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
    assert (task["sandbox"]["image"], task["metadata"]["image"]["reference"]) == (str(entry), f"docker://{image.reference}")


def test_bad_and_unreachable_references_are_named_and_the_rest_pulled(tmp_path: Path, registry: Registry,
                                                                     image: Image) -> None:
    suite = tmp_path / "suite"
    harbor_task(suite / "good", image.reference, image.marker)
    harbor_task(suite / "gone", f"{registry.address}/polar/absent:1", image.marker)
    harbor_task(suite / "closed", "127.0.0.1:9/polar/env:1", image.marker)
    cache = tmp_path / "cache"
    r = polar("image", "pull", suite, "--cache", cache)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for name, why in (("gone", "manifest unknown"), ("closed", "connection refused")):
        line = f"{suite / name / 'task.toml'}:5: environment.docker_image: docker://"
        assert line in r.stderr and why in r.stderr, r.stderr
    assert "good" not in r.stderr and len(list(cache.glob("sha256-*.rootfs"))) == 1, "the good one is pulled"

    bad = tmp_path / "bad"
    harbor_task(bad / "upper", "Registry.Example/Not/Lower:1", image.marker)
    harbor_task(bad / "option", "--src-creds=x", image.marker)
    r = polar("image", "pull", bad, "--cache", tmp_path / "cache2")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for name in ("upper", "option"):
        assert f"{bad / name / 'task.toml'}:5: environment.docker_image: not an image reference" in r.stderr
    assert not (tmp_path / "cache2").exists(), "nothing is fetched from a suite that does not load"


def test_with_apptainer_the_entry_is_a_sif_built_from_the_layout(tmp_path: Path, registry: Registry,
                                                                image: Image) -> None:
    """A stand-in `apptainer` (none is installed here) records its arguments and writes the SIF."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/called\necho SIF > "$3"\n')
    (bin_dir / "apptainer").chmod(0o755)
    suite = harbor_task(tmp_path / "suite" / "t", image.reference, image.marker).parent
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "POLAR_IMAGE_CACHE": str(tmp_path / "cache")}
    r = polar("image", "pull", suite, env=env)
    assert r.returncode == 0 and " sif " in r.stdout, r.stdout + r.stderr
    [sif] = (tmp_path / "cache").glob("sha256-*.sif")
    partial = tmp_path / "cache" / "partial" / sif.stem
    assert (tmp_path / "called").read_text().split() == ["build", "--force", str(partial / "image.sif"),
                                                         f"oci:{partial / 'oci'}:image"]
    assert sif.read_text() == "SIF\n" and not partial.exists()
    check = polar("tasks", "check", suite, env=env)
    assert "(pulled: sif)" in check.stdout, check.stdout
