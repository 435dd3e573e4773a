"""Slurm durations as squeue prints a job's time limit, in seconds (walltime admission)."""

from __future__ import annotations

from polar_hpc.launch.driver import slurm_seconds


def test_slurm_durations() -> None:
    assert [slurm_seconds(t) for t in ("10", "10:00", "4:00:00", "1-00:00:00", "1-2", "2-03:04")] == [
        600, 600, 14400, 86400, 93600, 183840]
    assert slurm_seconds("UNLIMITED") is None and slurm_seconds("") is None and slurm_seconds("1:2:3:4") is None
