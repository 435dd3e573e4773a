"""Apptainer images polar-hpc ships as definition files in containers/, and building them.

`build_argv(name, output, fakeroot)` is the `apptainer build` command line for `name` (gateway,
harness-python, harness-node, or a path to a .def file); `build(...)` runs it from the repository
root (gateway.def copies the repository in, so it is built from a checkout; an installed wheel
carries the definitions as polar_hpc/_assets/containers/). Bad names are a `ConfigError`; a missing `apptainer`
is a `ToolFailed` that says where to build instead.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from polar_hpc import assets
from polar_hpc.errors import ConfigError, ToolFailed

CONTAINERS = assets.folder("containers")



def names() -> list[str]:
    return sorted(p.stem for p in CONTAINERS.glob("*.def"))


def definition(name: str) -> Path:
    path = Path(name)
    if path.suffix == ".def":
        if not path.is_file():
            raise ConfigError(f"image build: no such definition file: {path}")
        return path.resolve()
    path = CONTAINERS / f"{name}.def"
    if not path.is_file():
        raise ConfigError(f"image build: unknown image {name!r} (known: {', '.join(names())}, or a path to a .def file)")
    return path


def build_argv(name: str, output: Path, fakeroot: bool, executable: str = "apptainer") -> list[str]:
    args = [executable, "build"] + (["--fakeroot"] if fakeroot else [])
    return args + [str(output), str(definition(name))]


def build(name: str, output: Path, fakeroot: bool) -> int:
    argv = build_argv(name, output, fakeroot)
    if shutil.which(argv[0]) is None:
        raise ToolFailed(
            "apptainer is not on PATH: build images on a machine that has Apptainer (often a cluster's "
            "login or build node, e.g. after `module load apptainer`); see containers/README.md"
        )
    source = CONTAINERS.parent  # a checkout's root, where gateway.def's %files are
    if Path(argv[-1]) == CONTAINERS / "gateway.def" and not (source / "pyproject.toml").is_file():
        raise ToolFailed("the gateway image copies polar-hpc's source in: build it from a checkout of the "
                         "repository (the harness images build from an installed package too)")
    output.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(argv, cwd=source).returncode
