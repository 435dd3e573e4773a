"""A task written for a published image, run as its container would run it, without Docker and
with no registry but a loopback one: the image (built here with umoci: WORKDIR /app, files
COPY'd into /app, an Env) is pushed to the loopback registry and reached under its published name
`docker.io/library/debian:bookworm-slim` through a registries.conf mirror (POLAR_REGISTRIES_CONF).
The oracle scores 1.0 and a no-op harness 0.0 with tests that need root (uid 0, a write under
/usr) and read the files COPY'd into /app; nothing either writes reaches the cache entry.
A task whose image was never pulled is refused before the run, by `tasks check` and `run`, naming
its task.toml line, its reference and `image pull` (tasks with only a Dockerfile: test_dockerfile.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import polar
from images.conftest import Registry, mirror_conf, needs_tools, push_published, refused_before_the_run, run_rewards
from sandbox.bwrap_required import needs_bwrap

pytestmark = [needs_tools, needs_bwrap, pytest.mark.timeout(400)]
PUBLISHED = "debian:bookworm-slim"
IMAGE_PATH = "/usr/local/bin:/usr/bin:/bin"
TEST_SH = """[ "$(id -u)" = 0 ] || { echo "not root"; exit 1; }
mkdir -p /usr/local/share/verifier && touch /usr/local/share/verifier/ran || exit 1
if [ "$(head -n1 /app/data.txt)" = "copied into /app" ] && [ "$APP_MODE" = image-env ] \\
   && [ "$(pwd)" = /app ] && [ "$PATH" = %s ] && [ "$(cat answer.txt)" = 42 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
""" % IMAGE_PATH
SOLVE = '[ "$(pwd)" = /app ] && echo 42 > answer.txt; echo agent >> /app/data.txt\n'
SVC_TEST_SH = """if [ "$(id -u)" = 1000 ] && [ "$(cat /app/by-svc.txt)" = 1000 ] && [ "$(pwd)" = /app ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
SVC = ("user = 1000\n", "[verifier]\nuser = 1000\n")  # under [agent], and after it: Harbor's uid form


def _task(folder: Path, image: str, solve: str, test_sh: str = TEST_SH, toml: tuple[str, str] = ("", "")) -> Path:
    folder.mkdir(parents=True)
    (folder / "instruction.md").write_text("Write 42 to answer.txt in /app.\n")
    (folder / "task.toml").write_text(f'[agent]\ntimeout_sec = 120\n{toml[0]}\n[environment]\n'
                                      f'docker_image = "{image}"\n\n{toml[1]}')
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text(solve)
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text(test_sh)
    return folder


def test_a_published_image_through_a_mirror_runs_as_its_container(tmp_path: Path, registry: Registry) -> None:
    passwd = "root:x:0:0::/root:/bin/sh\nsvc:x:1000:1000::/home/svc:/bin/sh\n"
    push_published(registry, tmp_path / "image", PUBLISHED, {"app/data.txt": "copied into /app\n", "etc/passwd": passwd},
                   ["--config.workingdir", "/app", "--config.env", "APP_MODE=image-env", "--config.env", f"PATH={IMAGE_PATH}"],
                   writable=("app",))
    conf = mirror_conf(tmp_path / "registries.conf", registry)
    cache = tmp_path / "cache"
    env = os.environ | {"POLAR_REGISTRIES_CONF": str(conf), "POLAR_IMAGE_CACHE": str(cache)}
    suite = tmp_path / "suite"
    _task(suite / "oracle", PUBLISHED, SOLVE)
    _task(suite / "noop", PUBLISHED, "true\n")
    _task(suite / "svc-oracle", PUBLISHED, "id -u > /app/by-svc.txt\n", SVC_TEST_SH, SVC)
    _task(suite / "svc-noop", PUBLISHED, "true\n", SVC_TEST_SH, SVC)
    pulled = polar("image", "pull", suite, env=env, timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "docker://docker.io/library/debian:bookworm-slim" in pulled.stdout, pulled.stdout
    [entry] = cache.glob("sha256-*.rootfs")
    assert entry.with_suffix(".config.json").is_file()

    rewards, why = run_rewards(tmp_path, suite, env)
    assert rewards == {"oracle": ("completed", 1.0), "noop": ("completed", 0.0),
                       "svc-oracle": ("completed", 1.0), "svc-noop": ("completed", 0.0)}, why
    assert (entry / "app" / "data.txt").read_text() == "copied into /app\n"  # the agent's append stayed in its layer
    assert not (entry / "usr" / "local" / "share" / "verifier").exists()


def test_a_task_whose_image_was_never_pulled_is_refused_before_the_run(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    _task(suite / "missing", "debian:trixie-slim", "true\n")
    env = os.environ | {"POLAR_IMAGE_CACHE": str(tmp_path / "empty-cache")}
    why = (f"{suite / 'missing' / 'task.toml'}:5: environment.docker_image: docker://docker.io/library/debian:trixie-slim: "
           "not pulled")
    refused_before_the_run(tmp_path, suite, env, why, "NOT PULLED")
