"""A run's sessions as its orchestrator's journal tells them (`journal/orchestrator.jsonl`).

`SessionFigures(run_dir, series, errors, problems).poll()` reads the lines appended since the last
poll: sessions queued (`Decisions`, and the sessions `tasks.jsonl` asks for before they are all
queued), assigned, in each stage, ended by status; gateways up and lost; requeues. A key (task,
sample) counts once, at its first `result`, as docs/shards.md says. Ended sessions go to `series`
and the stage occupancy with them; requeues and lost gateways to `errors`; lines that are not
journal events to `problems`.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from polar_hpc.config import task_file_sessions
from polar_hpc.observe.figures import Kinds, Series
from polar_hpc.observe.tail import Tail
from polar_hpc.shards.decisions import Decisions, FirstResults

STAGES = ("QUEUED", "ASSIGNED", "INIT", "READY", "RUN", "POSTRUN")


class SessionFigures:
    def __init__(self, run_dir: Path, series: Series, errors: Kinds, problems: deque[str]) -> None:
        self.run_dir = run_dir
        self.series, self.errors, self.problems = series, errors, problems
        self.decisions = Decisions(run_dir)
        self._journal = Tail(run_dir / "journal" / "orchestrator.jsonl", max_bytes=16 << 20, below=2)
        self.active: dict[str, str] = {}  # session -> stage, for sessions assigned and not ended
        self.in_stage: Counter[str] = Counter()
        self.total = 0  # sessions the run asks for, as of the last poll
        self.results: Counter[str] = Counter()
        self._counted: FirstResults[str] = FirstResults()  # key -> the status of its result
        self._samples = (0.0, 0)  # (mtime, sessions) of tasks.jsonl
        self.result_times: deque[float] = deque(maxlen=100_000)
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.gateways: dict[str, dict[str, Any]] = {}
        self.requeues = 0

    def poll(self) -> None:
        self.decisions.update()  # first: the keys queued so far give QUEUED while the lines below apply
        self.total = max(len(self.decisions.queued), self._task_samples())
        while True:
            for line in self._journal.lines():
                try:
                    event = json.loads(line)
                    if isinstance(event, dict):
                        self._apply(event)
                except (ValueError, KeyError, TypeError):
                    self.problems.append(f"{self._journal.path}: a line that is not a journal event: {line[:200]}")
            if not self._journal.more:
                break

    def occupancy(self) -> dict[str, int]:
        queued = max(0, self.total - len(self._counted) - len(self.active))
        return {s: queued if s == "QUEUED" else self.in_stage.get(s, 0) for s in STAGES}

    def _apply(self, event: dict[str, Any]) -> None:
        kind, t = event.get("event"), float(event.get("t", 0.0))
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        session = event.get("session")
        if kind in ("assigned", "state") and isinstance(session, str):
            self._leave(session)
            self.active[session] = stage = "ASSIGNED" if kind == "assigned" else str(event["state"])
            self.in_stage[stage] += 1
        elif kind == "result":
            self._leave(str(session))
            status = str(event.get("status", "?"))
            if self._counted.offer((str(event["task"]), int(event["sample"])), status):
                self.results[status] += 1
                self.result_times.append(t)
                self.series.add(t, ended=1, completed=int(status == "completed"))
        elif kind == "requeued":
            self._leave(str(event.get("previous")))
            self.requeues += 1
            self.errors.add("session requeued (its gateway was lost)", f"{event.get('previous')} -> {session}")
        elif kind == "gateway_up":
            self.gateways[str(event["gateway"])] = {"name": event["gateway"], "host": event.get("host", ""),
                                                    "slots": event.get("slots"), "up": True, "since": t}
        elif kind == "gateway_lost":
            self.gateways.setdefault(str(event["gateway"]), {"name": event["gateway"], "host": ""}).update(up=False, since=t)
            self.errors.add("gateway lost", f"{event['gateway']} at {time.strftime('%H:%M:%S', time.gmtime(t))} UTC")
        if kind in ("assigned", "state", "result", "requeued"):
            self.series.stages(t, self.occupancy())

    def _leave(self, session: str) -> None:
        stage = self.active.pop(session, None)
        if stage is not None:
            self.in_stage[stage] -= 1

    def _task_samples(self) -> int:
        """Sessions the task file asks for (before they are all queued), read again when it changes."""
        path = self.run_dir / "tasks.jsonl"
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            return 0
        if self._samples[0] != mtime:
            self._samples = (mtime, task_file_sessions(path))
        return self._samples[1]
