"""One writer's append-only shards: `ShardWriter(shards_dir, writer_id, max_bytes, max_age_s)`.

Records go to a hidden temp file `.<name>.tmp` in `shards_dir`, each handed to the OS whole as it
is appended (a failed append is cut back off); sealing fsyncs it, renames it to `<name>` =
`<writer_id>-<seq:06d>.shard` and fsyncs the directory, so readers (which skip hidden files) only
ever see whole shards. A shard is sealed when
it reaches `max_bytes` (checked on append) or `max_age_s` after it was opened (checked on append
and by `maybe_roll()`, which the owner should call periodically), and by `close()`.

A writer picks up after the highest seq already used by its `writer_id`; temp shards a killed
writer of the same id left behind are first cut back to their last intact record and sealed (or
removed when they hold no trajectory). At most one live writer per `writer_id`; not thread-safe.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import BinaryIO

from polar_hpc.shards.format import (
    FRAME,
    MAGIC,
    FormatError,
    encode_header,
    encode_trajectory,
    frame,
    read_frames,
)
from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)


def shard_name(writer_id: str, seq: int) -> str:
    return f"{writer_id}-{seq:06d}.shard"


class ShardWriter:
    def __init__(self, shards_dir: Path, writer_id: str, max_bytes: int, max_age_s: float) -> None:
        if not writer_id or writer_id.startswith(".") or "/" in writer_id:
            raise ValueError(f"bad writer id {writer_id!r}: must be non-empty, without '/', not hidden")
        self.dir = Path(shards_dir)
        self.writer_id = writer_id
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO | None = None
        self._name = ""
        self._count = 0
        self._opened = 0.0
        self._seq = self._recover() + 1

    # --- public ---------------------------------------------------------------------------------

    def append(self, traj: Trajectory) -> str:
        """Write one trajectory; returns the name of the shard it will be sealed in."""
        record = frame(encode_trajectory(traj))  # fails before touching the file
        self.maybe_roll()
        if self._file is None:
            self._open()
        assert self._file is not None
        name = self._name
        good = self._file.tell()
        try:
            _write_all(self._file, record)
        except BaseException:  # leave no torn record behind
            self._file.truncate(good)
            self._file.seek(good)
            raise
        self._count += 1
        if self._file.tell() >= self.max_bytes:
            self.seal()
        return name

    def maybe_roll(self) -> None:
        """Seal the open shard if it is past the size or age threshold."""
        if self._file is None:
            return
        if self._file.tell() >= self.max_bytes or time.monotonic() - self._opened >= self.max_age_s:
            self.seal()

    def seal(self) -> str | None:
        """Make the open shard visible under its final name and return that name; a shard with no
        trajectory (its only append failed) is removed instead, and None returned."""
        if self._file is None:
            return None
        f, name, count = self._file, self._name, self._count
        self._file = None
        temp = self.dir / _temp_name(name)
        if not count:
            f.close()
            temp.unlink()
            return None
        os.fsync(f.fileno())
        f.close()
        os.rename(temp, self.dir / name)
        _fsync_dir(self.dir)
        return name

    def close(self) -> None:
        """Seal the open shard, if any (removing it if it holds no trajectory)."""
        self.seal()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------

    def _open(self) -> None:
        self._name = shard_name(self.writer_id, self._seq)
        self._file = open(self.dir / _temp_name(self._name), "xb", buffering=0)
        _write_all(self._file, MAGIC + frame(encode_header(self.writer_id, self._seq, time.time())))
        self._opened = time.monotonic()
        self._count = 0
        self._seq += 1

    def _recover(self) -> int:
        """Seal or remove this writer's leftover temp shards; the highest seq in use (0 if none)."""
        pattern = re.compile(rf"(\.)?{re.escape(self.writer_id)}-(\d{{6,}})\.shard(\.tmp)?")
        highest = 0
        for entry in sorted(os.listdir(self.dir)):  # listed first: salvaging renames
            m = pattern.fullmatch(entry)
            if not m or bool(m[1]) != bool(m[3]):
                continue
            highest = max(highest, int(m[2]))
            if m[1]:
                _salvage(self.dir, entry[1 : -len(".tmp")])
        return highest


def _write_all(f: BinaryIO, data: bytes) -> None:
    """Hand all of `data` to the OS (an unbuffered write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


def _temp_name(name: str) -> str:
    return f".{name}.tmp"


def _salvage(directory: Path, name: str) -> None:
    """Cut a dead writer's temp shard back to its intact records and seal it, or remove it."""
    temp = directory / _temp_name(name)
    if (directory / name).exists():
        log.warning("%s: a sealed shard of that name exists; removing the leftover temp file", temp)
        temp.unlink()
        return
    records, end = 0, 0
    with open(temp, "r+b") as f:
        try:
            for offset, payload in read_frames(f):
                records += 1
                end = offset + FRAME.size + len(payload)
        except FormatError as e:
            dropped = os.fstat(f.fileno()).st_size - e.offset
            log.warning("%s: %s; dropping the %d bytes after it", temp, e, dropped)
        if records > 1:  # the header and at least one trajectory
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    if records > 1:
        os.rename(temp, directory / name)
        _fsync_dir(directory)
        log.info("sealed %s, left unsealed by a previous writer, with %d trajectories", name, records - 1)
    else:
        temp.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
