"""Tasks with only a Dockerfile (Harbor's `environment/Dockerfile`, no `docker_image`): built once
by `polar-hpc image pull SUITE` with buildah, which needs no daemon, into the image cache
(suites.images), then used like a pulled image.

- `spec(environment, offline)`: what a task records as metadata.build at load time: `context`, a
  hash of its build context (the environment/ folder: every entry's path, mode and bytes, or a
  link's target; at most MAX_CONTEXT_ENTRIES entries and MAX_CONTEXT_BYTES bytes, else ConfigError)
  and of `network`; `network` is `none` where task.toml says `allow_internet = false` (or
  `network_mode = "no-network"`), else `host` (Harbor's default: RUN steps reach the network).
  The cache key is `build:CONTEXT` (suites.images.cache_key), recorded under refs/ like a reference:
  an unchanged task is built once, a changed one is built again.
- `build(task, key, cache)`: `buildah build` (vfs storage and chroot isolation, both rootless-able,
  in a partial/ folder of the cache) with environment/ as the context and the Dockerfile's FROM
  references made canonical as Docker reads them (`python:3.11` is docker.io/library/python:3.11),
  so they resolve through the same registries.conf mirrors as pulls ($POLAR_REGISTRIES_CONF, given
  to buildah as CONTAINERS_REGISTRIES_CONF; a base on loopback is spoken to over plain HTTP); then
  `buildah push` to an OCI layout, published by images.install exactly as a pulled image. A build
  that fails is a ConfigError naming the step buildah names. The buildah storage is dropped after.
- `rootless_ready()`: a build by a user other than root runs as buildah defines rootless use (its
  storage and RUN steps in a user namespace where that user is root and its subordinate ids from
  /etc/subuid and /etc/subgid are the rest, mapped by newuidmap/newgidmap); checked before the
  build, so that a missing tool or range is a ConfigError naming it and the fix, not buildah's
  fall-back to one mapped id failing half-way.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

from polar_hpc.config import Task
from polar_hpc.config_files import read_text
from polar_hpc.errors import ConfigError, ToolFailed
from polar_hpc.suites import images

MAX_CONTEXT_ENTRIES = 100_000
MAX_CONTEXT_BYTES = 1 << 30
MAX_DOCKERFILE_BYTES = 1 << 20
MAX_ID_TABLE_BYTES = 64 << 20  # /etc/subuid, /etc/subgid: a line per user of a site
BUILD_TIMEOUT_S = 3600
ON_HOST = "Dockerfile only: not built, runs on the host's tree + environment/workspace (suite file: dockerfile: host)"
_FROM = re.compile(r"(?P<head>\s*FROM\s+(?:--\S+\s+)*)(?P<ref>\S+)(?P<tail>(?:\s+AS\s+(?P<stage>\S+))?\s*)", re.I)


def spec(environment: Path, offline: bool) -> dict[str, str]:
    """metadata.build of a task whose environment is built from `environment`/Dockerfile."""
    network = "none" if offline else "host"
    digest, entries, size = hashlib.sha256(f"polar-build 1\0network {network}\0".encode()), 0, 0
    for here, dirs, names in os.walk(environment):
        dirs.sort()
        for name in sorted(dirs + names):
            path = Path(here) / name
            entries += 1
            st = path.lstat()
            size += st.st_size
            if entries > MAX_CONTEXT_ENTRIES or size > MAX_CONTEXT_BYTES:
                raise ConfigError(f"{environment}: build context: more than {MAX_CONTEXT_ENTRIES} entries or "
                                  f"{MAX_CONTEXT_BYTES >> 20} MiB")
            digest.update(f"{path.relative_to(environment)}\0{st.st_mode:o}\0".encode())
            if path.is_symlink():
                digest.update(os.readlink(path).encode() + b"\0")
            elif path.is_file():
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
                digest.update(b"\0")
    return {"context": f"sha256:{digest.hexdigest()}", "network": network}


def build(task: Task, key: str, cache: Path, tasks: int = 1) -> images.Pulled:
    """Build `task`'s Dockerfile into `cache` once (ConfigError: buildah missing, a bad FROM or a
    failed build; ToolFailed: a tool failed after the build)."""
    t0 = time.monotonic()
    dockerfile = Path(task.metadata["dockerfile"])
    status = "cached"
    if images.cached_entry(cache, key) is None:
        if shutil.which("buildah") is None:
            raise ConfigError("not built: buildah is not on PATH (e.g. apt-get install buildah; docs/tasks.md)")
        rootless_ready()
        name = "build-" + key.removeprefix("build:sha256:")[:32]
        with images.locked(cache, name):  # another build of this context: wait for it, then reuse
            status = f"reused (waited {time.monotonic() - t0:.0f}s)" if images.cached_entry(cache, key) else "built"
            if images.cached_entry(cache, key) is None:
                partial = cache / "partial" / name
                _drop(partial)  # an interrupted build: started again
                partial.mkdir()
                try:
                    _buildah(partial, dockerfile, task.metadata["build"]["network"])
                except BaseException:
                    _drop(partial)  # nothing of a failed build is kept
                    raise
                _drop(partial / "storage")
                digest = images.layout_digest(partial / "oci")
                images.install(partial / "oci", images.entry_path(cache, digest))
                images.record(cache, key, digest)
    found = images.cached_entry(cache, key)
    assert found is not None, "just built or found"
    return images.Pulled(str(dockerfile), found[0], found[1], status, time.monotonic() - t0, tasks)


def rootless_ready() -> None:
    """Where this process is not root, what buildah's rootless mode needs before anything is built
    (buildah-unshare(1): the user's subordinate ids mapped by newuidmap/newgidmap), else a
    ConfigError naming what is missing; without them buildah falls back to mapping one id, and a
    base whose files belong to other ids fails half-way."""
    uid = os.geteuid()
    if uid == 0:
        return
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    who = f"a rootless build (as {name}, uid {uid})"
    if missing := [tool for tool in ("newuidmap", "newgidmap") if shutil.which(tool) is None]:
        raise ConfigError(f"not built: {who} needs {' and '.join(missing)} on PATH (Debian: apt-get install uidmap; "
                          "docs/tasks.md, Who builds)")
    if lacking := [table for table in ("/etc/subuid", "/etc/subgid") if not _has_range(Path(table), name, uid)]:
        raise ConfigError(f"not built: {who} needs a range of subordinate ids for {name} in {' and '.join(lacking)} "
                          f"(as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {name}; "
                          "docs/tasks.md, Who builds)")


def _has_range(table: Path, name: str, uid: int) -> bool:
    """Whether `table` (/etc/subuid's form: `OWNER:START:COUNT`, OWNER a name or a uid) gives the
    user at least one id."""
    try:
        text = read_text(table, MAX_ID_TABLE_BYTES)
    except ConfigError:
        return False
    for line in text.splitlines():
        owner, _, rest = line.strip().partition(":")
        start, _, count = rest.partition(":")
        if owner in (name, str(uid)) and start.isdigit() and count.isdigit() and int(count) > 0:
            return True
    return False


def _buildah(partial: Path, dockerfile: Path, network: str) -> None:
    """buildah build `dockerfile` (its FROMs made canonical) into the OCI layout partial/oci:image.
    Without network, the bases are pulled first and the build runs in a network namespace of its
    own (chroot isolation takes no --network): its RUN steps see only a loopback with no address."""
    text, bases = canonical(dockerfile)
    (partial / "Dockerfile").write_text(text)
    (partial / "tmp").mkdir()
    store = ["--root", str(partial / "storage"), "--runroot", str(partial / "run"), "--storage-driver", "vfs"]
    tls = ["--tls-verify=false"] if bases and all(b.domain.split(":")[0] in ("localhost", "127.0.0.1") for b in bases) else []
    env = os.environ | {"TMPDIR": str(partial / "tmp"), "BUILDAH_ISOLATION": "chroot"}
    if conf := images.registries_conf():
        env["CONTAINERS_REGISTRIES_CONF"] = conf[1]
    offline: list[str] = []
    if network == "none":
        for base in bases:
            if (r := _run(["buildah", *store, "pull", "--quiet", *tls, str(base)], env)).returncode != 0:
                raise ConfigError(f"build failed: FROM {base}: cannot pull: {images.tail(r.stderr)}")
        offline = ["unshare", "--net"] if os.geteuid() == 0 else ["buildah", "unshare", "unshare", "--net"]
    tag = f"localhost/polar-build/{partial.name}:1"
    r = _run([*offline, "buildah", *store, "build", "--isolation", "chroot", *tls, *(["--pull=never"] if offline else []),
              "--file", str(partial / "Dockerfile"), "--tag", tag, str(dockerfile.parent)], env)
    if r.returncode != 0:
        raise ConfigError(f"build failed: {_failed_step(r.stderr + r.stdout)}")
    r = _run(["buildah", *store, "push", "--quiet", tag, f"oci:{partial / 'oci'}:image"], env)
    if r.returncode != 0:
        raise ToolFailed(f"buildah push exited {r.returncode}: {images.tail(r.stderr)}")


def canonical(dockerfile: Path) -> tuple[str, list[images.Reference]]:
    """`dockerfile`'s text with each FROM image made canonical as Docker reads it (a build stage's
    name, `scratch` and a reference holding `$` left as they are), and those references."""
    text = read_text(dockerfile, MAX_DOCKERFILE_BYTES)
    stages: set[str] = set()
    bases: list[images.Reference] = []
    lines: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        m = _FROM.fullmatch(line)
        if m and m["ref"].lower() not in stages | {"scratch"} and "$" not in m["ref"]:
            try:
                ref = images.parse(m["ref"])
            except ValueError as e:
                raise ConfigError(f"{dockerfile}:{n}: FROM: {e}") from None
            bases.append(ref)
            line = f"{m['head']}{ref}{m['tail']}"
        if m and m["stage"]:
            stages.add(m["stage"].lower())
        lines.append(line)
    return "\n".join(lines) + "\n", bases


def _failed_step(output: str) -> str:
    """buildah's line naming the step that failed (`error building at STEP "RUN ...": ...`), else its last."""
    steps = [x.strip() for x in output.splitlines() if "STEP" in x and ("error" in x.lower() or "fail" in x.lower())]
    return steps[-1][-400:] if steps else images.tail(output)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"build failed: not done within {BUILD_TIMEOUT_S}s") from None


def _drop(path: Path) -> None:
    """Remove `path`; buildah's storage of a build that was not root holds files of its subordinate
    uids, removed inside its user namespace (`buildah unshare`)."""
    if path.exists() and os.geteuid() != 0:
        subprocess.run(["buildah", "unshare", "rm", "-rf", str(path)], capture_output=True, timeout=BUILD_TIMEOUT_S)
    shutil.rmtree(path, ignore_errors=True)
