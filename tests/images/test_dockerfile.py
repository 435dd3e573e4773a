"""A Harbor task with only a Dockerfile, exactly as published (FROM a published name, WORKDIR, COPY
of a context file, RUN, ENV), built by `polar-hpc image pull` with buildah, FROM reached through a
registries.conf mirror on loopback, the RUN step without network (allow_internet = false): the
oracle scores 1.0 and a no-op 0.0 in the built image (its ENV, WORKDIR and the RUN's file seen by
the harness and the tests); a second pull says cached. A Dockerfile whose build fails is named
with its failing step while the other tasks are built; a task not built is refused before the run.
The built image's users: its USER (made by `useradd` in a RUN) or task.toml's `[agent]`/`[verifier]
user`, checked by `id` inside the sandbox. Rootless builds: as an unprivileged user with subordinate
ids (CI is root: the user polar-build is made here), and refused with what is missing without them."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import polar
from e2e.helpers import trajectories
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


USERS_DOCKERFILE = """FROM debian:trixie
RUN useradd --create-home --uid 1234 builder && useradd --create-home --uid 1235 tester
WORKDIR /app
USER builder
"""


def _user_task(folder: Path, solve: str, user: str | None, expected: str) -> Path:
    """A Harbor task as published, its user checked from inside: the agent writes `id -un` to
    /logs/agent, the tests compare it and their own with `expected` and write reward.json."""
    for sub in ("environment", "solution", "tests"):
        (folder / sub).mkdir(parents=True)
    (folder / "instruction.md").write_text("Write your user name to /logs/agent/user.\n")
    users = f'user = "{user}"\n' if user else ""
    (folder / "task.toml").write_text(f'version = "1.0"\n\n[agent]\ntimeout_sec = 120.0\n{users}\n[verifier]\n'
                                      f'timeout_sec = 60.0\n{users}\n[environment]\nallow_internet = false\n')
    (folder / "environment" / "Dockerfile").write_text(USERS_DOCKERFILE)
    (folder / "solution" / "solve.sh").write_text(solve)
    (folder / "tests" / "test.sh").write_text(
        f'if [ "$(cat /logs/agent/user)" = {expected} ] && [ "$(id -un)" = {expected} ]; then r=1; else r=0; fi\n'
        'printf \'{"reward": %s, "verifier_uid": %s, "agent_uid": %s}\\n\' "$r" "$(id -u)" '
        '"$(cat /logs/agent/uid || echo -1)" > /logs/verifier/reward.json\n')
    return folder


def test_a_dockerfile_only_task_runs_as_its_built_images_user_or_the_tasks(tmp_path: Path, registry: Registry) -> None:
    """USER in the Dockerfile (made by `useradd` in a RUN) is the built image's User: agent and
    tests run as it; `[agent]`/`[verifier] user` in task.toml win over it, as for a pulled image."""
    push_published(registry, tmp_path / "image", "debian:trixie", {"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
                                                             "etc/group": "root:x:0:\nusers:x:100:\n"},
                   ["--config.env", "PATH=/usr/local/bin:/usr/bin:/bin"])
    cache = tmp_path / "cache"
    env = os.environ | {"POLAR_REGISTRIES_CONF": str(mirror_conf(tmp_path / "registries.conf", registry)),
                        "POLAR_IMAGE_CACHE": str(cache)}
    suite, solve = tmp_path / "suite", "id -un > /logs/agent/user; id -u > /logs/agent/uid\n"
    for who, user, expected in (("image-user", None, "builder"), ("task-user", "tester", "tester")):
        _user_task(suite / f"oracle-{who}", solve, user, expected)
        _user_task(suite / f"noop-{who}", "true\n", user, expected)
    pull = polar("image", "pull", suite, env=env, timeout=500)
    assert pull.returncode == 0 and "built" in pull.stdout, pull.stdout + pull.stderr
    [entry] = cache.glob("sha256-*.rootfs")
    assert json.loads(entry.with_suffix(".config.json").read_text())["config"]["User"] == "builder"

    rewards, why = run_rewards(tmp_path, suite, env)
    assert rewards == {"oracle-image-user": ("completed", 1.0), "noop-image-user": ("completed", 0.0),
                       "oracle-task-user": ("completed", 1.0), "noop-task-user": ("completed", 0.0)}, why
    uids = {t.task_id: t.metadata["rewards"] for t in trajectories(tmp_path / "run")}
    assert uids["oracle-image-user"] == {"reward": 1.0, "verifier_uid": 1234.0, "agent_uid": 1234.0}, uids
    assert uids["oracle-task-user"] == {"reward": 1.0, "verifier_uid": 1235.0, "agent_uid": 1235.0}, uids
    assert uids["noop-task-user"] == {"reward": 0.0, "verifier_uid": 1235.0, "agent_uid": -1.0}, uids


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


ROOTLESS = "polar-build"  # the unprivileged user of the rootless builds, as root (CI) makes it
REPO = Path(__file__).resolve().parents[2]


def _as_user(folder: Path, ids: list[str]) -> list[str]:
    """`python3 -m polar_hpc` as the user `ids` name (setpriv's flags), with HOME `folder`; the
    repository and this venv's packages shown to it under `folder` by bind mounts in a mount
    namespace of its own (they may sit where that user cannot look, e.g. under /root)."""
    repo, lib = folder / ".repo", folder / ".lib"
    repo.mkdir()
    lib.mkdir()
    binds = 'mount --bind "$1" "$2" && mount --bind "$3" "$4" && shift 4 && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", binds, "sh",
            str(REPO), str(repo), sysconfig.get_paths()["purelib"], str(lib),
            "setpriv", *ids, "env", f"HOME={folder}", f"PYTHONPATH={repo}:{lib}", "/usr/bin/python3", "-m", "polar_hpc"]


@pytest.fixture
def builder() -> Iterator[tuple[list[str], Path]]:
    """The command that runs `polar-hpc` as an unprivileged user with subordinate ids, and a folder
    of that user's (removed after): this test's own user where it is not root; as root (CI), the
    user polar-build, made here by Debian's useradd, which gives a new user a range of 65536 ids
    in /etc/subuid and /etc/subgid where those files exist. /usr/bin/python3 runs it (this
    interpreter may sit where that user cannot read, e.g. under /root), on this venv's packages."""
    folder = Path(tempfile.mkdtemp(prefix="polar-rootless-"))
    try:
        if os.geteuid() != 0:
            yield [sys.executable, "-m", "polar_hpc"], folder
            return
        for table in ("/etc/subuid", "/etc/subgid"):
            Path(table).touch()
        try:
            user = pwd.getpwnam(ROOTLESS)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                            ROOTLESS], check=True, capture_output=True)
            user = pwd.getpwnam(ROOTLESS)
        os.chown(folder, user.pw_uid, user.pw_gid)
        python = "/usr/bin/python3"
        version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                 text=True).stdout.strip()
        assert version == str(sys.version_info[:2]), f"{python} is {version}: this venv's packages need {sys.version_info[:2]}"
        yield _as_user(folder, ["--reuid", str(user.pw_uid), "--regid", str(user.pw_gid), "--init-groups"]), folder
    finally:
        shutil.rmtree(folder)


def test_an_unprivileged_user_builds_rootless(tmp_path: Path, registry: Registry, builder) -> None:
    """`image pull` as a user other than root builds in buildah's rootless mode (its subordinate
    ids, the RUN steps without network in a user namespace of its own); the entry runs as any other."""
    polar_as_user, folder = builder
    push_published(registry, tmp_path / "image", PUBLISHED, {}, ["--config.env", "PATH=/usr/local/bin:/usr/bin:/bin"])
    cache, suite = folder / "cache", folder / "suite"
    conf = mirror_conf(folder / "registries.conf", registry)
    _task(suite / "oracle", f'{CHECK} || exit 1\necho 42 > "$HOME/answer.txt"\n')
    _task(suite / "noop", "true\n")
    env = os.environ | {"POLAR_REGISTRIES_CONF": str(conf), "POLAR_IMAGE_CACHE": str(cache)}
    pull = subprocess.run([*polar_as_user, "image", "pull", suite], capture_output=True, text=True, env=env, timeout=500)
    assert pull.returncode == 0 and "built" in pull.stdout, pull.stdout + pull.stderr
    [entry] = cache.glob("sha256-*.rootfs")
    assert entry.stat().st_uid == folder.stat().st_uid  # built by that user
    assert (entry / "app" / "from-run.txt").read_text() == "written by RUN in /app\n"
    assert not list((cache / "partial").iterdir())  # its storage (files of subordinate ids) removed too
    rewards, why = run_rewards(tmp_path, suite, env)
    assert rewards == {"oracle": ("completed", 1.0), "noop": ("completed", 0.0)}, why


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run as a user without subordinate ids (nobody)")
def test_a_rootless_build_without_subordinate_ids_says_what_is_missing(tmp_path: Path) -> None:
    """A user with no range in /etc/subuid and /etc/subgid (nobody) is told so before buildah
    starts, with the fix: exit 2, no traceback."""
    folder = Path(tempfile.mkdtemp(prefix="polar-rootless-"))
    try:
        os.chown(folder, 65534, 65534)
        _task(folder / "suite" / "task", "true\n")
        env = os.environ | {"POLAR_IMAGE_CACHE": str(folder / "cache")}
        as_nobody = _as_user(folder, ["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        pull = subprocess.run([*as_nobody, "image", "pull", folder / "suite"], capture_output=True, text=True, env=env,
                              timeout=120)
    finally:
        shutil.rmtree(folder)
    assert pull.returncode == 2 and "Traceback" not in pull.stderr, pull.stderr
    name = pwd.getpwuid(65534).pw_name
    assert (f"{folder}/suite/task/environment/Dockerfile: not built: a rootless build (as {name}, uid 65534) needs a "
            f"range of subordinate ids for {name} in /etc/subuid and /etc/subgid (as root: usermod --add-subuids") in \
        " ".join(pull.stderr.split()), pull.stderr
