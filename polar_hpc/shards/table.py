"""What `polar-hpc shards ls|show|verify|export|follow RUN_DIR` print: rich tables, or JSON lines.

`show --json --full` writes every field of each trajectory (token ids, masks, logprobs, metadata).
Each function takes the run dir first and raises ConfigError (exit 2) when it is not a run
directory; `verify` returns the exit code (1 when it found a problem).
"""

from __future__ import annotations

import json
import sys
from array import array
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import msgspec
from rich.console import Console
from rich.table import Table

from polar_hpc.config import ConfigError
from polar_hpc.shards import index
from polar_hpc.shards.batch import Filter
from polar_hpc.shards.decisions import Decisions
from polar_hpc.shards.export import export as export_rows
from polar_hpc.shards.follow import Follower
from polar_hpc.trajectory.model import Trajectory
from polar_hpc.shards.reader import iter_trajectories, records, rows, shard_files

COLUMNS = ("task_id", "sample_index", "status", "reward", "traces", "tokens")


def _check(run_dir: Path) -> None:
    if not (run_dir / "shards").is_dir():
        raise ConfigError(f"{run_dir}: not a run directory (no shards/ folder)")


def cli_filter(status: list[str] | None, reward: str | None, weight_versions: str | None) -> Filter:
    """A Filter from `--status` values and `LO:HI` ranges (ConfigError naming the option when bad)."""
    return Filter(
        status=frozenset(status) if status else None,
        reward=_range("--reward", reward, float),
        weight_versions=_range("--weight-versions", weight_versions, int),
    )


def _range(option: str, text: str | None, kind: type) -> tuple | None:
    if text is None:
        return None
    low, sep, high = text.partition(":")
    try:
        if not sep:
            raise ValueError("no ':'")
        return (kind(low) if low else None, kind(high) if high else None)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected LO:HI ({kind.__name__}s, either end may be empty)") from None


def show(run_dir: Path, json_lines: bool, full: bool = False) -> None:
    """A table, or one JSON object per trajectory: the listing's columns, or with `full` every
    field of the trajectory and its traces (token ids, loss masks, logprobs as lists)."""
    _check(run_dir)
    if full and not json_lines:
        raise ConfigError("--full needs --json (a table cannot hold token ids)")
    if full:
        for traj in iter_trajectories(run_dir):
            sys.stdout.write(json.dumps(msgspec.to_builtins(traj, enc_hook=_packed)) + "\n")
        return
    if json_lines:
        for row in rows(run_dir):
            sys.stdout.write(json.dumps({k: row[k] for k in COLUMNS}) + "\n")
        return
    table = Table(*COLUMNS)
    for row in rows(run_dir):
        table.add_row(*("" if row[k] is None else str(row[k]) for k in COLUMNS))
    Console().print(table)


def _packed(value: Any) -> Any:
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def ls(run_dir: Path, json_lines: bool) -> None:
    """One row per sealed shard: its writer's index entry, or `indexed: false`."""
    _check(run_dir)
    shards = run_dir / "shards"
    entries = {e["shard"]: e for w in index.writer_ids(shards) for _, e in index.read_entries(index.index_path(shards, w))}
    listing: list[dict[str, Any]] = []
    for path in shard_files(run_dir):
        e = entries.get(path.name)
        listing.append({
            "shard": path.name,
            "records": None if e is None else e["records"],
            "bytes": path.stat().st_size,
            "sealed": None if e is None else datetime.fromtimestamp(e["t"], timezone.utc).isoformat(timespec="seconds"),
            "indexed": e is not None,
        })
    if json_lines:
        for row in listing:
            sys.stdout.write(json.dumps(row) + "\n")
        return
    table = Table("shard", "records", "MB", "sealed (UTC)", "indexed", title=f"{shards}")
    for row in listing:
        table.add_row(row["shard"], "?" if row["records"] is None else str(row["records"]),
                      f"{row['bytes'] / 1e6:.2f}", row["sealed"] or "", "yes" if row["indexed"] else "no")
    Console().print(table)


def verify_run(run_dir: Path) -> int:
    """Print every damaged shard, index problem and ignored journal line, every accepted result
    whose record is not in the shard it names, and every record of a key never queued; 0 if none."""
    _check(run_dir)
    problems: list[str] = []
    where: dict[str, set[str]] = {}  # session -> the sealed shards holding a copy
    found = []  # (shard, offset, key, session) of each record
    for shard, offset, traj in records(run_dir, problems):
        where.setdefault(traj.session_id, set()).add(shard.name)
        found.append((shard, offset, (traj.task_id, traj.sample_index), traj.session_id))
    decisions = Decisions(run_dir)
    decisions.update()  # after the shards: every key a record was read of was queued before
    problems += decisions.problems
    for (task, sample), (session, named) in sorted(decisions.accepted.items()):
        copies = where.get(session, set())
        if named and named not in copies:
            what = (f"in no sealed shard (expected in {named}; still open if its writer is running)" if not copies else
                    f"not in {named}, the shard its result names (the copy in {', '.join(sorted(copies))} does not count)")
            problems.append(f"task {task!r} sample {sample}: session {session}, accepted by the journal, is {what}")
    if decisions.exists():
        problems += [f"{shard}: byte offset {offset}: session {session} is of task {key[0]!r} sample {key[1]}, "
                     "which the journal never queued" for shard, offset, key, session in found
                     if key not in decisions.queued]
    for line in problems:
        print(line)
    print(f"{'FAILED' if problems else 'ok'}: {len(shard_files(run_dir))} shards, {len(found)} records, "
          f"{len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


def export(run_dir: Path, out: Path, fmt: str, keep: Filter) -> None:
    _check(run_dir)
    n = export_rows(run_dir, out, fmt, keep)
    print(f"wrote {n} traces to {out}", file=sys.stderr)


def follow(run_dir: Path, cursor: Path | None, keep: Filter, json_lines: bool, idle_timeout_s: float | None) -> int:
    """Print each accepted trajectory as it is sealed, until the run is complete; the exit code
    (130 when interrupted: rerun with the same cursor to continue)."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory")
    console = Console(stderr=True)
    follower = Follower(run_dir, cursor=cursor, filter=keep, idle_timeout_s=idle_timeout_s)
    code, end = 0, ""
    try:
        for item in follower:
            traj = cast(Trajectory, item)  # no group_by: one trajectory at a time
            row = {"task_id": traj.task_id, "sample_index": traj.sample_index, "status": traj.status,
                   "reward": traj.reward, "traces": len(traj.traces), "tokens": traj.n_tokens}
            text = json.dumps(row) if json_lines else " ".join(f"{k}={'' if v is None else v}" for k, v in row.items())
            print(text, flush=True)
        end = "run complete" if follower.complete() else "stopped (idle)"
    except KeyboardInterrupt:
        code, end = 130, "interrupted"
    s = follower.stats
    console.print(f"{end}: {s['handed_out']} trajectories, {s['strays']} strays skipped, "
                  f"{s['filtered']} filtered out, {s['problems']} problems (warned about above)", highlight=False)
    return code
