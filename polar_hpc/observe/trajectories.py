"""A run's accepted trajectories, read from its sealed shards, as figures and browser rows.

`TrajectoryFigures(shards_dir, decisions, series, errors, problems).poll()` reads the shards
sealed since the last poll, found through the writers' indexes (`shards/index/*.jsonl`, plus a
listing of `shards/` every `list_every_s` for a shard a killed writer left unindexed). Each record
the journal accepts (`decisions`) adds its tokens, trainable tokens (loss mask 1), reward, chain
breaks, weight versions, calls, stage seconds (`metadata.timings`) and the seconds of calls an
engine aborted for a weight update (`aborted_s`, from `metadata.aborted_attempts`) to the figures and to
`series`; a record the journal has not decided yet is held (its place only) and counted once its
key's result names it; one it decided against is a stray. Memory is bounded: aggregates, plus one
small row per trajectory for the browser (the latest `max_rows`). `trajectory(row_id)` reads one
record back from its shard by the place this reader found it at: a request never names a file.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from polar_hpc.observe.figures import Kinds, Series, Stat, kind_of
from polar_hpc.shards import index
from polar_hpc.shards.decisions import ACCEPT, STRAY, UNDECIDED, Decisions
from polar_hpc.shards.reader import read_shard
from polar_hpc.trajectory.model import Trajectory


class TrajectoryFigures:
    def __init__(self, shards_dir: Path, decisions: Decisions, series: Series, errors: Kinds, problems: deque[str],
                 max_rows: int = 100_000, list_every_s: float = 30.0) -> None:
        self.shards_dir, self.decisions = shards_dir, decisions
        self.series, self.errors, self.problems = series, errors, problems
        self.max_rows, self.list_every_s = max_rows, list_every_s
        self._index: dict[str, int] = {}  # writer -> bytes of its index read
        self._read: set[str] = set()  # shards read
        self._listed_at = 0.0
        self.pending: list[tuple[str, int, tuple[str, int], str]] = []  # (shard, offset, key, session)
        self.tasks: dict[str, dict[str, Any]] = {}
        self.tokens = self.trainable = self.count = self.strays = self.calls = 0
        self.aborted_s = 0.0
        self.versions: Counter[str] = Counter()
        self.stage_seconds: dict[str, Stat] = {}
        self.chain_breaks = Kinds(max_kinds=50)
        self.rows: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._next_row = 0

    def poll(self) -> None:
        """Count the held records the journal has decided since, then read the new shards."""
        if self.decisions.accepted:
            still = []
            for shard, offset, key, session in self.pending:
                verdict = self.decisions.verdict_of(key, session, shard)
                if verdict == UNDECIDED:
                    still.append((shard, offset, key, session))
                elif verdict == ACCEPT:
                    for _, _, traj in read_shard(self.shards_dir / shard, [], offset):
                        self._add(traj, shard, offset)
                        break
                else:
                    self.strays += 1
            self.pending = still
        for name in self._new_shards():
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

    def _new_shards(self) -> list[str]:
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
        new = [n for n in dict.fromkeys(names) if n not in self._read]
        self._read.update(new)
        return new

    def _add(self, traj: Trajectory, shard: str, offset: int) -> None:
        meta = traj.metadata
        trainable = sum(sum(tr.loss_mask) for tr in traj.traces)
        calls = int(meta.get("calls", 0) or 0)
        self.count += 1
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
        for note in (meta.get("aborted_attempts") or {}).values():
            seconds = note.get("seconds") if isinstance(note, dict) else None
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
                self.aborted_s += float(seconds)
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
