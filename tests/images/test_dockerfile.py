"""A Harbor task with only a Dockerfile, exactly as published (FROM a published name, WORKDIR, COPY
of a context file, RUN, ENV), built by `polar-hpc image pull` with buildah, FROM reached through a
registries.conf mirror on loopback, the RUN step without network (allow_internet = false): the
oracle scores 1.0 and a no-op 0.0 in the built image (its ENV, WORKDIR and the RUN's file seen by
the harness and the tests); a second pull says cached. A Dockerfile whose build fails is named
with its failing step while the other tasks are built; a task not built is refused before the run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import polar
from images.conftest import Registry, mirror_conf, needs_tools, push_published, refused_before_the_run, run_rewards
from sandbox.bwrap_required import needs_bwrap

needs_buildah = pytest.mark.skipif(shutil.which("buildah") is None and os.environ.get("POLAR_REQUIRE_IMAGES") != "1",
                                   reason="not installed: buildah (CI: POLAR_REQUIRE_IMAGES=1 fails)")
pytestmark = [needs_tools, needs_bwrap, needs_buildah, pytest.mark.timeout(600)]
PUBLISHED = "debian:bookworm"
DOCKERFILE = """# as published: the task's image, built from its environment/ folder
FROM debian:bookworm
WORKDIR /app
COPY data.txt /app/data.txt
RUN echo "written by RUN in $(pwd)" > from-run.txt
RUN [ "$(grep -c : /proc/net/dev)" = 1 ] || { echo "RUN sees more than a loopback"; exit 1; }
ENV APP_MODE=dockerfile-env
"""
CHECK = ('[ "$(pwd)" = /app ] && [ "$(cat /app/data.txt)" = "copied from the context" ] && [ "$(cat /app/from-run.txt)" = '
         '"written by RUN in /app" ] && [ "$APP_MODE" = dockerfile-env ]')
TEST_SH = f"""if {CHECK} && [ "$(cat "$HOME/answer.txt")" = 42 ]; then
  echo 1 > "$POLAR_LOGS_DIR/reward.txt"
else
  echo 0 > "$POLAR_LOGS_DIR/reward.txt"
fi
"""


def _task(folder: Path, solve: str, dockerfile: str = DOCKERFILE) -> Path:
    for sub in ("environment", "solution", "tests"):
        (folder / sub).mkdir(parents=True)
    (folder / "instruction.md").write_text("Write 42 to answer.txt in your home folder.\n")
    (folder / "task.toml").write_text('version = "1.0"\n\n[agent]\ntimeout_sec = 120.0\n\n[verifier]\ntimeout_sec = 60.0\n\n'
                                      '[environment]\nallow_internet = false\n')
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    (folder / "environment" / "data.txt").write_text("copied from the context\n")
    (folder / "solution" / "solve.sh").write_text(solve)
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    return folder


def test_a_dockerfile_only_task_is_built_once_and_runs_in_its_image(tmp_path: Path, registry: Registry) -> None:
    push_published(registry, tmp_path / "image", PUBLISHED, {}, ["--config.env", "PATH=/usr/local/bin:/usr/bin:/bin"])
    cache = tmp_path / "cache"
    env = os.environ | {"POLAR_REGISTRIES_CONF": str(mirror_conf(tmp_path / "registries.conf", registry)),
                        "POLAR_IMAGE_CACHE": str(cache)}
    suite = tmp_path / "suite"
    _task(suite / "oracle", f'{CHECK} || exit 1\necho 42 > "$HOME/answer.txt"\n')
    _task(suite / "noop", "true\n")
    broken = _task(suite / "broken", "true\n", DOCKERFILE.replace("RUN echo", "RUN exit 3; echo"))

    first = polar("image", "pull", suite, env=env, timeout=500)
    assert first.returncode == 2 and "Traceback" not in first.stderr, first.stdout + first.stderr
    assert f"{broken}/environment/Dockerfile: build failed" in first.stderr, first.stderr
    assert 'STEP "RUN exit 3; echo' in first.stderr, first.stderr
    assert "built" in first.stdout, first.stdout  # oracle and noop share one context: one image, built
    [entry] = cache.glob("sha256-*.rootfs")
    config = json.loads(entry.with_suffix(".config.json").read_text())["config"]
    assert config["WorkingDir"] == "/app" and "APP_MODE=dockerfile-env" in config["Env"], config
    assert (entry / "app" / "from-run.txt").read_text() == "written by RUN in /app\n"
    assert not list((cache / "partial").iterdir())  # the builds' storage is gone, the broken one's too

    shutil.rmtree(broken)
    second = polar("image", "pull", suite, env=env, timeout=300)
    assert second.returncode == 0 and "cached" in second.stdout and "built" not in second.stdout, second.stdout
    check = polar("tasks", "check", suite, env=env)
    assert check.returncode == 0 and "(built: rootfs)" in check.stdout, check.stdout + check.stderr

    rewards, why = run_rewards(tmp_path, suite, env)
    assert rewards == {"oracle": ("completed", 1.0), "noop": ("completed", 0.0)}, why
    tasks = [json.loads(line) for line in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
    assert {t["sandbox"]["image"] for t in tasks} == {str(entry)}, tasks


def test_a_dockerfile_only_task_not_built_is_refused_before_the_run(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    task = _task(suite / "unbuilt", "true\n")
    env = os.environ | {"POLAR_IMAGE_CACHE": str(tmp_path / "empty-cache")}
    why = f"{task}/environment/Dockerfile: Dockerfile only: not built (not in the image cache {tmp_path / 'empty-cache'})"
    refused_before_the_run(tmp_path, suite, env, why, "NOT BUILT")
    host = tmp_path / "host.yaml"  # asked for by name, it runs on the host's tree instead, and says so
    host.write_text(f"suite: {suite}\ndockerfile: host\n")
    check = polar("tasks", "check", host, env=env)
    assert check.returncode == 0 and "runs on the host's tree" in check.stdout, check.stdout + check.stderr
