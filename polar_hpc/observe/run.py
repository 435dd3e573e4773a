"""Everything the dashboard, the metrics log and `status --watch` show, read from a run directory.

`RunReader(run_dir).poll()` reads what was appended since the last poll, and only that, through
three readers sharing one time series (`series`), one error count (`errors`) and one list of
unreadable input (`problems`):
- `sessions` (sessions.py): the orchestrator's journal — sessions queued, in each stage, ended;
  gateways; requeues; progress and the session rate;
- `shards` (trajectories.py): the sealed shards' accepted records — tokens, rewards, chain breaks,
  weight versions, stage seconds, and the trajectory browser's rows;
- `logs` (logs.py): each process's log — errors by kind, last line, when it last changed;
and `live`, the orchestrator's lines of metrics.jsonl. `driver()` is the driver journal's last
event (whether the job ended, and why); `jobs()` every Slurm job of the run (the main one and its
grow jobs, `journal/grow.jsonl`) by its last word; `accounting()` the run's cost as `polar-hpc status` last
wrote it from Slurm's accounting (`accounting.json`, launch/accounting.py); `overview()` is the
figures as one JSON object.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from polar_hpc.observe.figures import Kinds, Series
from polar_hpc.observe.livelog import LiveLog
from polar_hpc.observe.logs import LogHealth
from polar_hpc.observe.sessions import SessionFigures
from polar_hpc.observe.trajectories import TrajectoryFigures

_RATE_WINDOW_S = 300.0
ACCOUNTING = "accounting.json"
_MAX_ACCOUNTING_BYTES = 4 << 20


class RunReader:
    def __init__(self, run_dir: Path, max_rows: int = 100_000, list_every_s: float = 30.0) -> None:
        self.run_dir = Path(run_dir)
        self.series, self.errors, self.problems = Series(), Kinds(), deque[str](maxlen=50)
        self.sessions = SessionFigures(self.run_dir, self.series, self.errors, self.problems)
        self.shards = TrajectoryFigures(self.run_dir / "shards", self.sessions.decisions, self.series, self.errors,
                                        self.problems, max_rows, list_every_s)
        self.logs = LogHealth(self.run_dir, self.errors)
        self.live = LiveLog(self.run_dir)

    def poll(self) -> None:
        self.sessions.poll()  # first: the journal's decisions settle the shards' held records
        self.shards.poll()
        self.logs.poll()
        self.live.poll()

    def driver(self) -> dict[str, Any] | None:
        events = self._tail("driver.jsonl")
        return events[-1] if events else None

    def jobs(self) -> list[dict[str, Any]]:
        """Every Slurm job of the run, the main one (driver.jsonl) and its grow jobs (grow.jsonl):
        {job, kind, event, outcome} by each job's last word (`submitted`, `start`, `joined`, `end`)."""
        last: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, name in (("main", "driver.jsonl"), ("grow", "grow.jsonl")):
            for e in self._tail(name):
                if e.get("job"):
                    last[(kind, str(e["job"]))] = e
        return [{"job": job, "kind": kind, "event": e.get("event"), "outcome": e.get("outcome")}
                for (kind, job), e in list(last.items())[:100]]

    def _tail(self, name: str) -> list[dict[str, Any]]:
        """The whole JSON objects in the last 64 KiB of journal/`name`."""
        try:
            with nofollow.fopen(self.run_dir / "journal" / name, "rb", below=2) as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                lines = f.read().splitlines()
        except OSError:
            return []
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def accounting(self) -> dict[str, Any] | None:
        try:
            with nofollow.fopen(self.run_dir / ACCOUNTING, "rb") as f:
                figures = json.loads(f.read(_MAX_ACCOUNTING_BYTES))
        except (OSError, ValueError):
            return None
        return figures if isinstance(figures, dict) else None

    def overview(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        s, t = self.sessions, self.shards
        total, done, queued = s.total, sum(s.results.values()), s.decisions.queued
        driver = self.driver()
        finished = bool(queued) and done >= len(queued)
        stopped = driver is not None and driver.get("event") == "end"
        clock = s.last_t if (finished or stopped) and s.last_t else now
        recent = [x for x in s.result_times if x >= clock - _RATE_WINDOW_S]
        span = min(_RATE_WINDOW_S, clock - (s.first_t or clock)) if recent else 0.0
        rate = len(recent) / span if span > 0 else 0.0
        elapsed = clock - s.first_t if s.first_t else 0.0
        left = max(0, total - done)
        return {
            "run_dir": str(self.run_dir),
            "state": "finished" if finished else "stopped" if stopped else "running",
            "driver": driver,
            "jobs": self.jobs(),
            "total": total, "done": done, "left": left, "by_status": dict(sorted(s.results.items())),
            "elapsed_s": elapsed, "sessions_per_s": rate,
            "eta_s": 0.0 if finished else (left / rate if rate > 0 else None),
            "stages": s.occupancy(),
            "trajectories": t.count, "pending": len(t.pending), "strays": t.strays,
            "tokens": t.tokens, "trainable_tokens": t.trainable, "calls": t.calls, "aborted_call_s": t.aborted_s,
            "tokens_per_s": t.tokens / elapsed if elapsed > 0 else 0.0,
            "requeues": s.requeues,
            "chain_breaks": t.chain_breaks.total(),
            "weight_versions": dict(t.versions.most_common(50)),
            "stage_seconds": {k: v.view() for k, v in sorted(t.stage_seconds.items())},
            "tasks": [{"task_id": k, "reward": v["reward"].view(), "by_status": dict(v["status"])}
                      for k, v in sorted(t.tasks.items())[:1000]],
            "gateways": list(s.gateways.values())[:1000],
            "processes": list(self.logs.processes.values()),
            "errors_total": self.errors.total(),
            "problems": list(self.problems),
            "accounting": self.accounting(),
        }
