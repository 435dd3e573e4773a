"""One writer's append-only shards: `ShardWriter(shards_dir, writer_id, max_bytes, max_age_s)`.

Records go to a hidden temp file `.<name>.tmp` in `shards_dir`, each handed to the OS whole as it is
appended, with `os.writev` of its buffers (a failed append is cut back off). A shard is sealed when
it reaches `max_bytes` (checked on append) or `max_age_s` after it was opened (checked on append and
by `maybe_roll()`, which the owner should call periodically), and by `close()`. Sealing happens on a
background thread, in order, so the caller (the gateway's event loop) never waits for a sync:
fsync the temp file, rename it to `<name>` = `<writer_id>-<seq:06d>.shard`, fsync the directory,
then append the shard to the writer's index (polar_hpc.shards.index). Readers, which skip hidden
files, only ever see whole shards. Every `sync_bytes` appended, the open shard is also fdatasynced
in the background, so sealing a large shard has little left to flush. `wait()` blocks until every
shard handed over is sealed; a background failure is raised by the next `append`, `wait` or `close`.

A writer picks up after the highest seq already used by its `writer_id`; temp shards a killed
writer of the same id left behind are first cut back to their last intact record and sealed (or
removed when they hold no trajectory), and sealed shards missing from the index (killed between
rename and index append) are indexed. At most one live writer per `writer_id`; not thread-safe.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from polar_hpc.shards import index
from polar_hpc.shards.format import (
    FRAME,
    MAGIC,
    Buffer,
    FormatError,
    encode_header,
    encode_record,
    frame,
    read_frames,
)
from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)


def shard_name(writer_id: str, seq: int) -> str:
    return f"{writer_id}-{seq:06d}.shard"


class ShardWriter:
    def __init__(
        self, shards_dir: Path, writer_id: str, max_bytes: int, max_age_s: float, sync_bytes: int = 8 << 20
    ) -> None:
        if not writer_id or writer_id.startswith(".") or "/" in writer_id:
            raise ValueError(f"bad writer id {writer_id!r}: must be non-empty, without '/', not hidden")
        self.dir = Path(shards_dir)
        self.writer_id = writer_id
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.sync_bytes = sync_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        self._index = index.index_path(self.dir, writer_id)
        self._file: BinaryIO | None = None
        self._name = ""
        self._count = 0
        self._opened = 0.0
        self._synced = 0
        self._seq = self._recover() + 1
        self._sealer = _Sealer(f"shard-sealer-{writer_id}")

    # --- public ---------------------------------------------------------------------------------

    def append(self, traj: Trajectory) -> str:
        """Write one trajectory; returns the name of the shard it will be sealed in."""
        self._sealer.check()
        record = encode_record(traj)  # fails before touching the file
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
        end = self._file.tell()
        if end >= self.max_bytes:
            self.seal()
        elif end - self._synced >= self.sync_bytes:
            self._synced = end
            self._sealer.put(functools.partial(os.fdatasync, self._file.fileno()))
        return name

    def maybe_roll(self) -> None:
        """Seal the open shard if it is past the size or age threshold."""
        if self._file is None:
            return
        if self._file.tell() >= self.max_bytes or time.monotonic() - self._opened >= self.max_age_s:
            self.seal()

    def seal(self) -> str | None:
        """Hand the open shard to the sealer and return its final name (visible once sealed: see
        `wait`); a shard with no trajectory (its only append failed) is removed instead, and None
        returned."""
        if self._file is None:
            return None
        f, name, count = self._file, self._name, self._count
        self._file = None
        if not count:
            f.close()
            (self.dir / _temp_name(name)).unlink()
            return None
        self._sealer.put(lambda: _seal(self.dir, f, name, count, self._index))
        return name

    def wait(self) -> None:
        """Block until every shard handed over so far is sealed and indexed."""
        self._sealer.wait()

    def close(self) -> None:
        """Seal the open shard, if any (removing it if it holds no trajectory), and wait for it."""
        self.seal()
        self._sealer.wait()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------

    def _open(self) -> None:
        self._name = shard_name(self.writer_id, self._seq)
        self._file = open(self.dir / _temp_name(self._name), "xb", buffering=0)
        _write_all(self._file, (MAGIC, *frame(encode_header(self.writer_id, self._seq, time.time()))))
        self._opened = time.monotonic()
        self._count = 0
        self._synced = 0
        self._seq += 1

    def _recover(self) -> int:
        """Seal or remove this writer's leftover temp shards, index sealed shards the index lacks;
        the highest seq in use (0 if none)."""
        pattern = re.compile(rf"(\.)?{re.escape(self.writer_id)}-(\d{{6,}})\.shard(\.tmp)?")
        highest = 0
        sealed: dict[int, str] = {}
        for entry in sorted(os.listdir(self.dir)):  # listed first: salvaging renames
            m = pattern.fullmatch(entry)
            if not m or bool(m[1]) != bool(m[3]):
                continue
            seq, name = int(m[2]), entry[1 : -len(".tmp")] if m[1] else entry
            highest = max(highest, seq)
            if not m[1] or _salvage(self.dir, name):
                sealed[seq] = name
        index.cut_torn_tail(self._index)
        indexed = {entry["seq"] for _, entry in index.read_entries(self._index)}
        for seq in sorted(set(sealed) - indexed):
            _index_shard(self.dir, sealed[seq], seq, self._index)
        return highest


class _Sealer:
    """A thread that runs a writer's fsync/seal jobs in the order they were put."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def put(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def wait(self) -> None:
        self._jobs.join()
        self.check()

    def check(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException as e:  # raised by the writer's next call
                log.error("shard sealing failed: %s", e)
                self._error = e
            finally:
                self._jobs.task_done()


def _seal(directory: Path, f: BinaryIO, name: str, count: int, index_file: Path) -> None:
    os.fsync(f.fileno())
    size = f.tell()
    f.close()
    os.rename(directory / _temp_name(name), directory / name)
    _fsync_dir(directory)
    seq = int(name[: -len(".shard")].rsplit("-", 1)[1])
    index.append_entry(index_file, {"seq": seq, "shard": name, "records": count, "bytes": size, "t": time.time()})


def _index_shard(directory: Path, name: str, seq: int, index_file: Path) -> None:
    """Index a sealed shard found on disk (its records counted by reading it)."""
    records = 0
    with open(directory / name, "rb") as f:
        try:
            records = sum(1 for _ in read_frames(f)) - 1
        except FormatError as e:
            log.warning("%s: %s (indexed with the records before it)", directory / name, e)
    size = (directory / name).stat().st_size
    index.append_entry(index_file, {"seq": seq, "shard": name, "records": max(records, 0), "bytes": size, "t": time.time()})
    log.info("indexed %s, sealed but missing from %s", name, index_file)


def _write_all(f: BinaryIO, parts: Sequence[Buffer]) -> None:
    """Hand all of `parts`, in order, to the OS (unbuffered `f`'s offset moves on) with one
    `writev`, or more where the OS takes only part of them."""
    parts, fd, i = list(parts), f.fileno(), 0
    while i < len(parts):
        written = os.writev(fd, parts[i:])
        while i < len(parts) and written >= len(parts[i]):
            written -= len(parts[i])
            i += 1
        if written:
            parts[i] = memoryview(parts[i])[written:]


def _temp_name(name: str) -> str:
    return f".{name}.tmp"


def _salvage(directory: Path, name: str) -> bool:
    """Cut a dead writer's temp shard back to its intact records and seal it (True), or remove it."""
    temp = directory / _temp_name(name)
    if (directory / name).exists():
        log.warning("%s: a sealed shard of that name exists; removing the leftover temp file", temp)
        temp.unlink()
        return False
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
        return True
    temp.unlink()
    return False


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
