"""A small root filesystem made from this machine's own files, for an image built without Docker:
/bin/sh, bash, coreutils, git, useradd and python3 (its stdlib without tests and GUI parts), each with the
shared libraries `ldd` names, in a merged-/usr layout, plus what the caller adds."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

PROGRAMS = ("sh", "dash", "bash", "env", "cat", "cp", "mv", "rm", "ls", "mkdir", "grep", "sed", "true", "false",
            "test", "echo", "sleep", "head", "tail", "wc", "id", "touch", "chmod", "git", "python3", "useradd")
HOST_PATH = "/usr/bin:/bin"  # the system's programs (and python3), never a virtualenv's
PYTHON_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "distutils",
                  "site-packages", "dist-packages", "__pycache__", "unittest", "config-3.11-x86_64-linux-gnu"}


def build(root: Path, extra: dict[str, str]) -> Path:
    """Fill `root` (created) with the programs above and `extra` (path inside -> text)."""
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / "usr" / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(f"usr/{name}")
    programs = {p: os.path.realpath(shutil.which(p, path=f"{HOST_PATH}:/usr/sbin") or f"/usr/bin/{p}") for p in PROGRAMS}
    for p, exe in programs.items():
        shutil.copy2(exe, root / "usr/bin" / p)
    binaries = set(programs.values())
    stdlib = Path(subprocess.run(["/usr/bin/python3", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    shutil.copytree(stdlib, root / stdlib.relative_to("/"), symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in PYTHON_SKIPPED])
    binaries |= set(glob.glob(str(stdlib / "lib-dynload" / "*.so")))
    for lib in _libraries(binaries):
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(os.path.realpath(lib), dest)
    for rel, text in extra.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _libraries(binaries: set[str]) -> set[str]:
    found = set()
    for binary in sorted(binaries):
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        found |= set(re.findall(r"(/\S+\.so[^\s]*)", out))
    return found
