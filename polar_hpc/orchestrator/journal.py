"""Append-only journal of session state changes: `<run>/journal/orchestrator.jsonl`.

One JSON object per line, flushed as it is written: {"t", "event", "session", ...}. It is the record
a requeued job resumes from and the audit trail of every attempt. Events: queued, gateway_up,
assigned, state, result, gateway_lost, requeued. There is at most one `result` per (task, sample):
`{"event": "result", "session", "task", "sample", "attempt", "status", "reward", "shard"}` names the
attempt that counts; any other trajectory a gateway wrote for that key is a stray duplicate.
A `cancelled` result only counts when the session was cancelled on purpose; a session cut short
because its gateway stopped is journaled as `interrupted` and runs again. `replay` reads the
journal back when a requeued job starts again (`resumed`): keys with a result are not redone,
the others are queued again with a higher attempt number. A service run also journals each task
a trainer added (`submitted`, with its batch) and `drain`; `service_events` reads them back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, run_dir: Path) -> None:
        path = run_dir / "journal" / "orchestrator.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        cut = path.exists() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        self._file = open(path, "a", buffering=1)
        if cut:  # a line a crash cut short stays alone on its line
            self._file.write("\n")

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"t": round(time.time(), 6), "event": event, **fields}) + "\n")

    def write_many(self, event: str, rows: Iterable[dict[str, Any]]) -> None:
        """One event per row, in one write (a whole task file queued at start)."""
        t = round(time.time(), 6)
        self._file.write("".join(json.dumps({"t": t, "event": event, **fields}) + "\n" for fields in rows))

    def close(self) -> None:
        self._file.close()


def replay(run_dir: Path) -> tuple[dict[tuple[str, int], dict], dict[tuple[str, int], int]]:
    """What an earlier life of the run left: the `result` event of each finished (task, sample),
    and the highest attempt number seen for every key. Empty when the run is new."""
    path = run_dir / "journal" / "orchestrator.jsonl"
    results: dict[tuple[str, int], dict] = {}
    attempts: dict[tuple[str, int], int] = {}
    if not path.exists():
        return results, attempts
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        key = _key(event.get("session", ""))
        if key is None:
            continue
        attempts[key[:2]] = max(attempts.get(key[:2], -1), key[2])
        if event.get("event") == "result":
            results.setdefault(key[:2], event)
    return results, attempts


def service_events(run_dir: Path) -> tuple[list[dict], bool]:
    """A service run's earlier life: its `submitted` events (batch, task, max_staleness) in order,
    and whether it was draining."""
    path = run_dir / "journal" / "orchestrator.jsonl"
    submitted, drained = [], False
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "submitted":
                submitted.append(event)
            drained = drained or event.get("event") == "drain"
    return submitted, drained


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1)


def _key(session_id: str) -> tuple[str, int, int] | None:
    """`<task>#<sample>.<attempt>` -> (task, sample, attempt)."""
    task, _, rest = session_id.rpartition("#")
    sample, _, attempt = rest.partition(".")
    if not task or not sample.isdigit() or not attempt.isdigit():
        return None
    return task, int(sample), int(attempt)
