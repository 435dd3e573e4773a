"""How long a task's sessions take, as observed, for walltime admission (`slurm.admit_by: observed`).

`Durations(quantile, min_samples)` keeps, per task, the seconds its last `KEPT` completed sessions
took from dispatch to result (at most `MAX_TASKS` tasks, the least recently seen dropped first).
`expected(task)` is the time admission plans for: the task's `timeout_s`, or, once `min_samples`
sessions of the task completed, the `quantile` of their durations (never more than `timeout_s`).
`quantile` None means admission by `timeout_s` alone (the default).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

from polar_hpc.config import Task

KEPT = 64
MAX_TASKS = 100_000


class Durations:
    def __init__(self, quantile: float | None = None, min_samples: int = 3) -> None:
        self.quantile, self.min_samples = quantile, min_samples
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def add(self, task_id: str, seconds: float) -> None:
        if self.quantile is None:
            return
        kept = self._seen.pop(task_id, None) or deque(maxlen=KEPT)
        kept.append(max(0.0, seconds))
        self._seen[task_id] = kept
        if len(self._seen) > MAX_TASKS:
            self._seen.popitem(last=False)

    def expected(self, task: Task) -> float:
        kept = self._seen.get(task.id)
        if self.quantile is None or kept is None or len(kept) < self.min_samples:
            return task.timeout_s
        ordered = sorted(kept)
        at = ordered[min(len(ordered) - 1, max(0, math.ceil(self.quantile * len(ordered)) - 1))]
        return min(task.timeout_s, at)
