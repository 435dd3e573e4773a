"""A version manager's shim on the gateway's PATH (pyenv's `python3`: a script that execs
ROOT/libexec/pyenv, which runs ROOT/versions/V/bin/python3) runs in a bwrap sandbox on the host's
tree, though ROOT lies under a covered folder (here /tmp; a home folder on a developer's machine):
the sandbox shows the manager's root it needs, and nothing else around it (bwrap.shown_dirs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox.bwrap_required import needs_bwrap

pytestmark = needs_bwrap

SHIM = """#!/usr/bin/env bash
set -e
program="${{0##*/}}"
export PYENV_ROOT="{root}"
exec "{root}/libexec/pyenv" exec "$program" "$@"
"""
PYENV = """#!/usr/bin/env bash
set -e
[ "$1" = exec ] || exit 2
shift
version="$(cat "$PYENV_ROOT/version")"
program="$1"
shift
exec "$PYENV_ROOT/versions/$version/bin/$program" "$@"
"""
CHILD = """
import asyncio, sys
from pathlib import Path
from polar_hpc.sandbox.bwrap import BwrapSandbox

async def go():
    sb = BwrapSandbox(Path(sys.argv[1]), {}, [], "none", hidden=(Path(sys.argv[2]),))
    await sb.start()
    r = await sb.exec(sys.argv[3], {}, 60)
    assert await sb.stop()
    sys.stdout.buffer.write(r.stdout + r.stderr)
    sys.exit(r.returncode)

asyncio.run(go())
"""


def _fake_home(home: Path) -> Path:
    """HOME/.pyenv as pyenv lays it out, its one version's python3 the system's; HOME also holds a
    file no sandbox may see, and ROOT a folder of hidden task parts."""
    root = home / ".pyenv"
    for folder in ("shims", "libexec", "versions/3.99.0/bin", "hidden-task"):
        (root / folder).mkdir(parents=True)
    (root / "shims" / "python3").write_text(SHIM.format(root=root))
    (root / "libexec" / "pyenv").write_text(PYENV)
    (root / "version").write_text("3.99.0\n")
    (root / "versions/3.99.0/bin/python3").symlink_to(os.path.realpath("/usr/bin/python3"))
    for script in (root / "shims" / "python3", root / "libexec" / "pyenv"):
        script.chmod(0o755)
    (home / "secret.txt").write_text("the home's own file")
    (root / "hidden-task" / "test.sh").write_text("a hidden test")
    for folder in (home, *home.parents):  # where run_as (65534, a root gateway's) can reach it, as a home is
        if folder == Path("/tmp"):
            break
        folder.chmod(0o755)
    return root


def test_a_pyenv_shim_on_path_runs_in_the_sandbox_and_shows_only_pyenvs_root(tmp_path: Path) -> None:
    root = _fake_home(tmp_path / "home")
    command = (f"python3 -c 'print(\"ran through the shim\")'; command -v python3; cat {tmp_path}/home/secret.txt; "
               f"cat {root}/hidden-task/test.sh; true")
    env = os.environ | {"PATH": f"{root / 'shims'}:/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "sb"), str(root / "hidden-task"), command],
                          env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr)
    assert out.splitlines()[:2] == ["ran through the shim", f"{root}/shims/python3"], out
    assert "own file" not in out and "a hidden test" not in out, out  # not the home around it, nor what is hidden in it
