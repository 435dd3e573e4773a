"""What a gateway leaves and checks on its node: nothing in TMPDIR (its folder of sockets and
session folders is removed when it exits); a root gateway refuses to start where its harnesses'
user cannot run its Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import polar

from polar_hpc.config import UID_RANGE


def test_a_run_leaves_nothing_in_tmpdir(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    (tmp_path / "task.yaml").write_text("id: t\ninstruction: hi\nnum_samples: 2\nharness: {command: 'echo hi'}\n")
    result = polar("run", tmp_path / "task.yaml", "--run-dir", tmp_path / "run", timeout=300,
                   env=os.environ | {"TMPDIR": str(tmpdir)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmpdir.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a root gateway drops harnesses to run_as")
def test_a_root_gateway_whose_python_run_as_cannot_reach_is_refused_at_start(tmp_path: Path) -> None:
    """The checkout (here: a virtualenv made of links to ours) in a 0700 folder: the sessions' uids cannot run
    its Python, so the gateway refuses to start, saying so, instead of every session failing."""
    closed = Path(tempfile.mkdtemp(dir="/var/tmp"))  # 0700, root's
    try:
        venv = closed / "venv"
        (venv / "bin").mkdir(parents=True)
        shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv / "pyvenv.cfg")
        (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
        (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
        (tmp_path / "task.yaml").write_text("id: t\ninstruction: hi\nharness: {command: 'echo hi'}\n")
        result = subprocess.run([str(venv / "bin" / "python"), "-m", "polar_hpc", "run", str(tmp_path / "task.yaml"),
                                 "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(closed)
    assert result.returncode != 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    first, last = UID_RANGE
    assert f"sandbox.uid_range [{first}, {last}]: its uids cannot run this Python ({venv}/bin/python) in a sandbox: {closed} " \
           "(mode 0700, owner 0:0) is closed to it" in out, out[-3000:]
