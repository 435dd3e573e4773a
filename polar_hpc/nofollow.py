"""Files of the run directory opened without following a link, reading or writing.

Whoever can write the run directory (a group-shared one) could plant `logs/x.log -> ~/.ssh/id_rsa`
or `metrics.jsonl -> ~/.bashrc`. Every process of ours opens a run-directory file through `open_fd`
/ `fopen`: the file and the `below - 1` folders above it (e.g. `logs/`) are each opened with
O_NOFOLLOW under a directory fd of the one before (the run directory itself is the user's choice),
and a non-regular file (FIFO, device) is refused, so a link or a FIFO planted there is an OSError
(ELOOP, ENOTDIR, ENXIO), never another file. `listdir(folder)` lists a folder opened the same way;
`is_file` / `stat` look without following.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_MODES = {"r": os.O_RDONLY, "rb": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
          "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
          "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "r+b": os.O_RDWR}


def _folder(path: Path, below: int) -> int:
    """A directory fd of `path`, its last `below` components each opened O_NOFOLLOW."""
    names = path.parts[len(path.parts) - below:] if below else ()
    fd = os.open(Path(*path.parts[:len(path.parts) - below]) if below else path, os.O_RDONLY | os.O_DIRECTORY
                 | os.O_CLOEXEC)
    try:
        for name in names:
            inner = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fd(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o644, below: int = 1) -> int:
    """An fd of the regular file `path`; it and the `below - 1` folders above it not followed."""
    path = Path(path)
    parent = _folder(path.parent, below - 1)
    try:
        fd = os.open(path.name, flags | _SAFE, mode, dir_fd=parent)
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ENXIO, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return fd


def fopen(path: Path | str, how: str = "rb", below: int = 1, **kwargs: Any) -> Any:
    """open()'s file object for `open_fd` (modes r, rb, a, ab, w, wb, r+b)."""
    return os.fdopen(open_fd(path, _MODES[how], below=below), how, **kwargs)


def read_bytes(path: Path | str, below: int = 1) -> bytes:
    with fopen(path, "rb", below) as f:
        return f.read()


def read_text(path: Path | str, below: int = 1) -> str:
    return read_bytes(path, below).decode("utf-8", errors="replace")


def listdir(folder: Path | str, below: int = 1) -> list[str]:
    """The names in `folder` (its last `below` components not followed)."""
    fd = _folder(Path(folder), below)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def lstat(path: Path | str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def is_file(path: Path | str) -> bool:
    st = lstat(path)
    return st is not None and stat.S_ISREG(st.st_mode)
