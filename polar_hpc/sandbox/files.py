"""Files under a folder a harness controls, touched from the host without ever following a link.

Every path is walked one component at a time with `openat` and O_NOFOLLOW from a folder the
gateway made (a workspace) or checked (a task's folder), so a symbolic link anywhere on the path (a
linked parent folder included) is refused, never followed, and `..` or an absolute path is refused
outright. Files are opened O_NONBLOCK and must be regular (fstat), so a FIFO, socket or device can
neither block nor be read.

- `read(root, rel, cap)`: the first `cap` + 1 bytes of the regular file `root/rel`.
- `write(root, rel, data)`: create or replace the regular file `root/rel` (folders made as needed).
- `copy(src_root, src_rel, dst_root, dst_rel, budget, stop)`: copy a file or a folder tree; links
  are copied as links, FIFOs, sockets and devices are skipped; stops with `FileError` once more
  than `budget` bytes are written, and when the `stop` event is set (checked every MiB and entry).
- `empty(folder)`: make `folder` an empty folder, no link followed (one in its place replaced).
- `disk_usage(root)`: bytes allocated under `root`, no link followed.
- `run(fn, timeout_s)`: run `fn` in a daemon thread and await it; a thread still stuck at the
  timeout (or at interpreter exit) never holds the event loop or the process's exit.

Each raises `FileError` naming the path and what is wrong with it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import threading
from pathlib import Path, PurePosixPath
from typing import Callable, TypeVar

from polar_hpc.errors import PolarError

CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
T = TypeVar("T")


class FileError(PolarError):
    """A path that is not there, leaves its folder, crosses a link, or is not a regular file."""


class OverBudget(FileError):
    """A copy that would write more than its budget."""


def parts(rel: str) -> list[str]:
    """The components of a relative path; `..`, an absolute path or a NUL byte is refused."""
    path = PurePosixPath(rel)
    if "\0" in rel or path.is_absolute() or ".." in path.parts:
        raise FileError(f"{rel!r} leaves its folder (absolute, '..' or a NUL byte)")
    return [p for p in path.parts if p != "."]


def read(root: Path, rel: str, cap: int) -> bytes:
    """The first `cap` + 1 bytes of the regular file `root/rel` (more than `cap`: it is larger)."""
    fd = _open_file(root, rel, _READ, create=False)
    try:
        chunks, left = [], cap + 1
        while left > 0 and (chunk := os.read(fd, min(left, CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write(root: Path, rel: str, data: bytes) -> None:
    """Create or replace the regular file `root/rel`, making its folders; no link is followed."""
    fd = _open_file(root, rel, _WRITE, create=True)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def copy(src_root: Path, src_rel: str, dst_root: Path, dst_rel: str, budget: int, stop: threading.Event) -> int:
    """Copy `src_root/src_rel` (a file or a folder) to `dst_root/dst_rel`; the bytes written."""
    src, dst = parts(src_rel), parts(dst_rel)
    if not dst:
        raise FileError(f"{dst_rel!r} names the workspace itself")
    left = [budget]
    src_dir = _walk(src_root, src[:-1], create=False)
    try:
        dst_dir = _walk(dst_root, dst[:-1], create=True)
        try:
            name = src[-1] if src else "."
            st = os.stat(name, dir_fd=src_dir, follow_symlinks=False)
            _copy_entry(src_dir, name, st, dst_dir, dst[-1], left, stop, f"{src_root}/{src_rel}")
        finally:
            os.close(dst_dir)
    except FileNotFoundError:
        raise FileError(f"{src_root / src_rel}: not found") from None
    finally:
        os.close(src_dir)
    return budget - left[0]


def empty(folder: Path) -> None:
    """Make `folder` an empty folder: what it holds removed, no link followed (one in its place
    replaced by a folder)."""
    if folder.is_symlink() or not folder.is_dir():
        if folder.is_symlink() or folder.exists():
            folder.unlink()
        folder.mkdir()
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def disk_usage(root: Path) -> int:
    """Bytes allocated under `root` (symlinks not followed)."""
    total = 0
    for folder, dirs, names in os.walk(root):
        for name in names + dirs:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                pass
    return total


async def run(fn: Callable[[], T], timeout_s: float | None) -> T:
    """`fn()` in a daemon thread, awaited up to `timeout_s` (TimeoutError after)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(set_it: Callable, value) -> None:
        if not done.done():
            set_it(value)

    def target() -> None:
        outcome: tuple[Callable, object]
        try:
            outcome = (done.set_result, fn())
        except BaseException as e:  # handed to the awaiting coroutine
            outcome = (done.set_exception, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is gone: nobody waits any more
            pass

    threading.Thread(target=target, daemon=True, name="polar-files").start()
    return await asyncio.wait_for(done, timeout_s)


# --- internals ------------------------------------------------------------------------------------


def _walk(root: Path, names: list[str], create: bool, wanted: Path | None = None) -> int:
    """An O_DIRECTORY fd of `root/names...`, each component opened O_NOFOLLOW (made if `create`);
    a missing folder is reported as `wanted` (the path asked for) not found."""
    fd = os.open(root, _DIR & ~os.O_NOFOLLOW)  # the root is the gateway's own (or a checked) folder
    try:
        for i, name in enumerate(names):
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                new = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                raise FileError(f"{wanted or root.joinpath(*names)}: not found") from None
            except OSError as e:
                raise FileError(_why(root, names[: i + 1], fd, name, e)) from None
            os.close(fd)
            fd = new
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(root: Path, rel: str, flags: int, create: bool) -> int:
    """An fd of the regular file `root/rel` opened with `flags` (its folders made if `create`)."""
    names = parts(rel)
    if not names:
        raise FileError(f"{rel!r} names a folder, not a file")
    folders, name = names[:-1], names[-1]
    parent = _walk(root, folders, create, root.joinpath(*folders, name))
    try:
        fd = os.open(name, flags, 0o644, dir_fd=parent)
    except OSError as e:
        raise FileError(_why(root, folders + [name], parent, name, e)) from None
    finally:
        os.close(parent)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileError(f"{root.joinpath(*folders, name)}: not a regular file ({_kind(mode)})")
    return fd


def _why(root: Path, names: list[str], parent: int, name: str, e: OSError) -> str:
    """What is wrong with the last component of `names`, as a detail for humans."""
    where = root.joinpath(*names)
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        return f"{where}: not found" if e.errno == errno.ENOENT else f"{where}: {e.strerror}"
    if stat.S_ISLNK(mode):
        return f"{where}: a symbolic link (not followed)"
    if e.errno in (errno.ENOTDIR, errno.ENXIO):
        return f"{where}: not a regular file or folder ({_kind(mode)})"
    return f"{where}: {e.strerror}"


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return kind
    return "not a regular file"


def _copy_entry(src_dir: int, name: str, st: os.stat_result, dst_dir: int, dst_name: str,
                left: list[int], stop: threading.Event, shown: str) -> None:
    if stop.is_set():
        raise FileError(f"copy of {shown} stopped")
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=src_dir)
        _spend(left, len(target), shown)
        os.symlink(target, dst_name, dir_fd=dst_dir)
    elif stat.S_ISDIR(st.st_mode):
        try:
            os.mkdir(dst_name, 0o755, dir_fd=dst_dir)
        except FileExistsError:
            pass
        sub_src = os.open(name, _DIR, dir_fd=src_dir)
        try:
            sub_dst = os.open(dst_name, _DIR, dir_fd=dst_dir)
            try:
                for entry in os.scandir(sub_src):
                    entry_st = entry.stat(follow_symlinks=False)
                    _copy_entry(sub_src, entry.name, entry_st, sub_dst, entry.name, left, stop, shown)
            finally:
                os.close(sub_dst)
        finally:
            os.close(sub_src)
    elif stat.S_ISREG(st.st_mode):
        _copy_file(src_dir, name, dst_dir, dst_name, st.st_mode & 0o777, left, stop, shown)
    # FIFOs, sockets and devices are not copied


def _copy_file(src_dir: int, name: str, dst_dir: int, dst_name: str, mode: int,
               left: list[int], stop: threading.Event, shown: str) -> None:
    src = os.open(name, _READ, dir_fd=src_dir)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            return  # replaced by something else since it was listed
        try:
            dst = os.open(dst_name, _WRITE, mode | 0o600, dir_fd=dst_dir)
        except OSError as e:
            raise FileError(f"{shown}: cannot write its copy {dst_name!r}: {e.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(dst).st_mode):
                raise FileError(f"{shown}: its destination {dst_name!r} is not a regular file")
            while chunk := os.read(src, CHUNK):
                if stop.is_set():
                    raise FileError(f"copy of {shown} stopped")
                _spend(left, len(chunk), shown)
                _write_all(dst, chunk)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _spend(left: list[int], n: int, shown: str) -> None:
    left[0] -= n
    if left[0] < 0:
        raise OverBudget(f"copy of {shown} is over the disk limit")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
