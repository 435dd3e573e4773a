"""Trajectory shards on the shared filesystem: `ShardWriter` appends, readers read.

Format and exactly-once protocol: docs/shards.md. One-shot reading: `iter_trajectories(run_dir)`;
following a running job with a durable cursor: `Follower(run_dir, cursor=PATH)`; trainer helpers:
`Filter`, `group_by_task`, `group_advantages`, `pad_batch`, `to_torch`; export: `export_parquet`, `export_jsonl`.
"""

from __future__ import annotations

from polar_hpc.shards.batch import Filter, group_advantages, group_by_task, pad_batch, to_torch
from polar_hpc.shards.follow import Follower
from polar_hpc.shards.reader import iter_trajectories, rows, shard_files, summarize, verify
from polar_hpc.shards.writer import ShardWriter

__all__ = [
    "Filter", "Follower", "ShardWriter", "group_advantages", "group_by_task", "iter_trajectories", "pad_batch", "rows",
    "shard_files", "summarize", "to_torch", "verify",
]
