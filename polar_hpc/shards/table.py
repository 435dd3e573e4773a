"""`polar-hpc shards show`: a run's trajectories as a table, or one JSON object per line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_hpc.config import ConfigError
from polar_hpc.shards.reader import rows

COLUMNS = ("task_id", "sample_index", "status", "reward", "traces", "tokens")


def show(run_dir: Path, json_lines: bool) -> None:
    if not (run_dir / "shards").is_dir():
        raise ConfigError(f"{run_dir}: not a run directory (no shards/ folder)")
    if json_lines:
        for row in rows(run_dir):
            sys.stdout.write(json.dumps({k: row[k] for k in COLUMNS}) + "\n")
        return
    table = Table(*COLUMNS)
    for row in rows(run_dir):
        table.add_row(*("" if row[k] is None else str(row[k]) for k in COLUMNS))
    Console().print(table)
