"""Trajectory shards on the shared filesystem: `ShardWriter` appends, readers read.

Format and exactly-once protocol: docs/shards.md. One-shot reading: `iter_trajectories(run_dir)`;
following a running job with a durable cursor: `Follower(run_dir, cursor=PATH)`; trainer helpers:
`Filter`, `group_by_task`, `group_advantages`, `pad_batch`, `to_torch`; off-policy correction (importance weights
between the sampler's and the trainer's logprobs): `log_ratio`, `importance_ratio`, `tis_weights`, `icepop_weights`,
`sequence_ratio`, `sequence_tis_weights`, `sequence_mask`, `correction_summary`; export: `export_parquet`, `export_jsonl`.
"""

from __future__ import annotations

from polar_hpc.shards.batch import Filter, group_advantages, group_by_task, pad_batch, to_torch
from polar_hpc.shards.correction import (
    correction_summary, icepop_weights, importance_ratio, log_ratio, sequence_mask, sequence_ratio, sequence_tis_weights,
    tis_weights,
)
from polar_hpc.shards.follow import Follower
from polar_hpc.shards.reader import iter_trajectories, rows, shard_files, summarize, verify
from polar_hpc.shards.writer import ShardWriter

__all__ = [
    "Filter", "Follower", "ShardWriter", "correction_summary", "group_advantages", "group_by_task", "icepop_weights",
    "importance_ratio", "iter_trajectories", "log_ratio", "pad_batch", "rows", "sequence_mask", "sequence_ratio",
    "sequence_tis_weights", "shard_files", "summarize", "tis_weights", "to_torch", "verify",
]
