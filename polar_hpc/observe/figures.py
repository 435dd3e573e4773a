"""The aggregates a run's figures are made of, each of bounded size however long the run.

- `Series`: per-time-bucket sums (sessions ended by status, tokens, rewards) and the stage
  occupancy at the end of each bucket; at most `max_points` buckets: when full, the bucket width
  doubles and neighbours merge, so a 12-hour run keeps its whole shape.
- `Kinds`: counts by kind (errors, chain-break reasons) with the last few examples of each; at
  most `max_kinds` kinds, the rest counted under `other`.
- `Stat`: count, sum, min, max of a value (rewards per task, seconds per stage).
- `kind_of(text)`: a message with its numbers, quoted parts, session ids, paths and hex ids
  replaced, so the same failure in many sessions groups as one kind.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from typing import Any

_PATTERNS = [
    (re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:,.]+\s*"), ""),  # a log line's timestamp
    (re.compile(r"[\w.:-]+#\d+\.\d+"), "<session>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),
    (re.compile(r"(?:/[\w.@+-]+)+/?"), "<path>"),
    (re.compile(r"\b[0-9a-f]{8,}\b"), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
]


def kind_of(text: str, width: int = 120) -> str:
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text.strip()[:width]


class Stat:
    __slots__ = ("n", "total", "low", "high")

    def __init__(self) -> None:
        self.n, self.total, self.low, self.high = 0, 0.0, float("inf"), float("-inf")

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x
        self.low, self.high = min(self.low, x), max(self.high, x)

    def view(self) -> dict[str, Any]:
        if not self.n:
            return {"n": 0, "mean": None, "min": None, "max": None}
        return {"n": self.n, "mean": self.total / self.n, "min": self.low, "max": self.high}


class Kinds:
    def __init__(self, max_kinds: int = 200, examples: int = 5) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, deque[str]] = {}
        self.max_kinds = max_kinds
        self.keep = examples
        self.other = 0

    def add(self, kind: str, example: str) -> None:
        if kind not in self.counts and len(self.counts) >= self.max_kinds:
            self.other += 1
            return
        self.counts[kind] += 1
        self.examples.setdefault(kind, deque(maxlen=self.keep)).append(example)

    def total(self) -> int:
        return sum(self.counts.values()) + self.other

    def view(self, limit: int = 100) -> list[dict[str, Any]]:
        return [{"kind": k, "count": n, "examples": list(self.examples[k])} for k, n in self.counts.most_common(limit)]


class Series:
    FIELDS = ("ended", "completed", "tokens", "trainable", "reward_sum", "rewarded", "calls")

    def __init__(self, width_s: float = 5.0, max_points: int = 600) -> None:
        self.width = width_s
        self.max_points = max_points
        self.buckets: dict[int, dict[str, Any]] = {}

    def _bucket(self, t: float) -> dict[str, Any]:
        b = int(t // self.width)
        if b not in self.buckets:
            self.buckets[b] = dict.fromkeys(self.FIELDS, 0)
            if len(self.buckets) > self.max_points:
                self._coarsen()
                return self._bucket(t)
        return self.buckets[b]

    def add(self, t: float, **values: float) -> None:
        bucket = self._bucket(t)
        for k, v in values.items():
            bucket[k] += v

    def stages(self, t: float, occupancy: dict[str, int]) -> None:
        self._bucket(t)["stages"] = dict(occupancy)

    def _coarsen(self) -> None:
        self.width *= 2
        merged: dict[int, dict[str, Any]] = {}
        for b in sorted(self.buckets):
            into = merged.setdefault(b // 2, dict.fromkeys(self.FIELDS, 0))
            for k, v in self.buckets[b].items():
                into[k] = v if k == "stages" else into[k] + v
        self.buckets = merged

    def view(self) -> dict[str, Any]:
        """{"width_s", "points": [{"t", fields…, "stages"}]} in time order; a bucket without a
        stage change carries the occupancy of the one before."""
        points: list[dict[str, Any]] = []
        stages: dict[str, int] = {}
        for b in sorted(self.buckets):
            stages = self.buckets[b].get("stages", stages)
            points.append({"t": b * self.width, **{k: self.buckets[b][k] for k in self.FIELDS}, "stages": stages})
        return {"width_s": self.width, "points": points}
