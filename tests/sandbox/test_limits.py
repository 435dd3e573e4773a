"""RLIMIT_NPROC set by the launcher (the compiled one, inside.py) in a user namespace bounds a fork bomb for a non-root user.

This is the process bound on clusters (no cgroup delegation); the gateway here runs as root, for
whom the kernel does not enforce RLIMIT_NPROC, so the test runs the sandbox as `nobody`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bwrap_required import AVAILABLE, REQUIRED
from polar_hpc.sandbox import launcher as compiled
from polar_hpc.sandbox.base import INSIDE

FORKS = """
import os, time
n = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    print('unbounded', n)
except OSError as e:
    print('bounded', n, e.errno)
"""

PY = "/usr/bin/python3"


def _as_nobody_in_bwrap(*argv: str) -> subprocess.CompletedProcess:
    cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    cmd += ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]
    return subprocess.run(cmd + ["--", *argv], capture_output=True, text=True, timeout=60)


def _usable() -> str | None:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("bwrap") or not Path(PY).exists():
        return "needs root (to become nobody), setpriv, bwrap and /usr/bin/python3"
    probe = _as_nobody_in_bwrap(PY, str(INSIDE), "--", "true")
    if probe.returncode != 0:
        return f"nobody cannot run bwrap + inside.py here: {probe.stderr.strip()}"
    return None


_UNUSABLE = None if REQUIRED and not AVAILABLE else _usable()  # CI: fail, not skip


@pytest.fixture(params=["compiled", "inside.py"])
def launcher(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """The launcher's command, where `nobody` can run it."""
    if request.param == "inside.py":
        yield [PY, str(INSIDE)]
        return
    built = compiled.path()
    if built is None:
        pytest.skip("no `cc` here to build the compiled launcher")
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)
    shutil.copy(built, folder / "launcher")
    yield [str(folder / "launcher")]
    shutil.rmtree(folder)


@pytest.mark.skipif(_UNUSABLE is not None, reason=str(_UNUSABLE))
def test_nproc_bounds_forks_inside_a_user_namespace(launcher: list[str]) -> None:
    bounded = _as_nobody_in_bwrap(*launcher, "--nproc", "32", "--", PY, "-c", FORKS)
    unbounded = _as_nobody_in_bwrap(*launcher, "--", PY, "-c", FORKS)
    assert bounded.stdout.split()[0] == "bounded" and int(bounded.stdout.split()[1]) < 32, bounded
    assert unbounded.stdout.split()[0] == "unbounded", unbounded
