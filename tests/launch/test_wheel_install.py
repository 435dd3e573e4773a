"""A built wheel, installed outside the repository, carries what the CLI renders: `polar-hpc sbatch`
finds the slurm/ template and `polar-hpc image build` the containers/ definitions; the `examples`
extra brings the calculator example's openai.

The wheel is built with `uv build --offline` and installed with `--no-deps` into a fresh venv;
its dependencies come from this test's own environment through a .pth line (no network), which
does not make the checkout importable: the polar_hpc that runs is the wheel's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    base = tmp_path_factory.mktemp("wheel")
    subprocess.run([uv, "build", "--offline", "--wheel", "-o", base / "dist", ROOT], check=True, capture_output=True,
                   timeout=300)
    (wheel,) = (base / "dist").glob("polar_hpc-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    subprocess.run([uv, "pip", "install", "--offline", "--no-deps", "--python", venv / "bin" / "python", wheel],
                   check=True, capture_output=True, timeout=120)
    purelib = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "_polar_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _cli(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return subprocess.run([venv / "bin" / "polar-hpc", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_installed_wheel_renders_sbatch_and_finds_image_definitions(wheel_venv: Path, tmp_path: Path,
                                                                        calculator_dir: Path) -> None:
    where = subprocess.run([wheel_venv / "bin" / "python", "-c", "import polar_hpc; print(polar_hpc.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(wheel_venv)), where  # the wheel's package, not the checkout
    run_dir = tmp_path / "run"
    out = _cli(wheel_venv, tmp_path, "sbatch", "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml",
               "--run-dir", run_dir)
    assert out.returncode == 0, out.stderr
    assert "#SBATCH hetjob" in out.stdout and "#SBATCH --gpus-per-node=8" in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith(f"-m polar_hpc driver --run-dir {run_dir}")
    unknown = _cli(wheel_venv, tmp_path, "image", "build", "nonsense")
    assert unknown.returncode == 2 and "known: gateway, harness-node, harness-python" in unknown.stderr, unknown.stderr
    requires = subprocess.run([wheel_venv / "bin" / "python", "-c", "import importlib.metadata as m; "
                               "print('\\n'.join(m.requires('polar-hpc')))"], capture_output=True, text=True).stdout
    assert "openai~=3.51; extra == 'examples'" in requires.splitlines()  # pip install 'polar-hpc[examples]'
    if shutil.which("apptainer") is None:  # the definition is found; only the tool is missing here
        build = _cli(wheel_venv, tmp_path, "image", "build", "harness-python")
        assert build.returncode == 1 and "apptainer is not on PATH" in build.stderr, build.stderr
