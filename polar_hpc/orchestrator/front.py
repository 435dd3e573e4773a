"""The service front end: what trainers add, cancel and ask of a service run (`service.enabled`).

The run has no fixed task list. Trainers add batches (SubmitTasks, or files in `<run>/inbox/`),
idempotent by task id: each new task is journaled `submitted` and its sessions `queued`, then
offered to the gateways. More queued sessions than `service.max_queued` answer Busy (with the time
until that many places free up at the recent rate) and take nothing; a batch larger than the
bound, bad tasks or a draining run are Refused. CancelTasks cancels a batch or a task (`Scheduler.cancel`):
queued and held sessions at once (journaled as a `cancelled` result), running ones through their gateway.
BatchStatusRequest counts each batch's sessions by state. Drain (journaled) lets the run finish
once every session has ended; it takes nothing more.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from polar_hpc import wire
from polar_hpc.config import ConfigError, ServiceConfig, load_tasks
from polar_hpc.orchestrator import service
from polar_hpc.orchestrator.journal import Journal
from polar_hpc.orchestrator.scheduling import Scheduler
from polar_hpc.orchestrator.sessions import FINAL


class Front:
    def __init__(self, config: ServiceConfig, run_dir: Path, scheduler: Scheduler, journal: Journal,
                 draining: bool) -> None:
        self.config, self.run_dir, self.scheduler, self.journal = config, run_dir, scheduler, journal
        self.table, self.batches = scheduler.table, scheduler.batches
        self.draining = draining

    def submit(self, batch_id: str, data: list[dict[str, Any]], max_staleness: int | None = None) -> wire.Message:
        if self.draining:
            return wire.Refused(error="the run is draining: it takes no more tasks")
        try:
            tasks = service.validate(data)
        except ConfigError as e:
            return wire.Refused(error=str(e))
        new = [t for t in tasks if t.id not in self.batches.batch_of]
        sessions = sum(t.num_samples for t in new)
        bound = self.config.max_queued
        if sessions > bound:
            return wire.Refused(error=f"batch {batch_id}: {sessions} sessions can never fit service.max_queued "
                                      f"= {bound}; split it")
        if new and len(self.table.queue) + sessions > bound:
            return wire.Busy(queued=len(self.table.queue), max_queued=bound, retry_after_s=self._retry_after(sessions))
        if max_staleness is not None and max_staleness < 0:
            return wire.Refused(error=f"batch {batch_id}: max_staleness must be >= 0, not {max_staleness}")
        added, known = self.batches.add(batch_id, [t.id for t in tasks], max_staleness)
        for task in new:
            self.journal.write("submitted", batch=batch_id, task=task.model_dump(mode="json"),
                               max_staleness=max_staleness)
            for s in self.table.add(task):
                self.journal.write("queued", session=s.session_id, task=task.id, sample=s.sample_index,
                                   attempt=s.attempt)
        self.scheduler.dispatch_all()
        return wire.Submitted(batch_id=batch_id, added=added, known=known)

    def cancel(self, msg: wire.CancelTasks) -> wire.Message:
        if msg.task_id is not None:
            if msg.task_id not in self.batches.batch_of:
                return wire.Refused(error=f"no task {msg.task_id!r} in this run")
            task_ids = {msg.task_id}
        elif msg.batch_id in self.batches.tasks:
            task_ids = set(self.batches.tasks[msg.batch_id])
        else:
            return wire.Refused(error=f"no batch {msg.batch_id!r} in this run")
        n = 0
        for s in list(self.table.sessions.values()):
            if s.task.id not in task_ids or s.state in FINAL:
                continue
            n += 1
            self.scheduler.cancel(s)
        return wire.Cancelled(sessions=n)

    def batch_status(self, msg: wire.BatchStatusRequest) -> wire.Message:
        batch_id = msg.batch_id
        if batch_id is not None and batch_id not in self.batches.tasks:
            return wire.Refused(error=f"no batch {batch_id!r} in this run")
        chosen = [batch_id] if batch_id is not None else list(self.batches.tasks)
        by_task: dict[str, list[str]] = {}
        for s in self.table.sessions.values():
            by_task.setdefault(s.task.id, []).append(s.state)
        batches = {}
        for b in chosen:
            states = [state for tid in self.batches.tasks[b] for state in by_task.get(tid, [])]
            batches[b] = wire.BatchState(states=dict(Counter(states)), total=len(states),
                                         done=all(state in FINAL for state in states), stale=self.batches.stale[b])
        return wire.BatchStatus(batches=batches)

    def drain(self) -> None:
        self.draining = True
        self.journal.write("drain")

    def take_inbox(self) -> None:
        """Queue the inbox's files, oldest first, until one meets a full queue (it stays for later)."""
        if self.draining:
            return
        for path in service.inbox_files(self.run_dir):
            try:
                tasks = load_tasks(path)  # FILE:LINE: field errors; sandbox files relative to the inbox
            except ConfigError as e:
                self.journal.write("inbox", file=path.name, moved_to=str(service.consume(path, str(e))), error=str(e))
                continue
            answer = self.submit(f"inbox-{path.stem}", [t.model_dump(mode="json") for t in tasks])
            if isinstance(answer, wire.Busy):
                return  # the file stays; it is taken once there is room
            error = answer.error if isinstance(answer, wire.Refused) else None
            target = service.consume(path, error)
            self.journal.write("inbox", file=path.name, moved_to=str(target), error=error)

    def _retry_after(self, sessions: int) -> float:
        """Time until `sessions` places free up at the recent rate (0.5 s to 30 s)."""
        rate = self.scheduler.rate.per_s()
        excess = len(self.table.queue) + sessions - self.config.max_queued
        return min(30.0, max(0.5, excess / rate if rate > 0 else 5.0))
