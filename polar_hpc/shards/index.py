"""Per-writer shard index: `<shards>/index/<writer_id>.jsonl`, one JSON line per sealed shard.

A writer appends `{"seq", "shard", "records", "bytes", "t"}` after the shard is renamed into place
and the directory fsynced, so every entry names a file that exists; entries come in seq order.
Followers read only the new bytes of each index (the `index/` folder holds one small file per
writer) instead of listing `<shards>/`, which may hold thousands of files. A line without its
trailing newline is still being written and is not an entry yet. A whole line that is not an entry
(not JSON, `seq` not a positive int, `shard` not `<writer_id>-<seq>.shard` of this index's writer)
is skipped and named, `FILE:LINE: what`, in the caller's `problems`; `check` compares the indexes
with the sealed shards a listing found.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from polar_hpc import nofollow

INDEX_DIR = "index"


def index_path(shards_dir: Path, writer_id: str) -> Path:
    return Path(shards_dir) / INDEX_DIR / f"{writer_id}.jsonl"


def parse_name(shard: str) -> tuple[str | None, int]:
    """(writer, seq) of a shard named `<writer>-<seq>.shard`; (None, 0) for any other name."""
    stem, _, seq = shard.removesuffix(".shard").rpartition("-")
    ok = shard.endswith(".shard") and stem and "/" not in stem and not stem.startswith(".") and seq.isdigit()
    return (stem, int(seq)) if ok else (None, 0)


def writer_ids(shards_dir: Path) -> list[str]:
    """Writers that have an index, sorted (one entry per gateway: a small folder)."""
    try:
        names = nofollow.listdir(Path(shards_dir) / INDEX_DIR)  # a link there is not followed
    except OSError:
        return []
    return sorted(n[: -len(".jsonl")] for n in names if n.endswith(".jsonl"))


def append_entry(path: Path, entry: dict[str, Any]) -> None:
    """Append one entry with a single write and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = nofollow.open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644, below=2)
    try:
        os.write(fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_entries(path: Path, offset: int = 0, problems: list[str] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(offset just past the line, entry) for each whole line from byte `offset` on that is an
    entry; each other whole line is skipped and named in `problems`."""
    try:
        with nofollow.fopen(path, "rb", below=2) as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    except OSError as e:  # a link, a FIFO: not followed, not read
        if problems is not None:
            problems.append(f"{path}: not read: {e.strerror}")
        return []
    writer = Path(path).name.removesuffix(".jsonl")
    out = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        why = _not_an_entry(line, writer)
        if why is None:
            out.append((offset + len(line), json.loads(line)))
        elif problems is not None:
            problems.append(f"{path}:{_line_number(path, offset)}: not an index entry ({why}): skipped")
        offset += len(line)
    return out


def check(shards_dir: Path, sealed: list[Path]) -> list[str]:
    """What the indexes get wrong about the `sealed` shards of `shards_dir`: lines that are not
    entries, entries naming no sealed shard, sealed shards no index lists."""
    problems: list[str] = []
    listed = set()
    for writer in writer_ids(shards_dir):
        path = index_path(shards_dir, writer)
        for _, entry in read_entries(path, 0, problems):
            listed.add(entry["shard"])
            if not nofollow.is_file(Path(shards_dir) / entry["shard"]):
                problems.append(f"{path}: the entry for {entry['shard']} names no sealed shard")
    for shard in sealed:
        if shard.name not in listed:
            owner = parse_name(shard.name)[0]
            problems.append(f"{shard}: sealed but not in {index_path(shards_dir, owner)} (a follower reads it only "
                            "once the journal names it)" if owner else
                            f"{shard}: not named <writer>-<seq>.shard: in no index, and no follower reads it")
    return problems


def cut_torn_tail(path: Path) -> None:
    """Drop a last line a killed writer left without its newline."""
    try:
        data = nofollow.read_bytes(path, below=2)
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        with nofollow.fopen(path, "r+b", below=2) as f:
            f.truncate(data.rfind(b"\n") + 1)


def _not_an_entry(line: bytes, writer: str) -> str | None:
    """Why `line` is not an entry of `writer`'s index; None when it is one."""
    try:
        entry = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(entry, dict):
        return "not a JSON object"
    seq, shard = entry.get("seq"), entry.get("shard")
    if type(seq) is not int or seq < 1:
        return f"seq {seq!r} is not a positive integer"
    if not isinstance(shard, str) or parse_name(shard) != (writer, seq):
        return f"shard {shard!r} is not {writer}-<seq {seq}>.shard"
    return None


def _line_number(path: Path, offset: int) -> int:
    """The 1-based number of the line that starts at byte `offset` of `path`."""
    with nofollow.fopen(path, "rb", below=2) as f:
        return f.read(offset).count(b"\n") + 1
