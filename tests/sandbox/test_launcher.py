"""The compiled launcher's build: without a compiler the sandbox falls back to the older chain and
says so once (sandbox/launcher.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bwrap_required import REQUIRED

HOST_PATH = "/usr/local/bin:/usr/bin:/bin"

SCRIPT = """
import logging, sys
from pathlib import Path
from polar_hpc.sandbox import launcher
from polar_hpc.sandbox.bwrap import BwrapSandbox
logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
print(launcher.build(Path(sys.argv[1])), launcher.build(Path(sys.argv[1])), launcher.path())
sb = BwrapSandbox(Path(sys.argv[1]) / "sb", {}, [], "none")
argv, _ = sb._process("true", {"POLAR_SANDBOX_ID": "m"})
print("compiled" if sb.compiled in argv else "fallback")
"""


def _build(tmp_path: Path, path: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env={"PATH": path}, check=True)
    return done.stdout.splitlines()


def test_without_cc_the_sandbox_falls_back_and_says_so_once(tmp_path: Path) -> None:
    lines = _build(tmp_path, "/nonexistent")
    assert [line for line in lines if line.startswith("WARNING")] == [
        "WARNING sandbox launcher: no `cc` on PATH; commands start through the host's prlimit/setpriv and "
        "Python's inside.py instead (slower; see docs/sandbox.md)"], lines
    assert lines[-2:] == ["None None None", "fallback"], lines


@pytest.mark.skipif(shutil.which("cc", path=HOST_PATH) is None and not REQUIRED, reason="no `cc` here (CI installs one)")
def test_with_cc_the_gateway_s_folder_holds_the_one_build(tmp_path: Path) -> None:
    lines = _build(tmp_path, HOST_PATH)
    built = str(tmp_path / "polar-launcher")
    assert lines == [f"{built} {built} {built}", "compiled"], lines
    assert (tmp_path / "polar-launcher").stat().st_mode & 0o777 == 0o755
