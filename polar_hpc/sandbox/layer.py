"""An image as a container's root, without Docker and without host root: its config (Env,
WorkingDir, User) and a per-session writable layer over the cached root filesystem.

- `ImageConfig.of(rootfs)`: the OCI image config `image pull` saved beside a cache entry
  (`sha256-HEX.config.json` beside `sha256-HEX.rootfs`), read capped and never through a link;
  a folder without one has the empty config (root, no Env, no WorkingDir).
- `Layer(root, rootfs)`: the session's layer under its own folder (`layer/upper/` holds every
  file the session writes or changes in the image, so it counts in the disk limit; `layer/work/`
  is the kernel's). `prefix(binds, drop)` is the command line that runs the rest of a bwrap
  command after util-linux's `unshare` made a private mount namespace (for a gateway that is not
  root, in a new user namespace whose root is the gateway's user) and a shell set up the stage
  there: a 1 MiB tmpfs at STAGE (/mnt) holding the kernel overlay of the entry under `upper/`
  (`userxattr`, nosuid, nodev; Linux 5.11 or later) at STAGE/root and the host folders and files
  bwrap needs, bound beside it; a root gateway then drops to `run_as` (setpriv). The mounts exist
  only in that command's namespaces; the entry is a read-only lower layer, never written.
- `open_up(root)`: before a gateway that is not root removes a session's folder.
- `user_ids(rootfs, user, known)`: a user of the image as (uid, gid) inside the sandbox (a number,
  `N:G`, or a name looked up in the image's /etc/passwd and /etc/group; unset or unknown: root,
  as for the image's own User; with `known` (a task's choice: Harbor's `[agent] user`) an unknown
  name is a ValueError, as `docker exec -u` fails).

Ownership: only the caller's host uid is mapped (to root), so the image's files are root's inside
when that uid owns them: the puller's for a gateway that is not root. A root pull gives its
entries to 65534 (suites/images.py) and a root gateway runs each session as its own uid U
(owner.py): the stage binds the entry at STAGE/lower as an idmapped mount (idmap.py) on which the
entry's owner's files are U's, and that is the overlay's lower layer; so inside they are root's,
copies up land in `upper` as U's, and no session runs as the uid that owns the cache.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from polar_hpc.sandbox import files

IDMAP = Path(__file__).with_name("idmap.py")
MAX_CONFIG_BYTES = 4 << 20
MAX_PASSWD_BYTES = 1 << 20
ROOT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
             "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
             "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")  # a container's root: Docker's default set
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UTIL_LINUX = "/usr/bin:/bin:/usr/sbin:/sbin"
STAGE = "/mnt"  # the stage's mount point: a folder every host has, shadowed only in the command's mount namespace


@dataclass(frozen=True)
class ImageConfig:
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str = ""

    @classmethod
    def of(cls, rootfs: Path) -> ImageConfig:
        try:
            raw = files.read(rootfs.parent, rootfs.with_suffix(".config.json").name, MAX_CONFIG_BYTES)
            config = json.loads(raw[:MAX_CONFIG_BYTES]).get("config") or {}
        except (files.FileError, OSError, ValueError, AttributeError):
            return cls()
        if not isinstance(config, dict):
            return cls()
        env = {}
        for item in config.get("Env") or []:
            name, eq, value = item.partition("=") if isinstance(item, str) else ("", "", "")
            if eq and _NAME.fullmatch(name) and "\0" not in value:
                env[name] = value
        workdir = config.get("WorkingDir")
        workdir = posixpath.normpath(workdir) if isinstance(workdir, str) and workdir.startswith("/") else None
        user = config.get("User")
        return cls(env, workdir if workdir and "\0" not in workdir else None, user if isinstance(user, str) else "")


def user_ids(rootfs: Path, user: str, known: bool = False) -> tuple[int, int]:
    """(uid, gid) of `user` inside the sandbox; root where it is unset or not found, unless `known`
    (then a name the image does not have is a ValueError)."""
    name, _, group = user.partition(":")
    uid = _lookup(rootfs, "etc/passwd", name, 2)
    gid = _lookup(rootfs, "etc/group", group, 2) if group else _lookup(rootfs, "etc/passwd", name, 3)
    if known and (uid is None or (group and gid is None)):
        missing = f"user {name!r}" if uid is None else f"group {group!r}"
        raise ValueError(f"user {user!r}: the image has no {missing} (its /etc/passwd, /etc/group)")
    return uid if uid is not None else 0, gid if gid is not None else (uid or 0)


def _lookup(rootfs: Path, table: str, key: str, column: int) -> int | None:
    if key.isdigit():
        return int(key) if int(key) < 1 << 31 else None
    if not key:
        return None
    try:
        text = files.read(rootfs, table, MAX_PASSWD_BYTES)[:MAX_PASSWD_BYTES].decode(errors="replace")
    except (files.FileError, OSError):
        return None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > column and fields[0] == key and fields[column].isdigit():
            return int(fields[column])
    return None


class Layer:
    """The session's writable layer over `rootfs` and the namespaces a command of it starts in."""

    def __init__(self, root: Path, rootfs: Path) -> None:
        self.rootfs = rootfs
        self.upper, self.work = root / "layer" / "upper", root / "layer" / "work"

    @property
    def folders(self) -> tuple[Path, ...]:
        return self.upper, self.work

    def prefix(self, binds: dict[str, Path], drop: tuple[int, int] | None) -> list[str]:
        """The command line that runs the rest (bwrap) with the stage in place: a private mount
        namespace (a new user namespace too, whose root is the caller, unless `drop`: a root
        gateway's, which mounts as host root in a mount namespace of its own and then drops to
        `drop` with setpriv: no supplementary groups, no inheritable or ambient capability,
        no_new_privs) holding a 1 MiB tmpfs at STAGE with the overlay at STAGE/root and each of
        `binds` (a name in the stage: a host folder or file) bound there, so bwrap, whoever it
        runs as, finds every source at a path it can reach."""
        tools = {name: shutil.which(name, path=_UTIL_LINUX) for name in ("unshare", "mount", "setpriv")}
        if not all(tools.values()):
            raise ValueError("an image's writable root needs util-linux's unshare, mount and setpriv")
        paths = (self.rootfs, self.upper, self.work)
        if any(c in str(p) for p in paths for c in ",:\n"):  # the kernel's option syntax cannot quote them
            raise ValueError(f"an image layer path holds ',', ':' or a newline: {paths}")
        mount = shlex.quote(str(tools["mount"]))
        script = [f"{mount} -t tmpfs -o mode=0755,size=1m polar-stage {STAGE}", f"mkdir {STAGE}/root"]
        lower = str(self.rootfs)
        if drop is not None:  # the entry's owner (the puller) shown as the session's own uid, root inside
            st = os.stat(self.rootfs)
            lower = f"{STAGE}/lower"
            script += [f"mkdir {lower}", shlex.join([sys.executable, "-I", "-S", str(IDMAP), str(self.rootfs), lower,
                                                     f"{st.st_uid}:{st.st_gid}", "%d:%d" % drop])]
        options = f"userxattr,nosuid,nodev,lowerdir={lower},upperdir={self.upper},workdir={self.work}"
        script.append(f"{mount} -t overlay -o {shlex.quote(options)} polar-layer {STAGE}/root")
        for name, source in binds.items():
            make = "mkdir" if source.is_dir() else "touch"
            script += [f"{make} {STAGE}/{name}", f"{mount} --bind {shlex.quote(str(source))} {STAGE}/{name}"]
        if drop is None:
            namespaces = ["--user", "--map-root-user", "--mount"]
            script.append('exec "$@"')
        else:
            namespaces = ["--mount", "--propagation", "private"]
            script.append(f"exec {shlex.quote(str(tools['setpriv']))} --reuid {drop[0]} --regid {drop[1]} --clear-groups "
                          '--inh-caps -all --ambient-caps -all --nnp -- "$@"')
        return [str(tools["unshare"]), *namespaces, "--", "/bin/sh", "-ec", "; ".join(script), "sh"]


def open_up(root: Path) -> None:
    """Give the owner rwx on every folder under `root` (never through a link), so that a gateway
    that is not root can remove what its sandbox's root made unreadable (`chmod 000` folders, the
    overlay's own work folder)."""
    for _, dirs, _, fd in os.fwalk(root):  # top-down: each folder is opened up before it is entered
        for name in dirs:
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_PATH, dir_fd=fd)
            except OSError:
                continue
            try:
                os.chmod(f"/proc/self/fd/{sub}", 0o700)
            except OSError:
                pass
            finally:
                os.close(sub)
