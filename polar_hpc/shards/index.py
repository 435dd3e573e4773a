"""Per-writer shard index: `<shards>/index/<writer_id>.jsonl`, one JSON line per sealed shard.

A writer appends `{"seq", "shard", "records", "bytes", "t"}` after the shard is renamed into place
and the directory fsynced, so every entry names a file that exists; entries come in seq order.
Followers read only the new bytes of each index (the `index/` folder holds one small file per
writer) instead of listing `<shards>/`, which may hold thousands of files. A line without its
trailing newline is still being written and is not an entry yet.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

INDEX_DIR = "index"


def index_path(shards_dir: Path, writer_id: str) -> Path:
    return Path(shards_dir) / INDEX_DIR / f"{writer_id}.jsonl"


def writer_ids(shards_dir: Path) -> list[str]:
    """Writers that have an index, sorted (one entry per gateway: a small folder)."""
    folder = Path(shards_dir) / INDEX_DIR
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".jsonl")] for p in folder.iterdir() if p.name.endswith(".jsonl"))


def append_entry(path: Path, entry: dict[str, Any]) -> None:
    """Append one entry with a single write and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_entries(path: Path, offset: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """(offset just past the line, entry) for each whole line from byte `offset` on."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        offset += len(line)
        out.append((offset, json.loads(line)))
    return out


def cut_torn_tail(path: Path) -> None:
    """Drop a last line a killed writer left without its newline."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
