"""Launchers: `polar-hpc run` on this machine (local); Slurm comes next."""
