"""Files polar-hpc ships beside its code: the sbatch template (`slurm/`) and the Apptainer
definitions (`containers/`).

`folder(name)` is `polar_hpc/_assets/<name>/` where a wheel or the Nix package put them
(pyproject's hatch force-include), else the repository's top-level `<name>/` (a checkout or an
editable install), which stays the one place they are edited.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def folder(name: str) -> Path:
    packaged = _PACKAGE / "_assets" / name
    return packaged if packaged.is_dir() else _PACKAGE.parent / name
