"""Per-task environment images: `polar-hpc image pull SUITE` fetches each one (or builds a task's
Dockerfile: suites.dockerfile) once into a cache keyed by digest; `use_cached(tasks)` points every
task whose image is there at its cached entry.

- A reference (`parse`) is a registry image, `docker://` optional: `[REGISTRY/]REPO[:TAG][@DIGEST]`,
  Docker's defaults filled in (`python:3.11` is `docker.io/library/python:3.11`). Harbor's
  `docker_image` and a SWE-bench `image` become `sandbox.image: docker://CANONICAL`; anything else
  (a SIF path, another scheme) is not pulled.
- The cache (`cache_dir()`: $POLAR_IMAGE_CACHE, else ~/.cache/polar-hpc/images; the home is on the
  shared filesystem on most clusters):
      refs/H.json            the digest a reference resolved to (H: a hash of the reference), or a
                             build (`build:sha256:CONTEXT`, `cache_key`) produced
      sha256-HEX.sif         the entry where `apptainer` is on PATH (`apptainer build` from the OCI layout)
      sha256-HEX.rootfs/     the entry elsewhere: the root filesystem (`umoci unpack --rootless`),
                             which the bubblewrap sandbox uses as the task's root (`tame`d:
                             no setuid/setgid bit, nothing writable by others, no special
                             file; bwrap mounts it nosuid; pulled as root: owned by 65534, a
                             root gateway's sandbox user: sandbox/layer.py)
      sha256-HEX.config.json the image's OCI config (Env, WorkingDir, User), written before the entry
      partial/sha256-HEX/    an unfinished pull: its OCI layout keeps the blobs fetched so far
      locks/sha256-HEX.lock  held (flock) by the pull of that digest; a second puller waits, then reuses
  An entry is published by one rename once complete, so no half entry is ever used; an interrupted
  pull leaves only `partial/`, which the next pull resumes (skopeo reuses the blobs there).
- `unpulled(tasks)`: the reason each task whose image is not in the cache (pulled or built) is
  refused before a run. A task with only a Dockerfile whose suite file says `dockerfile: host` has
  no build key: it runs on the host's tree, listed by `pull_suite` and `tasks check` as such.
- `install(layout, entry)`: an OCI layout (skopeo's copy, buildah's push) made an entry: the one
  path pulls and builds share; `locked` and `record` the rest of theirs.
- `pull_suite` builds each distinct Dockerfile-only context of a suite (suites.dockerfile), and
  resolves every distinct reference of a suite to its digest (`skopeo inspect`), fetches
  each digest once (`skopeo copy` to an OCI layout), prints a table, and raises ConfigError naming
  the task's file and line for every reference that is malformed or could not be resolved or
  fetched, after pulling all the others. A registry on loopback (127.0.0.1, localhost) is spoken
  to over plain HTTP, as Docker does; every other one over verified TLS, through the mirrors of
  $POLAR_REGISTRIES_CONF (`registries_conf`) where it names some: the reference and its cache key
  stay the published name (`docker.io/library/python:3.11-slim`), wherever the bytes came from.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from polar_hpc.config import Task
from polar_hpc.errors import ConfigError, ToolFailed
from polar_hpc.sandbox.layer import MAX_CONFIG_BYTES
from polar_hpc.sandbox.owner import NOBODY, give

INSPECT_TIMEOUT_S = 120
PULL_TIMEOUT_S = 3600
_DOMAIN = r"(?:localhost|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)(?::[0-9]{1,5})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(rf"(?:(?P<domain>{_DOMAIN})/)?(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
                        r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_LOOPBACK = ("localhost", "127.0.0.1")
NOT_BUILT = "Dockerfile only: not built"
_UNSAFE = stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH  # cleared in an unpacked image



@dataclass(frozen=True)
class Reference:
    domain: str
    repo: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        return f"{self.domain}/{self.repo}" + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def transport(self) -> str:
        return f"docker://{self}"

    def tls_flags(self, option: str = "--tls-verify") -> list[str]:
        """Plain HTTP on loopback; else skopeo's default (verified TLS, but where a registries.conf
        marks a mirror `insecure`), which an explicit --tls-verify=true would override."""
        return [f"{option}=false"] if self.domain.split(":")[0] in _LOOPBACK else []


def parse(text: str) -> Reference:
    """`text` as a registry reference (ValueError saying what is wrong)."""
    body = text.removeprefix("docker://")
    m = _REFERENCE.fullmatch(body) if len(body) <= 512 else None
    if m is None:
        raise ValueError(f"not an image reference ([REGISTRY/]REPO[:TAG][@sha256:DIGEST], lower-case repository): {text[:100]!r}")
    domain, repo = m["domain"], m["repo"]
    if domain is None or ("." not in domain and ":" not in domain and domain != "localhost"):
        domain, repo = "docker.io", body.split("@")[0].split(":")[0]  # `user/repo`: Docker Hub
        repo = repo if "/" in repo else f"library/{repo}"
        if not re.fullmatch(f"{_COMPONENT}(?:/{_COMPONENT})*", repo):
            raise ValueError(f"not an image reference (the repository is lower-case): {text[:100]!r}")
    tag = m["tag"] or (None if m["digest"] else "latest")
    return Reference(domain, repo, tag, m["digest"])


def is_reference(image: str) -> bool:
    """A task's `sandbox.image` names a registry image (not a file, not another scheme)."""
    return image.startswith("docker://")


def cache_dir() -> Path:
    return Path(os.environ.get("POLAR_IMAGE_CACHE") or Path.home() / ".cache" / "polar-hpc" / "images")


def entry_path(cache: Path, digest: str) -> Path:
    """Where the entry of `digest` is: a SIF where apptainer is on PATH, else a root filesystem."""
    return cache / (digest.replace(":", "-") + (".sif" if shutil.which("apptainer") else ".rootfs"))


def use_cached(tasks: list[Task], cache: Path | None = None) -> list[Task]:
    """Each task whose image was pulled (or whose Dockerfile was built) into `cache`, pointed at its
    entry (the reference, or the build key, and the digest kept in metadata.image); the others as
    they are."""
    cache = cache or cache_dir()
    out, entries = [], {}  # key -> its entry (looked up once per key)
    for task in tasks:
        key = cache_key(task)
        if key and key not in entries:
            entries[key] = cached_entry(cache, key)
        found = entries.get(key or "")
        if found is None:
            out.append(task)
            continue
        digest, entry = found
        box = task.sandbox.model_copy(update={"image": str(entry)})
        meta = task.metadata | {"image": {"reference": task.sandbox.image or key, "digest": digest}}
        out.append(task.model_copy(update={"sandbox": box, "metadata": meta}))
    return out


def cache_key(task: Task) -> str | None:
    """What `task`'s image is cached under: its canonical reference (`docker://...`), or for a task
    with only a Dockerfile its build key (`build:sha256:HEX`, suites.dockerfile); None: nothing."""
    image, build = task.sandbox.image, task.metadata.get("build")
    if image and is_reference(image):
        try:
            return parse(image).transport
        except ValueError:
            return None
    return f"build:{build['context']}" if image is None and isinstance(build, dict) else None


def unpulled(tasks: list[Task]) -> list[str]:
    """Why each task whose image is not in the cache (after `use_cached`) cannot run: it is refused,
    never run on the host's tree instead. `FILE:LINE: FIELD: REFERENCE: ...` for a registry image,
    `DOCKERFILE: ...` for a task with only a Dockerfile."""
    pull = "`polar-hpc image pull SUITE`"
    return [f"{_where(t)}: {t.sandbox.image}: not pulled (not in the image cache {cache_dir()}): run {pull} "
            "where its registry or a mirror is reachable (docs/tasks.md, Images)" if t.sandbox.image else
            f"{t.metadata.get('dockerfile')}: {NOT_BUILT} (not in the image cache {cache_dir()}): run {pull} "
            "where buildah works (docs/tasks.md, Tasks with only a Dockerfile)"
            for t in tasks if (is_reference(t.sandbox.image) if t.sandbox.image else cache_key(t))]


def _ref_file(cache: Path, reference: str) -> Path:
    return cache / "refs" / (hashlib.sha256(reference.encode()).hexdigest()[:32] + ".json")


def cached_entry(cache: Path, key: str) -> tuple[str, Path] | None:
    """The digest `key` resolved to in `cache` and its entry, where both are there."""
    try:
        with open(_ref_file(cache, key), "rb") as f:
            digest = json.loads(f.read(4096)).get("digest")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        return None
    entry = entry_path(cache, digest)
    return (digest, entry) if entry.exists() else None


@dataclass
class Pulled:
    reference: str
    digest: str
    entry: Path
    status: str  # pulled, cached, or "reused (waited Ns)"
    seconds: float
    tasks: int


def pull_suite(path: Path, cache: Path, console) -> list[Pulled]:
    """Pull every image `path`'s tasks name, and build every task's Dockerfile (suites.dockerfile),
    into `cache`; print a table; ConfigError for bad ones, after all the others are done."""
    from rich.table import Table

    from polar_hpc import suites
    from polar_hpc.suites import dockerfile

    tasks = suites.load(path, cached_images=False)
    wanted: dict[str, list[Task]] = {}
    for task in tasks:
        if key := cache_key(task):
            wanted.setdefault(key, []).append(task)
    pulls = any(not key.startswith("build:") for key in wanted)  # builds need buildah (suites.dockerfile)
    for tool in ("skopeo" if pulls else "", "apptainer" if shutil.which("apptainer") else "umoci"):
        if tool and wanted and shutil.which(tool) is None:
            raise ToolFailed(f"{tool} is not on PATH: `image pull` needs skopeo, and umoci (local root "
                             "filesystems) or apptainer (SIF images); e.g. apt-get install skopeo umoci")
    done, problems = [], []
    for key, users in wanted.items():
        try:
            if key.startswith("build:"):
                done.append(dockerfile.build(users[0], key, cache, len(users)))
            else:
                done.append(pull(parse(key), cache, len(users)))
        except (ValueError, ConfigError) as e:
            problems.append(f"{users[0].metadata['dockerfile']}: {e}" if key.startswith("build:")
                            else f"{_where(users[0])}: {key}: {e}")
    table = Table("image", "digest", "entry", "status", "MiB", "s", "tasks",
                  title=f"{path}: {len(wanted)} image(s), cache {cache}")
    for p in done:
        table.add_row(p.reference, p.digest[7:19], p.entry.suffix[1:], p.status, f"{_size(p.entry) / 2**20:.1f}",
                      f"{p.seconds:.1f}", str(p.tasks))
    for task in tasks:
        if task.metadata.get("dockerfile") and not cache_key(task):
            table.add_row(str(task.metadata["dockerfile"]), "-", "-", dockerfile.ON_HOST, "-", "-", "1")
    console.print(table)
    if problems:
        raise ConfigError("\n".join(problems))
    return done


def pull(ref: Reference, cache: Path, tasks: int = 1) -> Pulled:
    """Fetch `ref` into `cache` once (ConfigError: unknown or unreachable; ToolFailed: a tool failed)."""
    t0 = time.monotonic()
    digest = ref.digest or _skopeo(["inspect", *ref.tls_flags(), "--no-tags", "--format", "{{.Digest}}", ref.transport],
                                   INSPECT_TIMEOUT_S, ConfigError, "cannot resolve").strip()
    if not _DIGEST.fullmatch(digest):
        raise ConfigError(f"the registry answered no sha256 digest ({digest[:80]!r})")
    entry, status = entry_path(cache, digest), "cached"
    if not entry.exists():
        with locked(cache, entry.stem):  # another pull of this digest: wait for it, then reuse
            status = f"reused (waited {time.monotonic() - t0:.0f}s)" if entry.exists() else "pulled"
            if not entry.exists():
                partial = cache / "partial" / entry.stem
                partial.mkdir(exist_ok=True)
                _skopeo(["copy", "--quiet", *ref.tls_flags("--src-tls-verify"), f"docker://{ref.domain}/{ref.repo}@{digest}",
                         f"oci:{partial / 'oci'}:image"], PULL_TIMEOUT_S, ConfigError, "cannot fetch")
                install(partial / "oci", entry)
    record(cache, ref.transport, digest)
    return Pulled(ref.transport, digest, entry, status, time.monotonic() - t0, tasks)


@contextlib.contextmanager
def locked(cache: Path, name: str) -> Iterator[None]:
    """The cache's folders made (0755 less the umask: never writable by others), then locks/NAME.lock
    held (flock) until the block ends."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.mkdir(mode=0o755, exist_ok=True)
    for sub in ("refs", "locks", "partial"):
        (cache / sub).mkdir(mode=0o755, exist_ok=True)
    with open(cache / "locks" / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install(layout: Path, entry: Path) -> None:
    """The image of the OCI layout `layout` (tag `image`) as the cache entry `entry`: its config
    beside it, then the SIF or the tamed root filesystem, built in `layout`'s folder (a partial/
    one) and published by one rename; that folder is then dropped. Pulls and builds both end here."""
    partial = layout.parent
    _write_atomic(entry.with_suffix(".config.json"), _image_config(layout))  # before the entry: Env, WorkingDir, User
    if entry.suffix == ".sif":
        built = partial / "image.sif"
        _run(["apptainer", "build", "--force", str(built), f"oci:{layout}:image"], "apptainer build")
        os.replace(built, entry)
    else:
        bundle = partial / "bundle"
        shutil.rmtree(bundle, ignore_errors=True)  # an unpack that was interrupted: redone
        _run(["umoci", "unpack", "--rootless", "--image", f"{layout}:image", str(bundle)], "umoci unpack")
        tame(bundle / "rootfs")
        if os.geteuid() == 0:  # the files of a root gateway's sandboxes, root in their user namespace (sandbox/layer.py)
            give(bundle / "rootfs", *NOBODY)
        os.rename(bundle / "rootfs", entry)
    shutil.rmtree(partial, ignore_errors=True)


def record(cache: Path, key: str, digest: str) -> None:
    """refs/: `key` (a reference, or a Dockerfile's build key) resolved to `digest`."""
    _write_atomic(_ref_file(cache, key), json.dumps({"reference": key, "digest": digest}))


def layout_digest(layout: Path) -> str:
    """The manifest digest of the one image in the OCI layout `layout`."""
    try:
        with open(layout / "index.json", "rb") as f:
            digest = json.loads(f.read(MAX_CONFIG_BYTES))["manifests"][0]["digest"]
    except (OSError, ValueError, LookupError, TypeError) as e:
        raise ToolFailed(f"the image's OCI layout names no manifest: {e!r}"[:400]) from None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ToolFailed(f"the image's OCI layout names no sha256 digest ({str(digest)[:80]!r})")
    return digest


def _image_config(layout: Path) -> str:
    """The OCI image config (Env, WorkingDir, User...) of the one image in `layout`, as JSON text."""
    def blob(digest: object) -> dict:
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ToolFailed(f"the image's layout names no sha256 digest ({str(digest)[:80]!r})")
        with open(layout / "blobs" / "sha256" / digest[7:], "rb") as f:
            return json.loads(f.read(MAX_CONFIG_BYTES))

    try:
        return json.dumps(blob(blob(layout_digest(layout))["config"]["digest"]))
    except (OSError, ValueError, LookupError, TypeError) as e:
        raise ToolFailed(f"the image's config cannot be read: {e!r}"[:400]) from None


def registries_conf() -> list[str]:
    """skopeo's `--registries-conf FILE` from $POLAR_REGISTRIES_CONF (else $CONTAINERS_REGISTRIES_CONF),
    a containers-registries.conf(5) file: `[[registry]]` prefix / location / `[[registry.mirror]]`
    location (insecure = true for plain HTTP), so a published name resolves through a site's mirror
    unchanged. Neither set: skopeo's own (/etc/containers/registries.conf, ~/.config/containers/...)."""
    name = "POLAR_REGISTRIES_CONF" if os.environ.get("POLAR_REGISTRIES_CONF") else "CONTAINERS_REGISTRIES_CONF"
    path = os.environ.get(name)
    if not path:
        return []
    if not os.path.isfile(path):
        raise ConfigError(f"{name}={path}: no such file (a containers-registries.conf mapping of registries to mirrors)")
    return ["--registries-conf", path]
def tame(root: Path) -> None:
    """An unpacked image made safe to share: no setuid or setgid bit, nothing writable by group or
    others (the folder itself 0755), no device, FIFO or socket (removed); no link is followed."""
    for _, dirs, names, fd in os.fwalk(root):
        for name in dirs + names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                os.unlink(name, dir_fd=fd)
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode & _UNSAFE:
                os.chmod(name, mode & ~_UNSAFE, dir_fd=fd)
    os.chmod(root, 0o755)


def _skopeo(args: list[str], timeout_s: float, error: type[Exception], what: str) -> str:
    try:
        r = subprocess.run(["skopeo", *registries_conf(), *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise error(f"{what}: no answer within {timeout_s:g}s") from None
    if r.returncode != 0:
        raise error(f"{what}: {tail(r.stderr)}")
    return r.stdout


def _run(argv: list[str], what: str) -> None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=PULL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ToolFailed(f"{what}: not done within {PULL_TIMEOUT_S}s") from None
    if r.returncode != 0:
        raise ToolFailed(f"{what} exited {r.returncode}: {tail(r.stderr)}")


def tail(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    last = lines[-1] if lines else "(no message)"
    return re.sub(r'^time="[^"]*" level=\w+ msg=', "", last)[-400:]


def _where(task: Task) -> str:
    return str(task.metadata.get("image_source") or f"task {task.id}: sandbox.image")


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(path) for n in names)
