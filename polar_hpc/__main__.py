"""`python -m polar_hpc` is the `polar-hpc` command (used to start child processes)."""

from polar_hpc.cli import app

app()
