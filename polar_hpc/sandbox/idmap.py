"""`idmap.py SRC DEST FROM_UID:FROM_GID TO_UID:TO_GID` (run as root, stdlib only): bind the folder
SRC at DEST (an existing folder of this mount namespace) as an idmapped mount on which SRC's files
of FROM are TO's: a root gateway's image sandbox shows its cache entry (owned by 65534: the
puller's) as owned by the session's own uid, which bwrap then maps to the image's root, so each
session runs as its own host uid and its image's files are still root's inside (layer.py).

The mapping is a user namespace made only for it: a child unshares one, this process writes its
maps ("FROM TO 1" for uids and gids: inside the namespace FROM is TO outside) and keeps a
descriptor of it; then open_tree(OPEN_TREE_CLONE) copies SRC's mount, mount_setattr gives it the
namespace (MOUNT_ATTR_IDMAP) and move_mount attaches it at DEST. Linux 5.12 or later and a file
system that supports idmapped mounts (ext4, xfs, btrfs; tmpfs from 6.3); otherwise it exits 1
saying why, and the command does not run.
"""

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000
OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0x8000, 0x1000
MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH = 0x00100000, 0x4
AT_FDCWD = -100
SYSCALLS = {"x86_64": (428, 442, 429), "aarch64": (428, 442, 429)}  # open_tree, mount_setattr, move_mount
_libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _checked(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def user_namespace(source: tuple[int, int], target: tuple[int, int]) -> int:
    """A descriptor of a new user namespace whose `source` ids are `target` outside."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only holds the namespace open until the parent has its descriptor
        os.close(ready_r)
        os.close(done_w)
        os.write(ready_w, b"1" if _libc.unshare(CLONE_NEWUSER) == 0 else b"0")
        os.read(done_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("unshare(CLONE_NEWUSER) failed")
        for kind, inner, outer in (("uid", source[0], target[0]), ("gid", source[1], target[1])):
            with open(f"/proc/{pid}/{kind}_map", "w") as f:
                f.write(f"{inner} {outer} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def bind_idmapped(src: str, dest: str, source: tuple[int, int], target: tuple[int, int]) -> None:
    open_tree, mount_setattr, move_mount = SYSCALLS[os.uname().machine]
    userns = user_namespace(source, target)
    tree = _checked(_libc.syscall(open_tree, AT_FDCWD, src.encode(), OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE),
                    f"open_tree {src}")
    attr = MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns)
    _checked(_libc.syscall(mount_setattr, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr),
                           ctypes.sizeof(attr)), f"idmapped mount of {src}")
    _checked(_libc.syscall(move_mount, tree, b"", AT_FDCWD, dest.encode(), MOVE_MOUNT_F_EMPTY_PATH), f"move_mount to {dest}")


def _ids(text: str) -> tuple[int, int]:
    uid, gid = text.split(":")
    return int(uid), int(gid)


if __name__ == "__main__":
    try:
        bind_idmapped(sys.argv[1], sys.argv[2], _ids(sys.argv[3]), _ids(sys.argv[4]))
    except (OSError, KeyError, ValueError, IndexError) as e:
        sys.exit(f"idmap.py: {e!r}")
