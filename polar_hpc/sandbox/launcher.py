"""The compiled launcher (launcher.c): built once per process with the host's `cc`, or None.

`build(folder)` compiles launcher.c into `folder` (the gateway's own tmp folder, at its start:
nothing is shared between versions or nodes; about 0.1-0.3 s once), statically linked where the
host has a static libc (each exec is then a little faster), else dynamically. `path()` is the
binary, built on first use into a folder of this process's own (removed at exit) when `build`
was not called; None where there is no `cc`, the compile failed, or POLAR_SANDBOX_LAUNCHER is
`fallback` (read on every call: tests run both paths). Where it is None, the sandboxes fall back
to the host's prlimit/setpriv and inside.py (bwrap.py), and the first failure says so once in the
log. The binary is the gateway user's (root's in CI), in a folder no sandbox can write.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("launcher.c")
FORCE = "POLAR_SANDBOX_LAUNCHER"  # `fallback`: never the compiled launcher (the tests of the other paths)
_FLAGS = (["-O2", "-static"], ["-O2"])
log = logging.getLogger("polar_hpc.sandbox")
_built: dict[str, Path | None] = {}  # "path": the one build of this process


def build(folder: Path) -> Path | None:
    """Compile launcher.c into `folder` (once per process); the binary, or None (logged once; none
    built where POLAR_SANDBOX_LAUNCHER is `fallback`)."""
    if os.environ.get(FORCE) == "fallback":
        return None
    if "path" in _built:
        return _built["path"]
    cc, out, why = shutil.which("cc") or "", folder / "polar-launcher", "no `cc` on PATH"
    for flags in _FLAGS if cc else ():
        done = subprocess.run([cc, *flags, "-o", str(out), str(SOURCE)], capture_output=True, text=True)
        if done.returncode == 0:
            out.chmod(0o755)
            _built["path"] = out
            return out
        why = f"`cc {' '.join(flags)}` failed: {done.stderr.strip()[-300:]}"
    log.warning("sandbox launcher: %s; commands start through the host's prlimit/setpriv and Python's "
                "inside.py instead (slower; see docs/sandbox.md)", why)
    _built["path"] = None
    return None


def path() -> Path | None:
    """The compiled launcher, or None (see the module's docstring)."""
    if os.environ.get(FORCE) == "fallback":
        return None
    if "path" not in _built:
        folder = Path(tempfile.mkdtemp(prefix="polar-launcher-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        build(folder)
    return _built["path"]
