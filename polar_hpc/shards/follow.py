"""Follow a run's shards as they are sealed: each accepted trajectory once, across restarts.

`Follower(run_dir, cursor=PATH, ...)` is an iterator of trajectories (of per-task groups with
`group_by_task=True`: a task's group once all its samples were read, or, for a task with
`accept`, once its decided group was: never a sample of its cancelled tail). Each poll it reads
the journal's new lines (polar_hpc.shards.decisions), lists `<shards>/index/` (one small file per
writer) and reads each index's new entries, then the new records of the shards they name, in each
writer's seal order. Each record is
- accepted (the first copy of the session the journal's result names, in the shard it names):
  handed out, if it passes `filter`;
- a stray (any other record of a decided key, or of a decided group's tail): skipped;
- undecided (the journal is behind the shard): held, and decided again after each journal read.
A sealed shard the journal names but the writer's index lacks (lost, or a garbage line in its
place) is read all the same, once it has been seen unindexed for `index_grace_s` (a writer indexes
a shard right after sealing it), or at once when a later entry of the index shows the gap.

The cursor (JSON, replaced atomically) holds, per writer, the index offset, the last shard read to
its end and the record offset reached in the next, plus every record read but not handed out yet
(undecided, or waiting for the rest of its task's group), by shard and offset. `commit()` saves
it; with `autocommit` (the default) it is saved each time the consumer asks for the next item, so
what was handed out before is done: a restarted follower with the same cursor file neither hands
anything out again nor skips anything.

Iteration ends when the run is complete (every queued key has its result, no record of a queued
key is held, and every shard an accepted result names has been read), after `idle_timeout_s`
without anything new, or never. Records of keys the journal never queued stay undecided and do not
hold up the end. Until the journal exists (a follower may start before the job), nothing is read.
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
from polar_hpc.shards.decisions import ACCEPT, UNDECIDED, Decisions, Key
from polar_hpc.shards.reader import read_shard
from polar_hpc.shards.writer import shard_name
from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)

CURSOR_FORMAT = 1


@dataclass(eq=False)
class _Held:
    ref: dict[str, Any]  # {"shard", "offset"}
    traj: Trajectory
    dropped: bool = False  # another copy of its key was accepted

    @property
    def key(self) -> Key:
        return self.traj.task_id, self.traj.sample_index


@dataclass
class _Position:
    index: int = 0  # byte offset of the next index entry to read
    seq: int = 0  # the last shard read to its end
    shard: str = ""  # the shard being read: the writer's first sealed one after `seq` ("": none)
    offset: int = 0  # byte offset of the next record in `shard` (0: not started)


@dataclass
class Follower:
    run_dir: Path
    cursor: Path | None = None
    filter: Filter = field(default_factory=Filter)
    group_by_task: bool = False
    poll_s: float = 1.0
    idle_timeout_s: float | None = None
    autocommit: bool = True
    index_grace_s: float = 2.0

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.shards = self.run_dir / "shards"
        self.decisions = Decisions(self.run_dir)
        self.writers: dict[str, _Position] = {}
        self.undecided: list[_Held] = []
        self.groups: dict[str, list[_Held]] = {}
        self.decided: dict[str, int] = {}  # per task with an open group: samples decided so far
        self.accepted: set[Key] = set()  # keys whose accepted record was read (handed out, filtered or grouped)
        self.unindexed: dict[str, float] = {}  # sealed shard the journal names -> when first seen unindexed
        self.stats = {"handed_out": 0, "strays": 0, "filtered": 0, "problems": 0}
        self._waiting_logged = False
        self._journal_problems = 0  # how many of the journal's problems were reported
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
        if not self.decisions.complete() or self.groups:
            return False
        if any(h.key in self.decisions.queued for h in self.undecided):
            return False
        return all(self.writers.get(w, _Position()).seq >= seq for w, seq in self.decisions.named.items())

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
        self._report(self.decisions.problems[self._journal_problems :])
        self._journal_problems = len(self.decisions.problems)
        for task in [t for t in self.groups if t in self.decisions.groups]:  # a group decided since
            yield from self._release(task)
        for held in list(self.undecided):
            if not held.dropped and self.decisions.verdict(held.traj, held.ref["shard"]) != UNDECIDED:
                self.undecided.remove(held)  # before handing it out: a commit then covers it
                yield from self._decide(held)
        for writer in sorted(set(index.writer_ids(self.shards)) | set(self.decisions.named)):
            yield from self._read_writer(writer)

    def _read_writer(self, writer: str) -> Iterator[Trajectory | list[Trajectory]]:
        """The writer's new index entries, then the shards the journal names that its index lacks."""
        pos = self.writers.setdefault(writer, _Position())
        problems: list[str] = []
        entries = index.read_entries(index.index_path(self.shards, writer), pos.index, problems)
        self._report(problems)
        for next_index, entry in entries:
            if entry["seq"] > pos.seq:  # else a repeated entry
                yield from self._unindexed(writer, entry["seq"] - 1, wait=False)
                yield from self._read_shard(writer, entry["seq"], entry["shard"])
            pos.index = next_index
        yield from self._unindexed(writer, self.decisions.named.get(writer, 0), wait=True)

    def _unindexed(self, writer: str, upto: int, wait: bool) -> Iterator[Trajectory | list[Trajectory]]:
        """Read the writer's sealed shards after the last one read, up to seq `upto`; with `wait`,
        only once each has been seen unindexed for `index_grace_s`."""
        for seq in range(self.writers[writer].seq + 1, upto + 1):
            name = shard_name(writer, seq)
            if not (self.shards / name).is_file():
                continue  # not sealed yet, or a seq its writer never sealed
            if wait and time.monotonic() - self.unindexed.setdefault(name, time.monotonic()) < self.index_grace_s:
                return
            self._report([f"{self.shards / name}: sealed but not in {index.index_path(self.shards, writer)}: "
                          "read all the same"])
            yield from self._read_shard(writer, seq, name)

    def _read_shard(self, writer: str, seq: int, name: str) -> Iterator[Trajectory | list[Trajectory]]:
        pos = self.writers[writer]
        start = pos.offset if pos.shard in (name, "") else 0
        pos.shard = name
        problems: list[str] = []
        for offset, end, traj in read_shard(self.shards / name, problems, start):
            pos.offset = end
            held = _Held({"shard": name, "offset": offset}, traj)
            if self.decisions.verdict(traj, name) == UNDECIDED:
                self.undecided.append(held)
            else:
                yield from self._decide(held)
        self._report(problems)
        pos.seq, pos.shard, pos.offset = seq, "", 0
        self.unindexed.pop(name, None)

    def _decide(self, held: _Held) -> Iterator[Trajectory | list[Trajectory]]:
        """Hand out a decided record if it is the accepted copy, else count it as a stray."""
        if self.decisions.verdict(held.traj, held.ref["shard"]) != ACCEPT or held.key in self.accepted:
            self.stats["strays"] += 1
            return
        self.accepted.add(held.key)
        for other in self.undecided:  # other held copies of the key: never handed out after this one
            if other.key == held.key:
                other.dropped = True
                self.stats["strays"] += 1
        self.undecided = [h for h in self.undecided if not h.dropped]
        yield from self._accepted(held)

    def _report(self, problems: list[str]) -> None:
        for problem in problems:
            log.warning("%s", problem)
        self.stats["problems"] += len(problems)

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
        yield from self._release(task)

    def _release(self, task: str) -> Iterator[list[Trajectory]]:
        """Hand out the task's group once all of it was read (its decided group, when it has one)."""
        if self.decided[task] >= self.decisions.group_size(task):
            group = self.groups.pop(task)
            del self.decided[task]
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
        held = set(undecided)
        for pos in self.writers.values():  # the keys accepted from the part of a shard read before
            if pos.shard and pos.offset:
                for offset, _, traj in read_shard(self.shards / pos.shard, [], 0):
                    if offset >= pos.offset:
                        break
                    if (pos.shard, offset) not in held and self.decisions.verdict(traj, pos.shard) == ACCEPT:
                        self.accepted.add((traj.task_id, traj.sample_index))
        self._committed = json.dumps(self.state())


def _reread(shards: Path, refs: list[tuple[str, int]]) -> list[_Held]:
    """The held records at (shard, offset) `refs`, read again."""
    out = []
    for shard, offset in refs:
        problems: list[str] = []
        first = next(read_shard(shards / shard, problems, offset), None)
        if first is not None and first[0] == offset:  # not a later record, where this one no longer decodes
            out.append(_Held({"shard": shard, "offset": offset}, first[2]))
        else:
            log.warning("held record lost: %s", problems[0] if problems else f"{shard}: nothing at {offset}")
    return out
