"""Read sealed shards once: trajectories, integrity checks, and the run summary.

`path` arguments accept a run dir (shards in `<run>/shards/`), a shards dir, or one shard file.
Only sealed shards are read (`*.shard`, hidden temp files skipped; the folder is listed once per
call), in name order: by writer, then in the order each writer sealed them. A record that fails
its length or checksum ends its file (the rest cannot be framed): the intact records before it
are yielded, the rest of the file is skipped with a logged warning counting the bytes. A framed
record whose content is not a trajectory (a checksum does not vouch for the writer) is skipped
alone, with a warning naming it. Nothing partial is ever yielded; unknown keys are ignored.

With `unique=True` (the default) each (task_id, sample_index) is yielded once. When the run has
its journal, the journal decides (polar_hpc.shards.decisions): the accepted session's first
record in the shard its result names is yielded, every other record of a decided key is skipped,
and a key the journal has not decided yet yields its first copy, unless its session was requeued
or the journal is complete (then the key was never queued: not part of the run). Without a
journal the first copy of each key in read order wins. `unique=False` yields every intact record,
strays included. `verify` also checks the writers' indexes against the sealed shards.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from polar_hpc.shards import index
from polar_hpc.shards.decisions import UNDECIDED, STRAY, Decisions
from polar_hpc.shards.format import FRAME, FormatError, decode_header, decode_trajectory, read_frames
from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)


def shard_files(path: Path) -> list[Path]:
    """The sealed shards under `path`, in read order."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run, shards dir or shard")
    if path.is_file():
        return [path]
    folder = _shards_dir(path)
    sealed = (folder / n for n in nofollow.listdir(folder, below=0) if n.endswith(".shard") and not n.startswith("."))
    return sorted(p for p in sealed if nofollow.is_file(p))  # a link is never followed


def _shards_dir(path: Path) -> Path:
    st = nofollow.lstat(path / "shards")
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OSError(f"{path / 'shards'}: a symbolic link (not followed)")
    return path / "shards" if st is not None and stat.S_ISDIR(st.st_mode) else path


def run_root(path: Path) -> Path:
    """The run dir of a run dir, shards dir or shard file."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    return path if (path / "shards").is_dir() else path.parent


def iter_trajectories(path: Path, unique: bool = True) -> Iterator[Trajectory]:
    for _, traj in _Scan(path, unique):
        yield traj


def verify(path: Path) -> list[str]:
    """Every problem found, as `FILE: byte offset N: what (M bytes skipped)` for records and
    `FILE:LINE: what` or `FILE: what` for the indexes of a shards dir; [] when all is well."""
    problems: list[str] = []
    for _ in records(path, problems):
        pass
    return problems


def records(path: Path, problems: list[str]) -> Iterator[tuple[Path, int, Trajectory]]:
    """(shard, byte offset, trajectory) of every intact record, strays included; what `verify`
    finds goes to `problems` (the indexes' problems once the shards are read)."""
    files = shard_files(path)
    for shard in files:
        for offset, _, traj in read_shard(shard, problems):
            yield shard, offset, traj
    if not Path(path).is_file():
        problems += index.check(_shards_dir(Path(path)), files)


def rows(path: Path) -> Iterator[dict[str, Any]]:
    """One plain dict per trajectory, for listings and `--json` output."""
    for traj in iter_trajectories(path):
        yield {
            "task_id": traj.task_id,
            "sample_index": traj.sample_index,
            "status": traj.status,
            "reward": traj.reward,
            "traces": len(traj.traces),
            "tokens": traj.n_tokens,
            "session_id": traj.session_id,
        }


def summarize(path: Path) -> dict[str, Any]:
    """Counts over a run's shards: {shards, trajectories, by_status, rewarded, mean_reward (None when
    nothing was rewarded), tokens, duplicates (copies skipped), problems (as `verify` words them)}."""
    scan = _Scan(path, unique=True)
    by_status: Counter[str] = Counter()
    rewards: list[float] = []
    tokens = 0
    for _, traj in scan:
        by_status[traj.status] += 1
        tokens += traj.n_tokens
        if traj.reward is not None:
            rewards.append(traj.reward)
    return {
        "shards": len(scan.files),
        "trajectories": sum(by_status.values()),
        "by_status": dict(sorted(by_status.items())),
        "rewarded": len(rewards),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "tokens": tokens,
        "duplicates": scan.duplicates,
        "problems": scan.problems,
    }


class _Scan:
    """One pass over the shards under a path, keeping count of problems and copies skipped."""

    def __init__(self, path: Path, unique: bool) -> None:
        self.files = shard_files(path)
        self.unique = unique
        self.problems: list[str] = []
        self.duplicates = 0
        self.decisions = Decisions(run_root(path))
        self.decisions.update()
        self.finished = self.decisions.complete()
        for problem in self.decisions.problems:
            log.warning("%s", problem)

    def counts(self, traj: Trajectory, shard: Path) -> bool:
        """Whether the journal lets this record count (before the first-copy rule)."""
        verdict = self.decisions.verdict(traj, shard.name)
        if verdict == UNDECIDED:
            return not self.finished and traj.session_id not in self.decisions.dead
        return verdict != STRAY

    def __iter__(self) -> Iterator[tuple[Path, Trajectory]]:
        seen: set[tuple[str, int]] = set()
        for shard in self.files:
            found: list[str] = []
            for _, _, traj in read_shard(shard, found):
                key = (traj.task_id, traj.sample_index)
                if self.unique and (key in seen or not self.counts(traj, shard)):
                    self.duplicates += 1
                    log.info("%s: skipping session %s, not the one that counts for task %r sample %d",
                             shard, traj.session_id, *key)
                    continue
                seen.add(key)
                yield shard, traj
            for problem in found:
                log.warning("%s", problem)
            self.problems += found


def read_shard(shard: Path, problems: list[str], start: int = 0) -> Iterator[tuple[int, int, Trajectory]]:
    """(offset, end offset, trajectory) of each intact trajectory record of one shard, from the
    record at `start` (0: the beginning). A record that does not decode is skipped alone; one that
    cannot be framed, or a bad header, ends the file. Each goes to `problems`."""
    try:
        with nofollow.fopen(shard, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = start
            try:
                header_seen = start > 0
                for offset, payload in read_frames(f, start):
                    end = offset + FRAME.size + len(payload)
                    if not header_seen:
                        decode_header(payload)
                        header_seen = True
                        continue
                    try:
                        traj = decode_trajectory(payload)
                    except FormatError as e:
                        problems.append(f"{shard}: byte offset {offset}: {e.reason} ({end - offset} bytes skipped)")
                        continue
                    yield offset, end, traj
                if not header_seen:
                    raise FormatError(size, "no header record")
            except FormatError as e:
                at = e.offset if e.offset >= 0 else offset
                problems.append(f"{shard}: byte offset {at}: {e.reason} ({size - at} bytes skipped)")
    except OSError as e:
        problems.append(f"{shard}: cannot read: {e.strerror}")
