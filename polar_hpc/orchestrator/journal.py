"""Append-only journal of session state changes: `<run>/journal/orchestrator.jsonl`.

One JSON object per line: {"t", "event", "session", ...}; `t` is the unix time of the first line
of its flush (one clock read per batch, not per line). Lines wait in memory while the
orchestrator handles one batch of messages and are written (`flush`, one write to the OS) before
any message leaves it: whatever a peer was told is in the file first, so a crash of the process
loses nothing acknowledged. It is the record
a requeued job resumes from and the audit trail of every attempt. Events: queued, gateway_up,
assigned, state, result, gateway_lost, requeued, interrupted, held, decided. There is at most one `result` per (task, sample):
`{"event": "result", "session", "task", "sample", "attempt", "status", "reward", "shard"}` names the
attempt that counts; any other trajectory a gateway wrote for that key is a stray duplicate.
A `cancelled` result only counts when the session was cancelled on purpose; a session cut short
because its gateway stopped is journaled as `interrupted` and runs again. `decided` (a task with
`accept`: orchestrator/groups.py) names the samples of the task's group (`accepted`) and its tail
(`cancelled`), once; `replay` gives the decisions back, and never adopts a record of a tail. `replay` reads the
journal back when a requeued job starts again (`resumed`): keys with a result are not redone,
the others are queued again with a higher attempt number. Before that it adopts what the earlier
life finished but never journaled (a gateway wrote the trajectory after the orchestrator had
stopped, e.g. a session in POSTRUN at a requeue): it first seals the temp shards killed gateways
left (as their next writer would; nothing else writes shards before the orchestrator is up),
then a shard record of an assigned attempt, not requeued, whose status is completed, error or
timeout becomes that key's `result` (with `"adopted": true`), so it is neither run again nor
duplicated. A service run also journals each
task a trainer added (`submitted`, with its batch) and `drain`; `service_events` reads them back.
`progress` counts sessions and results for `polar-hpc status` and the Slurm driver (with the
sessions held by walltime admission, and the attempts a stop cut short and how long they had run); `read_jsonl`
reads any such log (the driver's `journal/driver.jsonl` too).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from polar_hpc import nofollow
from polar_hpc.config import task_file_sessions
from polar_hpc.shards.decisions import FirstResults
from polar_hpc.shards.reader import read_shard, shard_files
from polar_hpc.shards.writer import ShardWriter

_encode = msgspec.json.Encoder().encode  # one compact JSON object (UTF-8) per line

ADOPTABLE = ("completed", "error", "timeout")  # `cancelled` in a shard is an attempt cut short


class Journal:
    def __init__(self, run_dir: Path) -> None:
        path = _path(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = nofollow.fopen(path, "ab", below=2)  # a link planted there is never written through
        cut = os.fstat(self._file.fileno()).st_size > 0 and _last_byte(path) != b"\n"
        self._lines: list[bytes] = [b"\n"] if cut else []  # a line a crash cut short stays alone on its line
        self._t = round(time.time(), 6)  # the time of the first line waiting

    def write(self, event: str, **fields: Any) -> None:
        self._lines.append(_encode({"t": self._now(), "event": event, **fields}) + b"\n")

    def write_many(self, event: str, rows: Iterable[dict[str, Any]]) -> None:
        """One event per row (a whole task file queued at start, the sessions of one Assign)."""
        t = self._now()
        self._lines.extend(_encode({"t": t, "event": event, **fields}) + b"\n" for fields in rows)

    def _now(self) -> float:
        if not self._lines:
            self._t = round(time.time(), 6)
        return self._t

    def flush(self) -> None:
        """Hand every line written so far to the OS, in one write."""
        if self._lines:
            self._file.write(b"".join(self._lines))
            self._file.flush()
            self._lines.clear()

    def close(self) -> None:
        self.flush()
        self._file.close()


Replayed = tuple[dict[tuple[str, int], dict], dict[tuple[str, int], int], dict[str, frozenset[int]]]


def replay(run_dir: Path) -> Replayed:
    """What an earlier life of the run left: the `result` event of each finished (task, sample),
    adopted ones included (journaled here), the highest attempt number seen for every key, and the
    decided groups (task -> accepted samples). Empty when the run is new."""
    results: FirstResults[dict] = FirstResults()
    attempts: dict[tuple[str, int], int] = {}
    assigned: set[str] = set()
    dead: set[str] = set()
    decided: dict[str, frozenset[int]] = {}
    for event in _events(run_dir):
        if event.get("event") == "decided" and isinstance(event.get("task"), str):
            decided.setdefault(event["task"], frozenset(int(i) for i in event.get("accepted", [])))
        key = _key(event.get("session", ""))
        if key is None:
            continue
        attempts[key[:2]] = max(attempts.get(key[:2], -1), key[2])
        kind = event.get("event")
        if kind == "result":
            results.offer(key[:2], event)
        elif kind == "assigned":
            assigned.add(event["session"])
        elif kind == "requeued":
            dead.add(event.get("previous", ""))
    if assigned - dead and any(k not in results for k in attempts):
        adopted = [e for e in _adopt(run_dir, results, assigned - dead)
                   if e["task"] not in decided or e["sample"] in decided[e["task"]]]  # never a tail
        if adopted:
            journal = Journal(run_dir)
            for event in adopted:
                journal.write("result", **event)
            journal.close()
            results |= {(e["task"], e["sample"]): e for e in adopted}
    return results, attempts, decided


def _adopt(run_dir: Path, results: dict, candidates: set[str]) -> list[dict]:
    """The first sealed record of each key without a result whose session is a candidate."""
    adopted: dict[tuple[str, int], dict] = {}
    shards = Path(run_dir) / "shards"
    try:
        names = nofollow.listdir(shards)
    except FileNotFoundError:
        return []
    leftovers = {m[1] for n in names if (m := re.fullmatch(r"\.(.+)-\d{6,}\.shard\.tmp", n))}
    for writer_id in sorted(leftovers):
        ShardWriter(shards, writer_id, 1 << 20, 60.0).close()  # seals what a killed gateway left
    for shard in shard_files(shards):
        for _, _, t in read_shard(shard, []):
            key = (t.task_id, t.sample_index)
            if t.session_id in candidates and t.status in ADOPTABLE and key not in results and key not in adopted:
                adopted[key] = {"session": t.session_id, "task": t.task_id, "sample": t.sample_index,
                                "attempt": t.attempt, "status": t.status, "reward": t.reward,
                                "shard": shard.name, "n_tokens": t.n_tokens, "adopted": True}
    return list(adopted.values())


@dataclass
class Progress:
    """Sessions of a run as its journal (and task file) tell them."""

    total: int = 0
    ended: Counter = field(default_factory=Counter)  # status -> (task, sample) keys with a result
    shutdown: dict | None = None  # the last `shutdown` event (a client, e.g. `polar-hpc cancel`)
    held: int = 0  # (task, sample) keys held by walltime admission and not run since
    cut: int = 0  # attempts cut short by a stop (`interrupted`)
    cut_s: float = 0.0  # the seconds those attempts had run since their dispatch
    discarded: int = 0  # attempts of a decided group's tail (over-provisioning) that had been dispatched
    discarded_s: float = 0.0  # the seconds they ran, dispatch to result

    @property
    def left(self) -> int:
        return self.total - sum(self.ended.values())


def progress(run_dir: Path) -> Progress:
    keys: set[tuple[str, int]] = set()
    done: FirstResults[str] = FirstResults()
    held: set[tuple[str, int]] = set()
    dispatched: dict[str, float] = {}  # session -> when it was assigned
    accepted: dict[str, set] = {}  # task -> the samples of its decided group
    p = Progress()
    for event in _events(run_dir):
        key = _key(event.get("session", ""))
        kind = event.get("event")
        if kind == "decided" and isinstance(event.get("task"), str) and isinstance(event.get("accepted"), list):
            accepted[event["task"]] = set(event["accepted"])
        if key is not None:
            keys.add(key[:2])
            if kind == "result":
                done.offer(key[:2], event.get("status", "?"))
            if kind == "held":
                held.add(key[:2])
            elif kind in ("assigned", "result"):
                held.discard(key[:2])
            if kind == "assigned":
                dispatched[event["session"]] = event.get("t", 0.0)
            elif kind == "interrupted" and event["session"] in dispatched:
                p.cut += 1
                p.cut_s += max(0.0, event.get("t", 0.0) - dispatched.pop(event["session"]))
            elif kind == "result" and event["session"] in dispatched and key[1] not in accepted.get(key[0], (key[1],)):
                p.discarded += 1
                p.discarded_s += max(0.0, event.get("t", 0.0) - dispatched.pop(event["session"]))
        elif kind == "shutdown":
            p.shutdown = event
    p.total, p.ended, p.held = (max(len(keys), task_file_sessions(run_dir / "tasks.jsonl")), Counter(done.values()),
                                len(held))
    return p


def service_events(run_dir: Path) -> tuple[list[dict], bool]:
    """A service run's earlier life: its `submitted` events (batch, task, max_staleness) in order,
    and whether it was draining."""
    submitted, drained = [], False
    for event in _events(run_dir):
        if event.get("event") == "submitted":
            submitted.append(event)
        drained = drained or event.get("event") == "drain"
    return submitted, drained


def _events(run_dir: Path) -> list[dict]:
    return read_jsonl(_path(run_dir))


def read_jsonl(path: Path) -> list[dict]:
    """Every whole JSON object of a JSON-lines log of the run's journal/ (a line cut short by a crash
    is skipped); journal/ and the log are never a followed link (OSError)."""
    events = []
    try:
        text = nofollow.read_text(path, below=2)
    except FileNotFoundError:
        text = ""
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _path(run_dir: Path) -> Path:
    return Path(run_dir) / "journal" / "orchestrator.jsonl"


def _last_byte(path: Path) -> bytes:
    with nofollow.fopen(path, "rb", below=2) as f:
        f.seek(-1, 2)
        return f.read(1)


def _key(session_id: str) -> tuple[str, int, int] | None:
    """`<task>#<sample>.<attempt>` -> (task, sample, attempt)."""
    if not isinstance(session_id, str):
        return None
    task, _, rest = session_id.rpartition("#")
    sample, _, attempt = rest.partition(".")
    if not task or not sample.isdigit() or not attempt.isdigit():
        return None
    return task, int(sample), int(attempt)
