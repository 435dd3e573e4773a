"""Engine idle time, from the orchestrator's lines of `<run>/metrics.jsonl` (observe.live writes them).

`engine_idle(run_dir, interval_s)` reads every line `{"t", "source": "orchestrator", "engines": {URL:
{"up", "running", "waiting"}}}` in order and returns `EngineIdle`: `idle_s`, the engine-seconds in
which an engine that answered had no request running or waiting (each line counts for each idle
engine until the next line, at most `2 * interval_s`: a longer gap, the orchestrator stopped or the
job between two lives, counts nothing), `busy_s` the same for engines with work, and `most_up`, the
most engines up in one line. The read goes through no link and stops after `MAX_BYTES` (both `partial`);
a line that is not such an object (another writer's, one cut short by a crash) is skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_hpc import nofollow

METRICS = "metrics.jsonl"
MAX_BYTES = 256 << 20


@dataclass
class EngineIdle:
    idle_s: float = 0.0
    busy_s: float = 0.0
    most_up: int = 0
    partial: bool = False


def engine_idle(run_dir: Path, interval_s: float) -> EngineIdle:
    found = EngineIdle()
    previous: tuple[float, dict[str, Any]] | None = None
    read = 0
    try:
        with nofollow.fopen(Path(run_dir) / METRICS, "rb") as f:
            for line in f:
                read += len(line)
                if read > MAX_BYTES:
                    found.partial = True
                    break
                current = _orchestrator_line(line)
                if current is None:
                    continue
                found.most_up = max(found.most_up, len(_up(current[1])))
                if previous is not None:
                    _count(found, previous, current[0] - previous[0], 2 * interval_s)
                previous = current
    except FileNotFoundError:
        pass
    except OSError:  # a link, a folder: not read
        found.partial = True
    return found


def _orchestrator_line(line: bytes) -> tuple[float, dict[str, Any]] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("source") != "orchestrator":
        return None
    t, engines = event.get("t"), event.get("engines")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not isinstance(engines, dict):
        return None
    return float(t), engines


def _count(found: EngineIdle, previous: tuple[float, dict[str, Any]], dt: float, longest: float) -> None:
    if not 0 < dt <= longest:
        return
    for engine in _up(previous[1]):
        work = engine.get("running", 0) + engine.get("waiting", 0) if _numbers(engine) else None
        if work == 0:
            found.idle_s += dt
        elif work is not None:
            found.busy_s += dt


def _up(engines: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in engines.values() if isinstance(e, dict) and e.get("up") == 1]


def _numbers(engine: dict[str, Any]) -> bool:
    return all(isinstance(engine.get(k, 0), (int, float)) and not isinstance(engine.get(k, 0), bool)
               for k in ("running", "waiting"))
