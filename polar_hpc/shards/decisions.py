"""The orchestrator's journal as shard readers see it: which record counts for each key.

`Decisions(run_dir)` reads `<run>/journal/orchestrator.jsonl` incrementally (`update()` reads the
whole lines appended since the last call; a last line without its newline is still being written)
and keeps, per (task_id, sample_index) key:
- `queued` events: the keys of the run, hence each task's number of samples;
- the first `result` event of a queued key: the accepted session and the shard its record is in
  (`""`: it has none). Later results of the key, and results of keys never queued, are ignored and
  named in `problems` (`FILE:LINE: what`) for the caller to report;
- `requeued` events: the session they replace (`previous`), which one-shot readers skip;
- `decided` events (a task with `accept`): the samples of the task's group (`groups`); the others
  are its tail, cancelled: their results name no shard, so no record of theirs is ever accepted,
  and a tail's record is a stray as soon as the group is decided, before its own result.
A line that is not an event (cut short by a crash, or missing a field) is skipped with a warning.

`FirstResults` is the one rule every reader of results applies (this class, the orchestrator's
journal replay and progress, the dashboard, the session table): the first result of a (task,
sample) key counts; a later one for the same key does not.

`verdict(traj, shard)` is final: `ACCEPT` for the accepted session's record in the shard its result
names, `STRAY` for any other record of a decided key or of a decided group's tail, `UNDECIDED`
while the key has no result. `group_size(task)` is how many records make the task's group: its
decided group's size, else its number of samples.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import TypeVar

from polar_hpc import nofollow
from polar_hpc.shards.index import parse_name
from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)

ACCEPT, STRAY, UNDECIDED = "accept", "stray", "undecided"
Key = tuple[str, int]
V = TypeVar("V")


class FirstResults(dict[Key, V]):
    """Key -> what its first result said; `offer` applies the rule."""

    def offer(self, key: Key, value: V) -> bool:
        """Record `value` if it is `key`'s first result; True when it counts."""
        if key in self:
            return False
        self[key] = value
        return True


def journal_path(run_dir: Path) -> Path:
    return Path(run_dir) / "journal" / "orchestrator.jsonl"


class Decisions:
    def __init__(self, run_dir: Path) -> None:
        self.path = journal_path(run_dir)
        self.offset = 0
        self.lines = 0  # whole lines read
        self.head = ""  # the journal's first line: tells runs apart
        self.queued: set[Key] = set()
        self.samples: Counter[str] = Counter()
        self.accepted: FirstResults[tuple[str, str]] = FirstResults()  # key -> (session, shard)
        self.named: dict[str, int] = {}  # writer -> highest seq of a shard an accepted result names
        self.dead: set[str] = set()
        self.groups: dict[str, frozenset[int]] = {}  # task -> the samples of its decided group
        self.problems: list[str] = []

    def exists(self) -> bool:
        return nofollow.is_file(self.path)

    def update(self) -> bool:
        """Read what was appended since the last call; True when a line was read."""
        try:
            with nofollow.fopen(self.path, "rb", below=2) as f:  # journal/ and the journal: never a link
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return False
        end = data.rfind(b"\n") + 1  # a last line without newline is still being written
        for line in data[:end].split(b"\n")[:-1]:
            self.lines += 1
            if not self.offset:
                self.head = line.decode(errors="replace")
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                log.warning("%s:%d: skipping a line that is not a journal event (%s)", self.path, self.lines, e)
            self.offset += len(line) + 1
        return end > 0

    def verdict(self, traj: Trajectory, shard: str) -> str:
        """What the journal says of `traj`'s record in the shard named `shard`."""
        return self.verdict_of((traj.task_id, traj.sample_index), traj.session_id, shard)

    def verdict_of(self, key: Key, session: str, shard: str) -> str:
        """The verdict on a record of `key` by `session` in the shard named `shard`."""
        found = self.accepted.get(key)
        if found is None:
            group = self.groups.get(key[0])
            return UNDECIDED if group is None or key[1] in group else STRAY
        return ACCEPT if found == (session, shard) else STRAY

    def group_size(self, task: str) -> int:
        group = self.groups.get(task)
        return self.samples[task] if group is None else len(group)

    def complete(self) -> bool:
        """Every queued key has its result."""
        return bool(self.queued) and len(self.accepted) == len(self.queued)

    def _apply(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "queued":
            key = (str(event["task"]), int(event["sample"]))
            if key not in self.queued:
                self.queued.add(key)
                self.samples[key[0]] += 1
        elif kind == "result":
            key, found = (str(event["task"]), int(event["sample"])), (str(event["session"]), str(event["shard"] or ""))
            where = f"{self.path}:{self.lines}: task {key[0]!r} sample {key[1]}"
            if key not in self.queued:
                self.problems.append(f"{where}: a result (session {found[0]}) for a key never queued: ignored")
            elif not self.accepted.offer(key, found):
                if self.accepted[key] != found:
                    self.problems.append(f"{where}: a second result (session {found[0]}, shard {found[1] or 'none'}) "
                                         f"ignored: the first (session {self.accepted[key][0]}) counts")
            else:
                writer, seq = parse_name(found[1])
                if writer is not None:
                    self.named[writer] = max(self.named.get(writer, 0), seq)
        elif kind == "requeued":
            self.dead.add(str(event["previous"]))
        elif kind == "decided":
            self.groups.setdefault(str(event["task"]), frozenset(int(i) for i in event["accepted"]))

