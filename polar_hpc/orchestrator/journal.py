"""Append-only journal of session state changes: `<run>/journal/orchestrator.jsonl`.

One JSON object per line, flushed as it is written: {"t", "event", "session", ...}. It is the record
a requeued job resumes from and the audit trail of every attempt. Events: queued, gateway_up,
assigned, state, result, gateway_lost, requeued. There is at most one `result` per (task, sample):
`{"event": "result", "session", "task", "sample", "attempt", "status", "reward", "shard"}` names the
attempt that counts; any other trajectory a gateway wrote for that key is a stray duplicate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, run_dir: Path) -> None:
        path = run_dir / "journal" / "orchestrator.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"t": round(time.time(), 6), "event": event, **fields}) + "\n")

    def close(self) -> None:
        self._file.close()
