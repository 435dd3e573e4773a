"""Early acceptance per group: which samples of a task with `accept` make its group, decided once.

A task with `accept: N` starts `num_samples` (N + k) sessions. Its group is decided at its N-th
result that counts and is not `cancelled` (completed, error or timeout: a sample that finished),
or, with `accept_fraction` and `accept_grace_s`, as soon as `accept_grace_s` have passed since its
first such result and ceil(accept_fraction * N) samples have one. The decided group is the first N
samples that finished (all of them, when decided by the fraction); every other sample of the task
is its tail, cut: cancelled, never run again, never trained on. A decided group is never reopened.
Pure bookkeeping: the scheduler journals each decision (`decided`) and cancels the tail; a resumed
run gives back the decisions its journal holds (`journal.replay`) before any result is noted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from polar_hpc.config import Task


@dataclass
class _Open:
    task: Task
    finished: list[int] = field(default_factory=list)  # samples, in the order their results came
    first_t: float = 0.0  # when the first of them came


class Groups:
    def __init__(self) -> None:
        self.open: dict[str, _Open] = {}  # task id -> its group while undecided (tasks with `accept`)
        self.decided: dict[str, frozenset[int]] = {}  # task id -> the samples of its decided group

    def cut(self, task_id: str, sample: int) -> bool:
        """Whether `sample` is in the tail of its task's decided group."""
        group = self.decided.get(task_id)
        return group is not None and sample not in group

    def finished(self, task: Task, sample: int, t: float) -> frozenset[int] | None:
        """Note that `sample` of `task` finished at `t`; the group if this decides it."""
        if task.accept is None or task.id in self.decided:
            return None
        group = self.open.setdefault(task.id, _Open(task, first_t=t))
        group.finished.append(sample)
        return self._ready(group, t)

    def due(self, now: float) -> list[tuple[Task, frozenset[int]]]:
        """The groups whose grace has passed with enough samples finished: decided now."""
        out = []
        for group in list(self.open.values()):
            if group.task.accept_grace_s is not None and (samples := self._ready(group, now)) is not None:
                out.append((group.task, samples))
        return out

    def decide(self, task_id: str, samples: frozenset[int]) -> None:
        self.open.pop(task_id, None)
        self.decided[task_id] = samples

    def _ready(self, group: _Open, now: float) -> frozenset[int] | None:
        task, n = group.task, len(group.finished)
        assert task.accept is not None
        if n >= task.accept:
            return frozenset(group.finished[: task.accept])
        if (task.accept_fraction is not None and task.accept_grace_s is not None
                and now - group.first_t >= task.accept_grace_s and n >= math.ceil(task.accept_fraction * task.accept)):
            return frozenset(group.finished)
        return None
