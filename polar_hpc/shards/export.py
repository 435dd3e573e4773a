"""Export a run's trajectories, one row per trace, to Parquet (pyarrow: the optional `parquet`
extra) or JSONL.

Rows come from `iter_trajectories` (the journal decides which attempt counts), optionally through a
`Filter`. Columns: `session_id`, `task_id`, `sample_index`, `attempt`, `status`, `reward`,
`trace_index`, `prompt_ids` and `response_ids` (list<int32>), `loss_mask` (list<int8>),
`logprobs` (list<float32>), `token_versions` (list<string>: the version that sampled each response
token, "" where none did; `Trace.versions()`), `finish_reason`, `weight_versions` (list<string>),
`call_indices` (list<int32>), and `messages`, `tools`, `metadata` as JSON text (their shapes vary per row).
Token columns leave the traces as numpy views of their arrays (the mask as an int8 copy).
The file is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from polar_hpc.config import ConfigError
from polar_hpc.shards.batch import Filter
from polar_hpc.shards.reader import iter_trajectories

FORMATS = ("parquet", "jsonl")


def trace_rows(run_dir: Path, filter: Filter | None = None) -> Iterator[dict[str, Any]]:
    for traj in iter_trajectories(run_dir):
        if filter is not None and not filter.passes(traj):
            continue
        for i, trace in enumerate(traj.traces):
            yield {
                "session_id": traj.session_id,
                "task_id": traj.task_id,
                "sample_index": traj.sample_index,
                "attempt": traj.attempt,
                "status": traj.status,
                "reward": traj.reward,
                "trace_index": i,
                "prompt_ids": np.frombuffer(trace.prompt_ids, dtype=np.int32),
                "response_ids": np.frombuffer(trace.response_ids, dtype=np.int32),
                "loss_mask": np.frombuffer(trace.loss_mask, dtype=np.int32).astype(np.int8),
                "logprobs": np.frombuffer(trace.logprobs, dtype=np.float32),
                "token_versions": trace.versions(),
                "finish_reason": trace.finish_reason,
                "weight_versions": trace.weight_versions,
                "call_indices": trace.call_indices,
                "messages": json.dumps(trace.messages, ensure_ascii=False),
                "tools": json.dumps(trace.tools, ensure_ascii=False),
                "metadata": json.dumps(traj.metadata, ensure_ascii=False),
            }


def export(run_dir: Path, out: Path, fmt: str, filter: Filter | None = None, rows_per_group: int = 256) -> int:
    """Write the run's traces to `out` in `fmt` (`parquet` or `jsonl`); the number of rows."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r}: expected one of {', '.join(FORMATS)}")
    out = Path(out)
    temp = out.with_name(f".{out.name}.tmp")
    rows = trace_rows(run_dir, filter)
    try:
        n = _parquet(rows, temp, rows_per_group) if fmt == "parquet" else _jsonl(rows, temp)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    os.replace(temp, out)
    return n


def _jsonl(rows: Iterator[dict[str, Any]], path: Path) -> int:
    n = 0
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=np.ndarray.tolist) + "\n")
            n += 1
    return n


def _parquet(rows: Iterator[dict[str, Any]], path: Path, rows_per_group: int) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("Parquet export needs pyarrow: pip install 'polar-hpc[parquet]' (or use --format jsonl)") from None
    schema = pa.schema([
        ("session_id", pa.string()), ("task_id", pa.string()), ("sample_index", pa.int64()),
        ("attempt", pa.int64()), ("status", pa.string()), ("reward", pa.float64()), ("trace_index", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())), ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())), ("logprobs", pa.list_(pa.float32())),
        ("token_versions", pa.list_(pa.string())), ("finish_reason", pa.string()), ("weight_versions", pa.list_(pa.string())),
        ("call_indices", pa.list_(pa.int32())),
        ("messages", pa.string()), ("tools", pa.string()), ("metadata", pa.string()),
    ])
    n, group = 0, []
    with pq.ParquetWriter(path, schema) as writer:
        for row in rows:
            group.append(row)
            if len(group) == rows_per_group:
                writer.write_table(pa.Table.from_pylist(group, schema=schema))
                n, group = n + len(group), []
        if group or not n:
            writer.write_table(pa.Table.from_pylist(group, schema=schema))
            n += len(group)
    return n
