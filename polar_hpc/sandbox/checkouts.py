"""The host folders a sandbox must not see so that a task's hidden parts stay hidden.

`around(path)`: for a task's hidden part (its tests, its solution), the folders to cover: the git
checkout holding it, with the repository its history lives in (a worktree's or a submodule's
`.git` file points elsewhere: that repository's work tree is covered too), else the folder holding
the part (the task's folder, holding its tests and solution). `project()`: the same for polar-hpc's
own checkout (nothing for an installed package), whose examples hold tasks and solutions and whose
history holds them all. "/" is never among them. A sandbox that shows the host's tree covers these
and binds back only the folders its interpreter and PATH live in.
"""

from __future__ import annotations

import functools
from pathlib import Path

_GIT_FILE_BYTES = 4096  # a `.git` file is one `gitdir: PATH` line


@functools.cache
def around(path: str) -> tuple[str, ...]:
    here = Path(path).absolute()
    checkout = _checkout(here)
    return checkout if checkout else _not_root((str(here.parent),))


@functools.cache
def project() -> tuple[str, ...]:
    return _checkout(Path(__file__).resolve().parent)


def _checkout(here: Path) -> tuple[str, ...]:
    """The work tree holding `here` and, where its `.git` is a file, the repository it points to."""
    for folder in (here, *here.parents):
        git = folder / ".git"
        try:
            if git.is_dir():
                return _not_root((str(folder),))
            if git.is_file():
                return _not_root((str(folder), *_repository(folder, git)))
        except OSError:
            continue
    return ()


def _repository(folder: Path, git: Path) -> tuple[str, ...]:
    """The repository a `.git` file names: the work tree around its `.git` folder, or the bare one."""
    try:
        with open(git, "rb") as f:
            line = f.read(_GIT_FILE_BYTES).decode(errors="replace").strip()
    except OSError:
        return ()
    if not line.startswith("gitdir:"):
        return ()
    gitdir = (folder / line.removeprefix("gitdir:").strip()).resolve()
    top = next((p for p in (gitdir, *gitdir.parents) if p.name == ".git"), None)
    return (str(top.parent if top else gitdir),)


def _not_root(folders: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f for f in folders if f != "/")
