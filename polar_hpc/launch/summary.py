"""The end-of-run summary, read back from the shards (the truth), not from what processes said."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_hpc.shards.reader import iter_trajectories, summarize


def print_summary(run_dir: Path, wall_s: float, console: Console) -> dict:
    summary = summarize(run_dir)
    table = Table(title="polar-hpc run", show_header=False)
    by_status = summary["by_status"]
    counts = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
    table.add_row("sessions", f"{summary['trajectories']} written: {counts}" if by_status else "none written")
    reward = summary["mean_reward"]
    table.add_row("mean reward", "n/a" if reward is None else f"{reward:.3f}")
    table.add_row("tokens captured", str(summary["tokens"]))
    table.add_row("wall time", f"{wall_s:.1f} s")
    table.add_row("shards", f"{run_dir / 'shards'} ({summary['shards']} files)")
    table.add_row("logs", str(run_dir / "logs"))
    if by_status.get("error"):
        table.add_row("first error", _first_error(run_dir))
    console.print(table)
    return summary


def _first_error(run_dir: Path) -> str:
    """The first failed session and the last line its harness wrote to stderr."""
    for t in iter_trajectories(run_dir):
        if t.status == "error":
            last = (t.metadata.get("stderr_tail") or "").strip().splitlines()[-1:]
            return f"{t.task_id}#{t.sample_index}: {t.metadata.get('error', '')}" + (f": {last[0]}" if last else "")
    return ""
