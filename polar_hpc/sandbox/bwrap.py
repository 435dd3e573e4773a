"""bubblewrap sandbox: read-only host root, private workspace, /tmp and /dev/shm, an unprivileged user.

What a command sees: the host's root read-only (it runs the host's interpreters); its workspace
(at its own path, its cwd) and its tmp (at /tmp) writable; /dev/shm is `ROOT/shm`, on disk and
counted in the session's disk limit; /dev read-only to it (its device nodes still work; remounted
read-only where the command runs in a user namespace, else root's, mode 0755). /run, /root,
/home, the folder holding the other sessions' sandboxes and the `hidden` folders (the run
directory, with its shards and keys) are covered by small empty tmpfs mounts (those under /tmp are
already behind the private /tmp); the folders holding the interpreter and the PATH entries that
live under /tmp, /root or /home are bound back read-only (`shown_dirs`).

With an image (`image` a root filesystem folder: an entry of `polar-hpc image pull`), the host's
tree is not shown at all: / is the image under the session's writable layer (layer.py: a kernel
overlay whose upper folder is in the sandbox's folder, mounted with the folders bwrap binds on a
stage in the command's own mount namespace; the cache entry is never written), then /dev, /proc,
/tmp, /run and the workspace as above. The command runs in its own user namespace as the image's
User (root where unset: a container's default capabilities there, none on the host; its host uid
is `run_as` or the gateway's user), with the image's Env under the task's, in the workspace or
`cwd` where the caller sets one (the image's WorkingDir, `workdir`, is made); the sandbox's
python3 and PATH are the image's. A root gateway drops to `run_as` (setpriv) before bwrap, so
nothing of an image sandbox but its mounts' setup runs as host root. An image that is not a
folder (not pulled) fails the start.
The sandbox's `mounts` (e.g. /tests, /logs/verifier) are bound read-write at their paths (in an
image, through the layer's stage); with them, the host's tree is shown as a tmpfs / holding its
top-level entries read-only, where their mount points can be made.

Who it runs as (owner.py): a gateway that is not root runs bwrap in a user namespace, where bwrap
drops every capability; the command's host uid is the gateway's. A gateway running as root (as in
CI) runs bwrap without a user namespace and with only the capabilities to change user, and
the launcher (`--user`) drops to `run_as` for good before the command starts: no capability,
no_new_privs, root-only host files unreadable. Its process bound is then the sandbox's pids
cgroup; without one RLIMIT_NPROC is set, which counts its processes alone (the uid is its own).

The launcher before each command, on the host's root: the compiled one (launcher.py, launcher.c:
no Python; bound at /run/polar/launcher), which the same binary's `--join` on the host puts in
the sandbox's cgroup before bwrap starts: `cgroup-join -> bwrap -> launcher -> /bin/sh -c CMD`.
It sets the limits, ignores SIGXFSZ, drops to `run_as`, hands the proxy its listener (`--relay`)
and execs the command's shell with the POLAR_ENV_* variables restored (any name). Without it
(no `cc`; POLAR_SANDBOX_LAUNCHER=fallback), where the host has util-linux's `prlimit`
and `setpriv` (one that knows `--ambient-caps`), it is those: `prlimit` sets RLIMIT_NPROC and
RLIMIT_AS where they are needed (else it is not run), `setpriv` drops to `run_as` (a root gateway:
no supplementary groups, every capability set emptied, no_new_privs), then the command's own
`/bin/sh -c` first sets RLIMIT_FSIZE (`ulimit -f`: the bound rounded down to 512 bytes), ignores
SIGXFSZ (as Python does: a write past the file size bound fails with EFBIG) and turns each
POLAR_ENV_NAME into NAME, then runs the command's text (one shell, no second one). The
command's variables travel as POLAR_ENV_* in the environment (readable by its owner alone), never
in a command line, and reach no code before the drop. Python runs only for the proxy relay
(`inside.py --relay`, after the drop). In an image (its own python3), on that fallback without
those tools, or for a variable name that shell cannot restore, `inside.py` does all of it
(`--prefixed-env`).

Each command runs in a new PID namespace with `--die-with-parent`, so killing the bwrap process
(or the command ending) takes every process it started with it: nothing outlives its command.
With network `none` or `proxy-only` the command gets a network namespace with only loopback; the
proxy's relay socket is bound at /run/polar/proxy.sock, where the launcher's `--relay` hands the
proxy a listener on the command's own 127.0.0.1:47111 (proxy/relay.py) for a harness command.
The launcher, inside.py and the socket are bound only into a command that uses them.
With `host` the host network is shared.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from polar_hpc.sandbox import checkouts, launcher
from polar_hpc.sandbox.base import INSIDE, MARKER, SandboxError
from polar_hpc.sandbox.inside import ENV_PREFIX, RELAY_TOKEN
from polar_hpc.sandbox.layer import ROOT_CAPS, STAGE, ImageConfig, Layer, open_up, user_ids
from polar_hpc.sandbox.owner import RunsAs

HOMES = ("/root", "/home")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a command's PATH in an image
_OURS = ("dev", "proc", "tmp", "run")  # what the sandbox mounts itself, never taken from the tree under it
_COVER_BYTES = 1 << 20  # an empty cover only holds mount points
_SETUP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # all inside.py or setpriv needs to drop to `run_as`
# Names the launcher's shell can restore (others, rare, send the command through inside.py): an
# identifier, not ours, not bash's read-only variables (/bin/sh is bash on some hosts).
_RESTORABLE = re.compile(rf"(?!{ENV_PREFIX}|BASH)[A-Za-z_][A-Za-z0-9_]*")
_READ_ONLY = frozenset({"EUID", "PPID", "SHELLOPTS", "UID"})


def available() -> bool:
    """bwrap is installed and can create namespaces on this machine."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = subprocess.run(
        [exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--dev", "/dev", "true"],
        capture_output=True,
    )
    return probe.returncode == 0


@functools.cache
def host_tools() -> dict[str, str] | None:
    """prlimit and setpriv of the host (the launcher without Python), or None if one is missing or
    setpriv cannot empty the ambient capability set (util-linux < 2.31)."""
    found = {name: shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin") or "" for name in ("prlimit", "setpriv")}
    if not all(found.values()):
        return None
    usage = subprocess.run([found["setpriv"], "--help"], capture_output=True, text=True).stdout
    return found if "--ambient-caps" in usage and "--nnp" in usage else None


@functools.cache
def shown_dirs() -> tuple[str, ...]:
    """Folders bound back read-only where they live under a cover (/tmp, /root, /home, a checkout):
    those holding this interpreter, its virtualenv and the PATH entries, each the folder itself and
    not the one around it (a checkout around a virtualenv stays covered; an npm `.bin` comes with
    the node_modules its links point into; a version manager's shims come with the root they
    exec into: `_manager_root`); none inside another,
    which shows it already: each bind costs bwrap a fraction of a ms. Found once per process
    (realpath of every PATH entry: milliseconds, before every command otherwise)."""
    wanted = [sys.prefix, sys.base_prefix, *os.environ.get("PATH", "").split(os.pathsep)]
    shown = {str(_manager_root(_packages(real))) for path in filter(os.path.isabs, wanted)
             if (real := Path(os.path.realpath(path))).is_dir()}
    return _outermost(shown - {"/"})


def _packages(folder: Path) -> Path:
    """npm's `node_modules/.bin` holds links into the packages beside it: its node_modules is shown."""
    return folder.parent if folder.name == ".bin" and folder.parent.name == "node_modules" else folder


def _manager_root(folder: Path) -> Path:
    """A version manager's folder (pyenv's `shims/`, `bin/`, a plugin's shims; rbenv's, nodenv's)
    holds scripts that exec ROOT/libexec/NAME, which reads ROOT's version file and runs the program
    from ROOT/versions/: a folder inside such a ROOT (a folder NAME or .NAME, NAME ending in `env`,
    holding libexec/NAME) shows the whole ROOT, and nothing around it (not the home folder)."""
    for parent in reversed(folder.parents):  # the outermost first: a plugin inside pyenv's root is pyenv's
        name = parent.name.removeprefix(".")
        if name.endswith("env") and (parent / "libexec" / name).is_file():
            return parent
    return folder


def _outermost(folders: set[str]) -> tuple[str, ...]:
    return tuple(sorted(p for p in folders if not any(Path(p).is_relative_to(q) and p != q for q in folders)))


def unreachable(uid: int, gid: int) -> str | None:
    """What keeps `uid:gid` (a root gateway's `run_as`) from running this interpreter in a sandbox
    on the host's root, or None: a folder on its way it cannot search, or the file it cannot run,
    as the sandbox shows them (host modes, except the folders bwrap makes to bind a shown folder back)."""
    covers = ("/tmp", "/run", *HOMES, *checkouts.project())
    made = {str(parent) for d in shown_dirs() if any(Path(d).is_relative_to(c) for c in covers)
            for parent in Path(d).parents if any(parent.is_relative_to(c) for c in covers)}
    for exe in (sys.executable, os.path.realpath(sys.executable)):
        for step in (*reversed(Path(exe).parents), Path(exe)):
            if str(step) in made:
                continue
            st = os.stat(step)
            bits = st.st_mode >> 6 if st.st_uid == uid else st.st_mode >> 3 if st.st_gid == gid else st.st_mode
            if not bits & 1:
                return f"{step} (mode {st.st_mode & 0o7777:04o}, owner {st.st_uid}:{st.st_gid})"
    return None


def _prefixed(command: dict[str, str], token: str | None = None) -> dict[str, str]:
    """bwrap's environment: bwrap runs on the host (as root for a root gateway), so it gets the
    gateway's PATH and the command's variables only as POLAR_ENV_*, which the launcher restores for
    the command alone after the drop: a task's LD_PRELOAD, PATH or PYTHONPATH runs no code before it."""
    own = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", MARKER: command[MARKER]}
    if token is not None:  # the launcher's (inside.py --relay), never the command's
        own[RELAY_TOKEN] = token
    return own | {ENV_PREFIX + k: v for k, v in command.items()}


def _cover(folder: str | Path) -> list[str]:
    return ["--size", str(_COVER_BYTES), "--tmpfs", str(folder)]


def _traversable(path: str, made: set[str]) -> list[str]:
    """Create the mount point's parents 0755 (bwrap makes them 0700, closed to a non-root user),
    those not in `made` (the command line's so far), which then holds them."""
    parents = [str(p) for p in reversed(Path(path).parents[:-1]) if str(p) not in made]
    made.update(parents)
    return [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]


class BwrapSandbox(RunsAs):
    name = "bwrap"
    pid_namespace = True
    isolates_network = True
    binds_mounts = True
    cgroup_sealed = True  # commands join the cgroup before bwrap starts; /sys/fs/cgroup is read-only inside
    inside = "/run/polar/inside.py"  # bound there, so a source tree under /tmp does not hide it
    compiled = "/run/polar/launcher"  # the compiled launcher (launcher.py), bound there

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        rootfs = Path(self.image) if self.image and os.path.isdir(self.image) else None
        self.rootfs = rootfs  # the task's image as a root filesystem folder, or None: the host's root, read-only
        self.layer = Layer(self.root, rootfs) if rootfs else None
        self.side_by_side = self.layer is None  # two overlay mounts of one upper folder would corrupt it
        self.config = ImageConfig.of(rootfs) if rootfs else ImageConfig()
        self.workdir = (self.config.workdir or "/") if rootfs else None  # made in the layer where the image sets one

    @property
    def user_namespace(self) -> bool:  # an image's commands run in one, whoever the gateway is
        return super().user_namespace or self.rootfs is not None

    def _launch_options(self, relay: bool = False) -> list[str]:
        drop = self.privileged and not self.rootfs  # an image sandbox drops before bwrap (layer.py)
        return ["--prefixed-env"] + (["--user", "%d:%d" % self.run_as] if drop else []) + super()._launch_options(relay)

    async def _launch(self) -> None:
        if self.image and self.rootfs is None:  # never the host's tree in place of a missing image
            raise SandboxError(f"sandbox.image: {self.image}: not a root filesystem folder (is it pulled? "
                               "run `polar-hpc image pull SUITE`)")
        await super()._launch()
        for folder in self.layer.folders if self.layer else ():
            folder.mkdir(parents=True, exist_ok=True)
            if self.privileged:
                os.chown(folder, *self.run_as)

    async def _remove(self) -> None:
        if self.layer and not self.privileged:  # folders its root made unreadable to the gateway's user
            await asyncio.to_thread(open_up, self.root)
        await super()._remove()

    def _launcher(self, argv: list[str], relay: bool = False) -> list[str]:
        args = super()._launcher(argv, relay)
        if self.rootfs:
            args[0:1] = ["python3", "-B"]  # the image's; no .pyc written to the session's layer
        return args

    def _process(self, command: str, env: dict[str, str], cwd: str | None = None,
                 user: str | None = None) -> tuple[list[str], dict[str, str]]:
        variables = self._command_environment(env)
        if not self.rootfs and launcher.path() is not None:  # all of inside.py's work, in C
            argv = [self.compiled, *self._launch_options(RELAY_TOKEN in env), "--", "/bin/sh", "-c", command]
            return self._joined(self._wrap(argv, cwd, user)), _prefixed(variables, env.get(RELAY_TOKEN))
        tools = None if self.rootfs else host_tools()
        if tools is None or not all(_RESTORABLE.fullmatch(k) and k not in _READ_ONLY for k in variables):
            return super()._process(command, env, cwd, user)  # inside.py for all of it
        relay = RELAY_TOKEN in env
        options = [o for o in self._launch_options(relay) if o != "--prefixed-env"]  # inside.py's: flag, value pairs
        given = dict(zip(options[::2], options[1::2]))  # the same bounds, set by the host's tools instead
        bounds = [f"{f}={given[f]}:{given[f]}" for f in ("--nproc", "--as") if f in given]  # the file size: below
        chain = [tools["prlimit"], *bounds, "--"] if bounds else []
        if "--user" in given:
            uid, gid = given["--user"].split(":")
            chain += [tools["setpriv"], "--reuid", uid, "--regid", gid, "--clear-groups", "--bounding-set", "-all",
                      "--inh-caps", "-all", "--ambient-caps", "-all", "--nnp", "--"]
        if "--relay" in given:
            chain += [self.python, *self.python_flags, self.inside, "--relay", given["--relay"], "--"]
        # After the drop, the command's shell bounds the file size (POSIX `ulimit -f`: 512-byte
        # blocks, hard and soft; it cannot fail open), ignores SIGXFSZ as inside.py does, moves each
        # POLAR_ENV_NAME to NAME (values never in a command line, which any user of the host can
        # read), then runs the command on the same line (its line numbers unchanged).
        names = sorted(variables)
        restore = (f"ulimit -f {int(given['--fsize']) // 512} || exit 126; trap '' XFSZ; export "
                   + " ".join(f'{k}="${ENV_PREFIX}{k}"' for k in names)
                   + "; unset " + " ".join(ENV_PREFIX + k for k in names) + "; ")
        chain += ["/bin/sh", "-c", restore + command, "/bin/sh"]
        return self._joined(self._wrap(chain, cwd, user)), _prefixed(variables, env.get(RELAY_TOKEN))

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        return _prefixed(self._command_environment(env), env.get(RELAY_TOKEN))

    def _command_environment(self, env: dict[str, str]) -> dict[str, str]:
        """The command's own variables (the relay's token is the launcher's, not the command's)."""
        env = {k: v for k, v in env.items() if k != RELAY_TOKEN}
        if self.rootfs:  # the image's Env (its PATH, else the usual one) under the task's
            return super()._environment({"PATH": IMAGE_PATH} | self.config.env | env) | {"TMPDIR": "/tmp"}
        return super()._environment(env) | {"TMPDIR": "/tmp"}

    def _wrap(self, argv: list[str], cwd: str | None = None, user: str | None = None) -> list[str]:
        if self.rootfs:
            return self._image_wrap(argv, cwd, user)
        if user is not None:
            raise ValueError(f"user {user!r}: only a sandbox of an image runs a command as one of its users")
        ws, made = str(self.workspace), set[str]()
        args = ["bwrap", *self._host_root(made)]
        args += ["--bind", str(self.shm), "/dev/shm"]
        if self.user_namespace:  # there bwrap's /dev is the command's own; as root it is root's, 0755
            args += ["--remount-ro", "/dev"]
        if self.inside in argv:  # what the launcher uses, only (each bind costs bwrap some time)
            args += _traversable(self.inside, made) + ["--ro-bind", str(INSIDE), self.inside]
        if argv[0] == self.compiled:
            args += _traversable(self.compiled, made) + ["--ro-bind", str(launcher.path()), self.compiled]
        if self.relayed and "--relay" in argv:
            args += _traversable(self.proxy_socket_inside, made) + ["--bind", str(self.proxy_socket), self.proxy_socket_inside]
        args += _traversable(ws, made) + ["--bind", ws, ws, "--chdir", cwd or ws]
        for path, folder in self.mounts.items():
            args += _traversable(path, made) + ["--bind", str(folder), path]
        if self.privileged:
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
            args += [arg for cap in _SETUP_CAPS for arg in ("--cap-add", cap)]
            if self.network != "host":
                args.append("--unshare-net")
        else:
            args += ["--unshare-all"] + (["--share-net"] if self.network == "host" else [])
        args += ["--die-with-parent", "--new-session"]
        return args + (["--remount-ro", "/"] if self.mounts else []) + ["--"] + argv

    def _image_wrap(self, argv: list[str], cwd: str | None, user: str | None) -> list[str]:
        """The image under the session's layer as /, the same /dev, /proc, /tmp, /run/polar and
        workspace; bwrap finds its sources on the layer's stage (layer.py), runs in its own user
        namespace as `user` or else the image's User (root: a container's default capabilities,
        only there; its bounding set cut to them; another uid: none) and in its own other
        namespaces, in `cwd` (else the workspace)."""
        assert self.layer is not None and self.rootfs is not None
        ws, stage = str(self.workspace), STAGE
        binds = {"ws": self.workspace, "tmp": self.tmp, "shm": self.shm, "inside.py": INSIDE}
        if self.relayed:
            assert self.proxy_socket is not None
            binds["proxy.sock"] = self.proxy_socket
        args = ["bwrap", "--bind", f"{stage}/root", "/", "--dev", "/dev", "--proc", "/proc",
                "--bind", f"{stage}/tmp", "/tmp", "--perms", "0755", "--tmpfs", "/run",
                "--bind", f"{stage}/shm", "/dev/shm", "--remount-ro", "/dev",
                "--perms", "0755", "--dir", "/run/polar", "--ro-bind", f"{stage}/inside.py", self.inside]
        made = {"/run", "/run/polar"}
        args += _traversable(ws, made) + ["--bind", f"{stage}/ws", ws]
        args += ["--dir", self.config.workdir] if self.config.workdir else []
        args += ["--chdir", cwd or ws]
        if self.relayed:
            args += ["--bind", f"{stage}/proxy.sock", self.proxy_socket_inside]
        for i, (path, folder) in enumerate(self.mounts.items()):
            binds[f"mount{i}"] = folder
            args += _traversable(path, made) + ["--bind", f"{stage}/mount{i}", path]
        uid, gid = user_ids(self.rootfs, self.config.user) if user is None else user_ids(self.rootfs, user, known=True)
        args += ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--unshare-ipc", "--unshare-pid",
                 "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
        args += [a for cap in (ROOT_CAPS if uid == 0 else ()) for a in ("--cap-add", cap)]
        args += ([] if self.network == "host" else ["--unshare-net"]) + ["--die-with-parent", "--new-session"]
        return self.layer.prefix(binds, self.run_as if self.privileged else None) + args + ["--"] + argv

    def _host_root(self, made: set[str]) -> list[str]:
        """The host's root read-only, with the covers and the folders shown back described above."""
        # with `mounts`, / is a tmpfs holding the host's top-level entries, where their mount points can be made
        args = _tmpfs_root(Path("/"), self.tmp) if self.mounts else ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        parent, hidden = str(self.root.parent), tuple(map(str, self.hidden))
        folders = ("/run", *HOMES, parent, *hidden, *checkouts.project())  # other sessions; the run dir; checkouts
        covers, shown, shown_made = _host_view(folders, parent, hidden, tuple(map(os.path.isdir, folders)))
        made.update(shown_made)
        return args + list(covers) + ["--bind", str(self.tmp), "/tmp"] + list(shown)


@functools.lru_cache(maxsize=64)
def _host_view(folders: tuple[str, ...], parent: str, hidden: tuple[str, ...],
               present: tuple[bool, ...]) -> tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]:
    """bwrap's covers of `folders` (those `present`, outside /tmp) before the sandbox's /tmp, then the
    folders shown back (with the mount points they make: the third item) and the covers of `parent`
    and `hidden` inside one of those. The same for every sandbox of a gateway, so worked out once
    for each state of the folders (`present` is part of the key: a folder made later is covered)."""
    exists = dict(zip(folders, present))
    covered = _outermost(set(folders))
    covers = [arg for folder in covered if not Path(folder).is_relative_to("/tmp") and exists[folder]
              for arg in _cover(folder)]
    made: set[str] = set()
    shown = [p for p in shown_dirs() if any(Path(p).is_relative_to(c) for c in ("/tmp", *covered))]
    after: list[str] = []
    for path in shown:
        after += _traversable(path, made) + ["--ro-bind", path, path]
    for folder in (parent, *hidden):  # e.g. a run dir inside a checkout under /tmp
        if any(Path(folder).is_relative_to(top) for top in shown) and exists[folder]:
            after += _cover(folder)
            made.difference_update(m for m in list(made) if Path(m).is_relative_to(folder) and m != folder)
    return tuple(covers), tuple(after), frozenset(made)


def _tmpfs_root(tree: Path, tmp: Path) -> list[str]:
    """/ as a tmpfs holding `tree`'s top-level entries (bound read-only; links recreated, not followed)."""
    args = []
    with os.scandir(tree) as entries:
        for e in sorted(entries, key=lambda e: e.name):
            if e.name in _OURS:
                continue
            if e.is_symlink():
                args += ["--symlink", os.readlink(e.path), f"/{e.name}"]
            elif e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False):
                args += ["--ro-bind", e.path, f"/{e.name}"]
    return args + ["--dev", "/dev", "--proc", "/proc", "--bind", str(tmp), "/tmp", "--perms", "0755", "--tmpfs", "/run"]
