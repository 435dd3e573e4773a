"""`polar-hpc image build NAME`: clear errors for a bad name and a missing apptainer; the build line."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import ROOT, polar


def _env(path: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PATH"} | {"PATH": path}


def test_unknown_image_is_bad_input(tmp_path: Path) -> None:
    r = polar("image", "build", "nope", env=_env("/usr/bin:/bin"))
    assert r.returncode == 2 and "unknown image 'nope' (known: gateway, harness-node, harness-python" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_apptainer_says_where_to_build(tmp_path: Path) -> None:
    r = polar("image", "build", "harness-python", env=_env(str(tmp_path)), cwd=tmp_path)
    assert r.returncode == 1 and "apptainer is not on PATH" in r.stderr and "containers/README.md" in r.stderr
    assert not (tmp_path / "harness-python.sif").exists()


def test_build_runs_apptainer_build_from_the_repository(tmp_path: Path) -> None:
    """A stand-in `apptainer` records its arguments and working folder."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "apptainer"
    fake.write_text(f'#!/bin/sh\necho "$PWD $*" > {tmp_path}/called\n')
    fake.chmod(0o755)
    r = polar("image", "build", "gateway", "-o", tmp_path / "out" / "gw.sif", env=_env(f"{tmp_path}/bin:/usr/bin:/bin"))
    assert r.returncode == 0, r.stderr
    called = (tmp_path / "called").read_text().split()
    assert called == [str(ROOT), "build", "--fakeroot", str(tmp_path / "out" / "gw.sif"),
                      str(ROOT / "containers" / "gateway.def")]
