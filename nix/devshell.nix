# `nix develop`: what developing and running polar-hpc on a login node needs. Python 3.11 with
# polar-hpc's locked runtime dependencies (the same wheels as `nix build`), uv for the dev and
# test groups, the Slurm client tools, Apptainer, bubblewrap, and Node.js for node harnesses.
{ pkgs, python ? pkgs.python311 }:
let
  locked = import ./python-packages.nix { inherit pkgs python; lockFile = ../uv.lock; };
  pythonEnv = python.withPackages (_: locked.direct);
in
pkgs.mkShell {
  packages = [
    pythonEnv
    pkgs.uv
    pkgs.slurm # sbatch, squeue, scancel; they read the cluster's slurm.conf (SLURM_CONF)
    pkgs.apptainer
    pkgs.bubblewrap
    pkgs.nodejs
  ];
  # uv builds .venv on this shell's interpreter and never downloads another one.
  env = {
    UV_PYTHON = "${pythonEnv}/bin/python3";
    UV_PYTHON_DOWNLOADS = "never";
  };
}
