"""The orchestrator's journal as shard readers see it: which session counts for each key.

`Decisions(run_dir)` reads `<run>/journal/orchestrator.jsonl` incrementally (`update()` reads the
whole lines appended since the last call) and keeps, per (task_id, sample_index) key:
- `queued` events: the keys of the run, hence each task's number of samples;
- `result` events (at most one per key): the accepted session and the shard it was appended to;
- `requeued` events: the session they replace (`previous`) can never be accepted.

`verdict(traj)` is `ACCEPT` (the record of the accepted session), `STRAY` (another session of an
accepted key, or a requeued session) or `UNDECIDED` (the journal has not decided yet).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from polar_hpc.trajectory.model import Trajectory

log = logging.getLogger(__name__)

ACCEPT, STRAY, UNDECIDED = "accept", "stray", "undecided"
Key = tuple[str, int]


def journal_path(run_dir: Path) -> Path:
    return Path(run_dir) / "journal" / "orchestrator.jsonl"


class Decisions:
    def __init__(self, run_dir: Path) -> None:
        self.path = journal_path(run_dir)
        self.offset = 0
        self.head = ""  # the journal's first line: tells runs apart
        self.queued: set[Key] = set()
        self.samples: Counter[str] = Counter()
        self.accepted: dict[Key, tuple[str, str]] = {}  # key -> (session, shard)
        self.dead: set[str] = set()

    def exists(self) -> bool:
        return self.path.is_file()

    def update(self) -> bool:
        """Read what was appended since the last call; True when a line was read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return False
        end = data.rfind(b"\n") + 1  # a last line without newline is still being written
        for line in data[:end].split(b"\n")[:-1]:
            if not self.offset:
                self.head = line.decode(errors="replace")
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                log.warning("%s: skipping a bad line at byte %d: %s", self.path, self.offset, e)
            self.offset += len(line) + 1
        return end > 0

    def verdict(self, traj: Trajectory) -> str:
        found = self.accepted.get((traj.task_id, traj.sample_index))
        if found is not None:
            return ACCEPT if found[0] == traj.session_id else STRAY
        return STRAY if traj.session_id in self.dead else UNDECIDED

    def complete(self) -> bool:
        """Every queued key has its result."""
        return bool(self.queued) and self.queued.issubset(self.accepted)

    def _apply(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "queued":
            key = (event["task"], int(event["sample"]))
            if key not in self.queued:
                self.queued.add(key)
                self.samples[key[0]] += 1
        elif kind == "result":
            self.accepted.setdefault((event["task"], int(event["sample"])), (event["session"], event["shard"]))
        elif kind == "requeued":
            self.dead.add(event["previous"])
