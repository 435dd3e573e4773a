"""The Nix package is built from the files the wheel needs: every folder pyproject force-includes
into the wheel (the sbatch template, the Apptainer definitions) is in nix/polar-hpc.nix's source."""

from __future__ import annotations

import re
import tomllib

from nix.helpers import ROOT


def test_the_nix_source_holds_every_folder_the_wheel_force_includes():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert {"slurm", "containers"} <= set(included)
    nix = (ROOT / "nix" / "polar-hpc.nix").read_text()
    fileset = re.search(r"fileset = pkgs\.lib\.fileset\.unions \[(.*?)\];", nix, re.S).group(1)
    listed = set(re.findall(r'\(src \+ "/([^"]+)"\)', fileset))
    assert set(included) <= listed, f"nix/polar-hpc.nix leaves out {set(included) - listed}"
    for folder, target in included.items():  # ...and the build checks they landed in the package
        assert f"polar_hpc/_assets/{folder}/" in nix and target == f"polar_hpc/_assets/{folder}"

