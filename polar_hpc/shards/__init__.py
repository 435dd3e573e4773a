"""Trajectory shards on the shared filesystem: `ShardWriter` appends, the reader functions read.

Format: docs/shards.md (polar_hpc.shards.format). Trainers need only `iter_trajectories(run_dir)`.
"""

from __future__ import annotations

from polar_hpc.shards.reader import iter_trajectories, rows, shard_files, summarize, verify
from polar_hpc.shards.writer import ShardWriter

__all__ = ["ShardWriter", "iter_trajectories", "rows", "shard_files", "summarize", "verify"]
