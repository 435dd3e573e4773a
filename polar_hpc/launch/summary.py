"""The end-of-run summary, read back from the shards (the truth), not from what processes said."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_hpc.shards.reader import summarize


def print_summary(run_dir: Path, wall_s: float, console: Console) -> dict:
    summary = summarize(run_dir)
    table = Table(title="polar-hpc run", show_header=False)
    by_status = summary["by_status"]
    table.add_row("sessions", f"{summary['trajectories']} written: " + ", ".join(
        f"{n} {status}" for status, n in sorted(by_status.items())) if by_status else "none written")
    reward = summary["mean_reward"]
    table.add_row("mean reward", "n/a" if reward is None else f"{reward:.3f}")
    table.add_row("tokens captured", str(summary["tokens"]))
    table.add_row("wall time", f"{wall_s:.1f} s")
    table.add_row("shards", f"{run_dir / 'shards'} ({summary['shards']} files)")
    table.add_row("logs", str(run_dir / "logs"))
    console.print(table)
    return summary
