"""Follow a run's shards as they are sealed: each accepted trajectory once, across restarts.

`Follower(run_dir, cursor=PATH, ...)` is an iterator of trajectories (of per-task groups with
`group_by_task=True`). Each poll it reads the journal's new lines (polar_hpc.shards.decisions),
lists `<shards>/index/` (one small file per writer) and reads each index's new entries, then the
new records of the shards they name, in each writer's seal order. Each record is
- accepted (its session is the journal's result for its key): handed out, if it passes `filter`;
- a stray (another session of the key, or a requeued one): skipped;
- undecided (the journal is behind the shard): held, and decided again after each journal read.

The cursor (JSON, replaced atomically) holds, per writer, the index offset and record offset
reached, plus every record read but not handed out yet (undecided, or waiting for the rest of its
task's group), by shard and offset. `commit()` saves it; with `autocommit` (the default) it is
saved each time the consumer asks for the next item, so what was handed out before is done: a
restarted follower with the same cursor file neither hands anything out again nor skips anything.

Iteration ends when the run is complete (every queued key has its result and every accepted
record's shard has been read), after `idle_timeout_s` without anything new, or never.
Until the journal exists (a follower may start before the job), nothing is read.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_hpc.config import ConfigError
from polar_hpc.shards import index
from polar_hpc.shards.batch import Filter
from polar_hpc.shards.decisions import ACCEPT, STRAY, UNDECIDED, Decisions
from polar_hpc.shards.reader import read_shard
from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)

CURSOR_FORMAT = 1


@dataclass
class _Held:
    ref: dict[str, Any]  # {"shard", "offset"}
    traj: Trajectory


@dataclass
class _Position:
    index: int = 0  # byte offset of the next index entry to read
    offset: int = 0  # byte offset of the next record in the shard of that entry (0: not started)
    seq: int = 0  # the last shard read to its end


@dataclass
class Follower:
    run_dir: Path
    cursor: Path | None = None
    filter: Filter = field(default_factory=Filter)
    group_by_task: bool = False
    poll_s: float = 1.0
    idle_timeout_s: float | None = None
    autocommit: bool = True

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.shards = self.run_dir / "shards"
        self.decisions = Decisions(self.run_dir)
        self.writers: dict[str, _Position] = {}
        self.undecided: list[_Held] = []
        self.groups: dict[str, list[_Held]] = {}
        self.decided: dict[str, int] = {}  # per task with an open group: samples decided so far
        self.stats = {"handed_out": 0, "strays": 0, "filtered": 0, "problems": 0}
        self._waiting_logged = False
        self._committed = ""
        if self.cursor is not None and Path(self.cursor).exists():
            self._load(Path(self.cursor))

    # --- public ---------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Trajectory | list[Trajectory]]:
        last_news = time.monotonic()
        while True:
            news = False
            for item in self._poll():
                news = True
                self.stats["handed_out"] += 1
                yield item
                if self.autocommit:
                    self.commit()
            if self.autocommit:
                self.commit()
            if self.complete():
                return
            now = time.monotonic()
            if news:
                last_news = now
            elif self.idle_timeout_s is not None and now - last_news >= self.idle_timeout_s:
                return
            time.sleep(self.poll_s)

    def complete(self) -> bool:
        """The journal has every key's result, and every accepted record was read and handed out."""
        if not self.decisions.complete() or self.undecided or self.groups:
            return False
        for _, shard in self.decisions.accepted.values():
            writer, seq = _parse_name(shard or "")
            if writer is not None and self.writers.get(writer, _Position()).seq < seq:
                return False
        return True

    def state(self) -> dict[str, Any]:
        """The cursor as a JSON-able dict (what `commit` writes)."""
        return {
            "format": CURSOR_FORMAT,
            "journal_head": self.decisions.head,
            "writers": {w: vars(p) for w, p in sorted(self.writers.items())},
            "undecided": [h.ref for h in self.undecided],
            "groups": {t: {"decided": self.decided[t], "held": [h.ref for h in g]} for t, g in self.groups.items()},
        }

    def commit(self) -> None:
        """Write the cursor file atomically (temp + fsync + rename); no-op without a cursor path."""
        if self.cursor is None:
            return
        text = json.dumps(self.state())
        if text == self._committed:
            return
        path = Path(self.cursor)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp")
        with open(temp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
        self._committed = text

    # --- one poll -------------------------------------------------------------------------------

    def _poll(self) -> Iterator[Trajectory | list[Trajectory]]:
        if not self.decisions.exists():
            if not self._waiting_logged:
                log.info("waiting for %s", self.decisions.path)
                self._waiting_logged = True
            return
        self.decisions.update()
        for held in list(self.undecided):
            verdict = self.decisions.verdict(held.traj)
            if verdict != UNDECIDED:
                self.undecided.remove(held)  # before handing it out: a commit then covers it
            if verdict == ACCEPT:
                yield from self._accepted(held)
            elif verdict == STRAY:
                self.stats["strays"] += 1
        for writer in index.writer_ids(self.shards):
            yield from self._read_writer(writer)

    def _read_writer(self, writer: str) -> Iterator[Trajectory | list[Trajectory]]:
        pos = self.writers.setdefault(writer, _Position())
        for next_index, entry in index.read_entries(index.index_path(self.shards, writer), pos.index):
            shard = self.shards / entry["shard"]
            problems: list[str] = []
            for offset, end, traj in read_shard(shard, problems, pos.offset):
                pos.offset = end
                held = _Held({"shard": entry["shard"], "offset": offset}, traj)
                verdict = self.decisions.verdict(traj)
                if verdict == ACCEPT:
                    yield from self._accepted(held)
                elif verdict == STRAY:
                    self.stats["strays"] += 1
                else:
                    self.undecided.append(held)
            for problem in problems:
                log.warning("%s", problem)
            self.stats["problems"] += len(problems)
            pos.index, pos.offset, pos.seq = next_index, 0, entry["seq"]

    def _accepted(self, held: _Held) -> Iterator[Trajectory | list[Trajectory]]:
        passes = self.filter.passes(held.traj)
        if not passes:
            self.stats["filtered"] += 1
        if not self.group_by_task:
            if passes:
                yield held.traj
            return
        task = held.traj.task_id
        group = self.groups.setdefault(task, [])
        if passes:
            group.append(held)
        self.decided[task] = self.decided.get(task, 0) + 1
        if self.decided[task] >= max(self.decisions.samples[task], 1):
            del self.groups[task], self.decided[task]
            if group:
                yield sorted((h.traj for h in group), key=lambda t: t.sample_index)

    # --- the cursor file ------------------------------------------------------------------------

    def _load(self, path: Path) -> None:
        try:
            state = json.loads(path.read_text())
            if state.get("format") != CURSOR_FORMAT:
                raise ValueError(f"format {state.get('format')!r}, expected {CURSOR_FORMAT}")
            self.writers = {w: _Position(**p) for w, p in state["writers"].items()}
            undecided = [(r["shard"], int(r["offset"])) for r in state["undecided"]]
            groups = {
                t: (int(g["decided"]), [(r["shard"], int(r["offset"])) for r in g["held"]])
                for t, g in state["groups"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path}: not a readable shard cursor: {e}") from None
        self.decisions.update()
        if state.get("journal_head") and state["journal_head"] != self.decisions.head:
            raise ConfigError(f"{path}: this cursor follows another run (its journal starts differently from "
                              f"{self.decisions.path}); use a new cursor file")
        self.undecided = _reread(self.shards, undecided)
        for task, (decided, refs) in groups.items():
            self.decided[task] = decided
            self.groups[task] = _reread(self.shards, refs)
        self._committed = json.dumps(self.state())


def _reread(shards: Path, refs: list[tuple[str, int]]) -> list[_Held]:
    """The held records at (shard, offset) `refs`, read again."""
    out = []
    for shard, offset in refs:
        problems: list[str] = []
        for _, _, traj in read_shard(shards / shard, problems, offset):
            out.append(_Held({"shard": shard, "offset": offset}, traj))
            break
        else:
            log.warning("held record lost: %s", problems[0] if problems else f"{shard}: nothing at {offset}")
    return out


def _parse_name(shard: str) -> tuple[str | None, int]:
    """(writer, seq) of `<writer>-<seq>.shard`; (None, 0) for anything else."""
    stem, _, seq = shard.removesuffix(".shard").rpartition("-")
    return (stem, int(seq)) if stem and seq.isdigit() else (None, 0)
