"""Everything the dashboard, the metrics log and `status --watch` show, read from a run directory.

`RunReader(run_dir).poll()` reads what was appended since the last poll, and only that:
- `journal/orchestrator.jsonl`: sessions queued, assigned, in each stage, ended (by status);
  gateways up and lost; requeues. Progress and the session rate come from here (a key counts
  once, at its first `result`, as docs/shards.md says);
- sealed shards, found through the writers' indexes (`shards/index/*.jsonl`, plus a listing of
  `shards/` every `list_every_s` for a shard a killed writer left unindexed): each record the
  journal accepts adds its tokens, trainable tokens (loss mask 1), reward, chain breaks, weight
  versions, calls and stage seconds (`metadata.timings`) to the figures; a record the journal has
  not decided yet is held (its place only) and counted once its key's result names it;
- `logs/*.log`: ERROR, WARNING and CRITICAL lines and tracebacks, grouped by kind (`kind_of`),
  and each process's last line and when its log last changed (its health, as far as files say);
- `journal/driver.jsonl`: whether the job ended, and why.
Memory is bounded: aggregates, plus one small row per trajectory for the browser (the latest
`max_rows`). `trajectory(row_id)` reads one record back from its shard by the place the reader
itself found it at: a request never names a file.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections import Counter, OrderedDict, deque
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from polar_hpc.observe.figures import Kinds, Series, Stat, kind_of
from polar_hpc.observe.livelog import LiveLog
from polar_hpc.observe.tail import Tail
from polar_hpc.shards import index
from polar_hpc.config import task_file_sessions
from polar_hpc.shards.decisions import ACCEPT, STRAY, Decisions, FirstResults
from polar_hpc.shards.reader import read_shard
from polar_hpc.trajectory.model import Trajectory

STAGES = ("QUEUED", "ASSIGNED", "INIT", "READY", "RUN", "POSTRUN")
_LOG_LEVEL = re.compile(r"\b(ERROR|WARNING|CRITICAL)\b")
_RATE_WINDOW_S = 300.0


class RunReader:
    def __init__(self, run_dir: Path, max_rows: int = 100_000, list_every_s: float = 30.0) -> None:
        self.run_dir = Path(run_dir)
        self.shards_dir = self.run_dir / "shards"
        self.max_rows = max_rows
        self.list_every_s = list_every_s
        self.decisions = Decisions(self.run_dir)
        self._journal = Tail(self.run_dir / "journal" / "orchestrator.jsonl", max_bytes=16 << 20, below=2)
        self._index: dict[str, int] = {}  # writer -> bytes of its index read
        self._read: set[str] = set()  # shards read
        self._listed_at = 0.0
        self._logs: dict[str, Tail] = {}
        self.pending: list[tuple[str, int, tuple[str, int], str]] = []  # (shard, offset, key, session)
        self.active: dict[str, str] = {}  # session -> stage, for sessions assigned and not ended
        self.in_stage: Counter[str] = Counter()
        self._total = 0  # sessions the run asks for, as of the last poll
        self.results: Counter[str] = Counter()
        self._counted: FirstResults[str] = FirstResults()  # key -> the status of its result
        self._samples = (0.0, 0)  # (mtime, sessions) of tasks.jsonl
        self.result_times: deque[float] = deque(maxlen=100_000)
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.gateways: dict[str, dict[str, Any]] = {}
        self.requeues = 0
        self.series = Series()
        self.tasks: dict[str, dict[str, Any]] = {}
        self.tokens = self.trainable = self.trajectories = self.strays = self.calls = 0
        self.versions: Counter[str] = Counter()
        self.stage_seconds: dict[str, Stat] = {}
        self.chain_breaks = Kinds(max_kinds=50)
        self.errors = Kinds()
        self.problems: deque[str] = deque(maxlen=50)
        self.rows: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._next_row = 0
        self.processes: dict[str, dict[str, Any]] = {}
        self.live = LiveLog(self.run_dir)  # the orchestrator's lines of metrics.jsonl

    # -- reading ---------------------------------------------------------------------------------
    def poll(self) -> None:
        self._read_journal()
        self._read_shards()
        self._read_logs()
        self.live.poll()

    def _read_journal(self) -> None:
        self.decisions.update()  # first: the keys queued so far give QUEUED while the lines below apply
        self._total = max(len(self.decisions.queued), self._task_samples())
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
        if self.decisions.accepted:
            still = []
            for shard, offset, key, session in self.pending:
                if key not in self.decisions.accepted:
                    still.append((shard, offset, key, session))
                elif self.decisions.accepted[key] == (session, shard):
                    for _, _, traj in read_shard(self.shards_dir / shard, [], offset):
                        self._add(traj, shard, offset)
                        break
                else:
                    self.strays += 1
            self.pending = still

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

    def _read_shards(self) -> None:
        now = time.monotonic()
        names: list[str] = []
        for writer in index.writer_ids(self.shards_dir):
            path = index.index_path(self.shards_dir, writer)
            for end, entry in index.read_entries(path, self._index.get(writer, 0)):
                self._index[writer] = end
                names.append(entry["shard"])
        if now - self._listed_at >= self.list_every_s:
            self._listed_at = now
            try:
                names += sorted(n for n in nofollow.listdir(self.shards_dir)
                                if n.endswith(".shard") and not n.startswith("."))
            except OSError:
                pass
        for name in names:
            if name in self._read:
                continue
            self._read.add(name)
            found: list[str] = []
            for offset, _, traj in read_shard(self.shards_dir / name, found):
                verdict = self.decisions.verdict(traj, name)
                if verdict == ACCEPT:
                    self._add(traj, name, offset)
                elif verdict == STRAY:
                    self.strays += 1
                else:
                    self.pending.append((name, offset, (traj.task_id, traj.sample_index), traj.session_id))
            for problem in found:
                self.problems.append(problem)
                self.errors.add("damaged shard record", problem)

    def _add(self, traj: Trajectory, shard: str, offset: int) -> None:
        meta = traj.metadata
        trainable = sum(sum(tr.loss_mask) for tr in traj.traces)
        calls = int(meta.get("calls", 0) or 0)
        self.trajectories += 1
        self.tokens += traj.n_tokens
        self.trainable += trainable
        self.calls += calls
        task = self.tasks.setdefault(traj.task_id, {"reward": Stat(), "status": Counter()})
        task["status"][traj.status] += 1
        reward = {}
        if traj.reward is not None:
            task["reward"].add(traj.reward)
            reward = {"reward_sum": traj.reward, "rewarded": 1}
        self.series.add(traj.t_end, tokens=traj.n_tokens, trainable=trainable, calls=calls, **reward)
        for tr in traj.traces:
            self.versions.update(tr.weight_versions)
        for why in meta.get("chain_breaks") or []:
            self.chain_breaks.add(kind_of(str(why)), f"{traj.session_id}: {str(why)[:300]}")
        for stage, seconds in (meta.get("timings") or {}).items():
            if isinstance(seconds, (int, float)):
                self.stage_seconds.setdefault(str(stage), Stat()).add(float(seconds))
        if traj.status != "completed":
            why = str(meta.get("error") or traj.status)
            self.errors.add(f"session {traj.status}: {kind_of(why)}", f"{traj.session_id}: {why[:500]}")
        self.rows[self._next_row] = {
            "id": self._next_row, "task_id": traj.task_id, "sample_index": traj.sample_index,
            "session_id": traj.session_id, "status": traj.status, "reward": traj.reward,
            "traces": len(traj.traces), "tokens": traj.n_tokens, "trainable": trainable, "calls": calls,
            "chain_breaks": len(meta.get("chain_breaks") or []), "t_end": traj.t_end, "_at": (shard, offset),
        }
        self._next_row += 1
        if len(self.rows) > self.max_rows:
            self.rows.popitem(last=False)

    def _read_logs(self) -> None:
        try:
            logs = sorted(n for n in nofollow.listdir(self.run_dir / "logs") if n.endswith(".log"))
        except OSError:
            return
        for entry in logs[:500]:
            st = nofollow.lstat(self.run_dir / "logs" / entry)
            if st is None or not stat.S_ISREG(st.st_mode):
                continue
            tail = self._logs.setdefault(entry, Tail(self.run_dir / "logs" / entry, max_bytes=1 << 20, lossy=True,
                                                     below=2))
            name = entry.removesuffix(".log")
            proc = self.processes.setdefault(name, {"name": name, "errors": 0, "last_line": ""})
            proc["changed"] = st.st_mtime
            in_traceback = False
            for line in tail.lines():
                if line.strip():
                    proc["last_line"] = line[:300]
                level = _LOG_LEVEL.search(line)
                ends_traceback = in_traceback and line[:1] not in (" ", "")  # `SomeError: why`
                if level or ends_traceback:
                    proc["errors"] += level is None or level.group(1) != "WARNING"
                    self.errors.add(f"{name}: {kind_of(line[level.start():] if level else line)}", line[:500])
                in_traceback = line.startswith("Traceback") or (in_traceback and not ends_traceback)
            proc["skipped_bytes"] = tail.skipped

    # -- figures ---------------------------------------------------------------------------------
    def occupancy(self) -> dict[str, int]:
        queued = max(0, self._total - len(self._counted) - len(self.active))
        return {s: queued if s == "QUEUED" else self.in_stage.get(s, 0) for s in STAGES}

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

    def driver(self) -> dict[str, Any] | None:
        path = self.run_dir / "journal" / "driver.jsonl"
        try:
            with nofollow.fopen(path, "rb", below=2) as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                return event
        return None

    def overview(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        total, done = self._total, sum(self.results.values())
        driver = self.driver()
        finished = bool(self.decisions.queued) and done >= len(self.decisions.queued)
        stopped = driver is not None and driver.get("event") == "end"
        clock = self.last_t if (finished or stopped) and self.last_t else now
        recent = [t for t in self.result_times if t >= clock - _RATE_WINDOW_S]
        span = min(_RATE_WINDOW_S, clock - (self.first_t or clock)) if recent else 0.0
        rate = len(recent) / span if span > 0 else 0.0
        elapsed = clock - self.first_t if self.first_t else 0.0
        left = max(0, total - done)
        return {
            "run_dir": str(self.run_dir),
            "state": "finished" if finished else "stopped" if stopped else "running",
            "driver": driver,
            "total": total, "done": done, "left": left, "by_status": dict(sorted(self.results.items())),
            "elapsed_s": elapsed, "sessions_per_s": rate,
            "eta_s": 0.0 if finished else (left / rate if rate > 0 else None),
            "stages": self.occupancy(),
            "trajectories": self.trajectories, "pending": len(self.pending), "strays": self.strays,
            "tokens": self.tokens, "trainable_tokens": self.trainable, "calls": self.calls,
            "tokens_per_s": self.tokens / elapsed if elapsed > 0 else 0.0,
            "requeues": self.requeues,
            "chain_breaks": self.chain_breaks.total(),
            "weight_versions": dict(self.versions.most_common(50)),
            "stage_seconds": {k: v.view() for k, v in sorted(self.stage_seconds.items())},
            "tasks": [{"task_id": k, "reward": v["reward"].view(), "by_status": dict(v["status"])}
                      for k, v in sorted(self.tasks.items())[:1000]],
            "gateways": list(self.gateways.values())[:1000],
            "processes": list(self.processes.values()),
            "errors_total": self.errors.total(),
            "problems": list(self.problems),
        }

    def query(self, task: str | None = None, status: str | None = None, min_reward: float | None = None,
              max_reward: float | None = None, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """Rows of the trajectory browser, newest first, filtered; at most `limit` (<= 500)."""
        out, matched = [], 0
        for row in reversed(self.rows.values()):
            if task and row["task_id"] != task or status and row["status"] != status:
                continue
            r = row["reward"]
            if (min_reward is not None or max_reward is not None) and r is None:
                continue
            if min_reward is not None and r < min_reward or max_reward is not None and r > max_reward:
                continue
            if offset <= matched < offset + min(limit, 500):
                out.append({k: v for k, v in row.items() if k != "_at"})
            matched += 1
        return {"matched": matched, "rows": out, "kept": len(self.rows), "seen": self._next_row}

    def trajectory(self, row_id: int) -> Trajectory | None:
        row = self.rows.get(row_id)
        if row is None:
            return None
        shard, offset = row["_at"]
        for _, _, traj in read_shard(self.shards_dir / shard, [], offset):
            return traj
        return None

