"""The orchestrator's lines of `<run>/metrics.jsonl`, as plot points (`LiveLog`).

Each line the orchestrator appended (`"source": "orchestrator"`, see `observe.live`) becomes one
point `{"t", "engine_ms", "proxy_ms", "calls", "running", "waiting"}`: the mean milliseconds a call
spent on engines and in the proxy since the line before (from the change of every proxy's `_sum`
and `_count`; None when no call ended meanwhile or a counter went back, as a restarted proxy's
does), the calls that ended meanwhile (a skipped line's calls count in the next point), and the
requests the engines ran and queued at that moment. Other lines (the dashboard's own) and malformed
ones are skipped. Reading is incremental and bounded (`Tail`: 4 MiB a poll, a line at most 1 MiB);
at most `max_points` points are kept, every other one dropped (and then every other line skipped)
each time there would be more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polar_hpc.observe.tail import Tail

_SUMS = {"call": "polar_proxy_call_seconds", "engine": "polar_proxy_engine_seconds", "added": "polar_proxy_added_seconds"}


class LiveLog:
    def __init__(self, run_dir: Path, max_points: int = 600) -> None:
        self._tail = Tail(Path(run_dir) / "metrics.jsonl", max_line=1 << 20)
        self.max_points = max_points
        self.points: list[dict[str, Any]] = []
        self._stride, self._seen = 1, 0
        self._last: dict[str, float] | None = None

    def poll(self) -> None:
        for line in self._tail.lines():
            try:
                event = json.loads(line)
                if isinstance(event, dict) and event.get("source") == "orchestrator":
                    self._add(event)
            except (ValueError, TypeError, AttributeError):
                continue

    def _add(self, event: dict[str, Any]) -> None:
        self._seen += 1
        if self._seen % self._stride:
            return
        totals = _totals(event["processes"])
        last, self._last = self._last, totals
        calls = totals["count"] - last["count"] if last else totals["count"]
        point: dict[str, Any] = {"t": float(event["t"]), "calls": max(calls, 0), "engine_ms": None, "proxy_ms": None}
        if calls > 0 and all(totals[k] >= (last or {}).get(k, 0.0) for k in totals):
            point["engine_ms"] = round((totals["engine"] - (last or {}).get("engine", 0.0)) / calls * 1000, 3)
            point["proxy_ms"] = round((totals["added"] - (last or {}).get("added", 0.0)) / calls * 1000, 3)
        engines = [e for e in event.get("engines", {}).values() if isinstance(e, dict)]
        point["running"] = sum(float(e.get("running", 0)) for e in engines)
        point["waiting"] = sum(float(e.get("waiting", 0)) for e in engines)
        self.points.append(point)
        if len(self.points) > self.max_points:
            self.points = self.points[1::2]
            self._stride *= 2


def _totals(processes: dict[str, dict[str, float]]) -> dict[str, float]:
    out = {"count": 0.0, "call": 0.0, "engine": 0.0, "added": 0.0}
    for figures in processes.values():
        out["count"] += float(figures.get("polar_proxy_call_seconds_count", 0))
        for key, name in _SUMS.items():
            out[key] += float(figures.get(f"{name}_sum", 0))
    return out
