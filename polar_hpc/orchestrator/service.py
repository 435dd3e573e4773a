"""Service mode's pieces that are not scheduling: batches and the file inbox.

- `Batches`: which tasks each trainer batch holds; a task id belongs to the first batch that
  brought it, and is never queued twice (re-submitting after a trainer restart adds nothing).
  A batch's `max_staleness` marks sessions that ended more than that many policy versions after
  the one they were dispatched under (`is_stale`; journaled as `"stale": true` on the result).
- `validate(tasks)`: plain task dicts -> config.Task, or one ConfigError naming each bad task.
- `inbox_files(run_dir)` / `consume(path)`: `<run>/inbox/*.jsonl`, oldest first. A trainer writes
  a file under another name (e.g. `.name.tmp`) and renames it into place, so a listed file is
  whole. Once its tasks are queued it is moved to `inbox/done/` (rename: a file is consumed once);
  a file with bad tasks goes to `inbox/rejected/` with the reasons (FILE:LINE: field) beside it in
  `<name>.error`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from polar_hpc import wire
from polar_hpc.config import ConfigError, Task, duplicate_ids


@dataclass
class Batches:
    tasks: dict[str, list[str]] = field(default_factory=dict)  # batch -> task ids, in order
    batch_of: dict[str, str] = field(default_factory=dict)  # task id -> its batch
    max_staleness: dict[str, int] = field(default_factory=dict)  # batch -> versions allowed
    stale: Counter = field(default_factory=Counter)  # batch -> sessions marked stale

    def add(self, batch_id: str, task_ids: Iterable[str], max_staleness: int | None = None) -> tuple[list[str], list[str]]:
        """Record a batch; returns (ids new to the run, ids it already had)."""
        added: list[str] = []
        known: list[str] = []
        for tid in task_ids:
            (known if tid in self.batch_of else added).append(tid)
        if added:
            self.tasks.setdefault(batch_id, []).extend(added)
            for tid in added:
                self.batch_of[tid] = batch_id
            if max_staleness is not None:
                self.max_staleness[batch_id] = max_staleness
        return added, known

    def is_stale(self, task_id: str, assigned: str, newest: str) -> bool:
        """A session dispatched under weight version `assigned` that ends when `newest` is current lags
        by at most newest - assigned versions (`wire.version_number`); beyond its batch's
        max_staleness it is stale."""
        batch = self.batch_of.get(task_id)
        allowed = self.max_staleness.get(batch) if batch is not None else None
        if allowed is None:  # most batches: no version parsed per result
            return False
        then, now = wire.version_number(assigned), wire.version_number(newest)
        if then is None or now is None or now - then <= allowed:
            return False
        self.stale[batch] += 1
        return True


def validate(tasks: list[dict[str, Any]]) -> list[Task]:
    good, problems = [], []
    for i, data in enumerate(tasks):
        try:
            good.append(Task.model_validate(data))
        except pydantic.ValidationError as e:
            name = data.get("id", "?") if isinstance(data, dict) else "?"
            for err in e.errors():
                where = ".".join(str(x) for x in err["loc"]) or "(top level)"
                problems.append(f"task {i} (id {name!r}): {where}: {err['msg']}")
    dup = duplicate_ids([t.id for t in good])
    if dup:
        problems.append(f"duplicate task id(s) in one batch: {', '.join(dup)}")
    if problems:
        raise ConfigError("\n".join(problems))
    return good


def inbox_files(run_dir: Path) -> list[Path]:
    inbox = run_dir / "inbox"
    if not inbox.is_dir():
        return []
    return sorted((p for p in inbox.glob("*.jsonl") if p.is_file()), key=lambda p: (p.stat().st_mtime, p.name))


def consume(path: Path, error: str | None = None) -> Path:
    """Move an inbox file to done/ (or rejected/, with `error` beside it); returns where it went."""
    folder = path.parent / ("rejected" if error is not None else "done")
    folder.mkdir(exist_ok=True)
    target = folder / path.name
    if error is not None:
        (folder / f"{path.name}.error").write_text(error + "\n")
    path.rename(target)
    return target
