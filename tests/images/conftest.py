"""A real registry (Debian's docker-registry: the CNCF distribution registry) on loopback, and an
image built without Docker (umoci: a layer of rootfs.py's files and a marker only the image has),
pushed to it with skopeo. Without those tools the tests skip, unless POLAR_REQUIRE_IMAGES=1 (CI)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import polar
from e2e.helpers import trajectories

from images import rootfs

TOOLS = ("skopeo", "umoci", "docker-registry")
MISSING = [t for t in TOOLS if shutil.which(t) is None]
needs_tools = pytest.mark.skipif(bool(MISSING) and os.environ.get("POLAR_REQUIRE_IMAGES") != "1",
                                 reason=f"not installed: {', '.join(MISSING)} (CI: POLAR_REQUIRE_IMAGES=1 fails)")


@dataclass
class Registry:
    address: str  # 127.0.0.1:PORT
    log: Path  # its access log: which blobs were fetched

    def blob_gets(self, digest: str) -> int:
        return sum("GET /v2/" in line and f"/blobs/{digest} " in line for line in self.log.read_text().splitlines())


@dataclass
class Image:
    reference: str  # 127.0.0.1:PORT/polar/env:1
    marker: str  # the text of /etc/polar-image, a file only the image has
    layer: str  # the digest of its one layer


@pytest.fixture(scope="package")
def registry(tmp_path_factory) -> Registry:
    folder = tmp_path_factory.mktemp("registry")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (folder / "config.yml").write_text(
        f"version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {folder / 'data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}', secret: {secrets.token_hex(16)}}}\n")
    log = folder / "registry.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["docker-registry", "serve", str(folder / "config.yml")], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", log)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="package")
def image(registry: Registry, tmp_path_factory) -> Image:
    folder = tmp_path_factory.mktemp("image")
    marker = f"only-in-the-image-{secrets.token_hex(6)}"
    rootfs.build(folder / "root", {"etc/polar-image": marker + "\n"})
    layout = f"{folder / 'oci'}:1"
    for argv in (["umoci", "init", "--layout", str(folder / "oci")], ["umoci", "new", "--image", layout],
                 ["umoci", "insert", "--rootless", "--image", layout, str(folder / "root"), "/"]):
        subprocess.run(argv, check=True, capture_output=True)
    reference = f"{registry.address}/polar/env:1"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{reference}"],
                   check=True, capture_output=True)
    manifest = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{reference}"],
                              check=True, capture_output=True, text=True).stdout
    [layer] = [x["digest"] for x in json.loads(manifest)["layers"]]
    return Image(reference, marker, layer)


def push_published(registry: Registry, folder: Path, name: str, files: dict[str, str], config: list[str],
                   writable: tuple[str, ...] = ()) -> None:
    """An image of rootfs.py's files and `files` (the folders `writable` made 0777, as a Dockerfile's
    chown would let any user write there), its config set by `umoci config` arguments, pushed as
    `library/NAME`: what a mirror (`mirror_conf`) serves for docker.io/library/NAME."""
    rootfs.build(folder / "root", files)
    for rel in writable:
        (folder / "root" / rel).chmod(0o777)
    layout = f"{folder / 'oci'}:1"
    for argv in (["umoci", "init", "--layout", str(folder / "oci")], ["umoci", "new", "--image", layout],
                 ["umoci", "insert", "--rootless", "--image", layout, str(folder / "root"), "/"],
                 ["umoci", "config", "--image", layout, *config]):
        subprocess.run(argv, check=True, capture_output=True)
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}",
                    f"docker://{registry.address}/library/{name}"], check=True, capture_output=True)


def mirror_conf(path: Path, registry: Registry) -> Path:
    """A registries.conf serving docker.io's names from `registry` (plain HTTP)."""
    path.write_text(f'[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n\n'
                    f'[[registry.mirror]]\nlocation = "{registry.address}"\ninsecure = true\n')
    return path


def run_rewards(tmp_path: Path, suite: Path, env: dict[str, str]) -> tuple[dict[str, tuple], list]:
    """`polar-hpc run` (bubblewrap) of `suite`: each task's (status, reward), and why (error, evaluation)."""
    topology = tmp_path / "topology.yaml"
    topology.write_text("sandbox: {backend: bwrap}\n")
    run = polar("run", suite, "-c", topology, "--run-dir", tmp_path / "run", timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    done = trajectories(tmp_path / "run")
    rewards = {t.task_id: (t.status, t.reward) for t in done}
    return rewards, [(t.metadata.get("error"), t.metadata.get("evaluation")) for t in done]


def refused_before_the_run(tmp_path: Path, suite: Path, env: dict[str, str], why: str, mark: str) -> None:
    """`tasks check` and `run` of `suite` exit 2 saying `why` (and `image pull`); the table marks the task."""
    check = polar("tasks", "check", suite, env=env)
    assert check.returncode == 2 and why in check.stderr and "polar-hpc image pull" in check.stderr, check.stderr
    assert mark in check.stdout, check.stdout
    run = polar("run", suite, "--run-dir", tmp_path / "run", env=env)
    assert run.returncode == 2 and why in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "run" / "tasks.jsonl").exists()


def harbor_task(folder: Path, image: str, marker: str) -> Path:
    """A Harbor task whose environment is `image`: the oracle copies the image's marker into
    answer.txt, and the hidden tests reward 1.0 only if the answer and their own view of the image agree."""
    folder.mkdir(parents=True)
    (folder / "instruction.md").write_text("Write the content of /etc/polar-image to answer.txt.\n")
    (folder / "task.toml").write_text(f'[agent]\ntimeout_sec = 120\n\n[environment]\ndocker_image = "{image}"\n')
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text("cat /etc/polar-image > answer.txt\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text(
        f'if [ "$(cat answer.txt)" = {marker} ] && [ "$(cat /etc/polar-image)" = {marker} ]; then\n'
        '  echo 1 > "$POLAR_LOGS_DIR/reward.txt"\nelse\n  echo 0 > "$POLAR_LOGS_DIR/reward.txt"\nfi\n')
    return folder
