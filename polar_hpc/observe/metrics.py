"""A run's figures as Prometheus text (`prometheus_text`) and as the metrics log (`MetricsLog`).

Metric names start with `polar_`; every figure is a gauge or counter computed from the run
directory by `RunReader` (see its docstring), labelled by status, stage, task or weight version.
`MetricsLog(run_dir).append(overview)` adds one JSON line `{"t", figures…}` to
`<run>/metrics.jsonl`, when the run dir is writable (a dashboard opened on someone else's run
writes nothing); so a finished run can still be plotted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from polar_hpc import nofollow
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LOGGED = ("state", "total", "done", "left", "by_status", "sessions_per_s", "eta_s", "stages", "trajectories",
           "tokens", "trainable_tokens", "calls", "tokens_per_s", "requeues", "chain_breaks", "weight_versions",
           "errors_total")


class _Snapshot:
    def __init__(self, overview: dict[str, Any]) -> None:
        self.o = overview

    def collect(self):  # noqa: ANN201 (prometheus_client's collector protocol)
        o = self.o
        yield _gauge("polar_sessions_total", "Sessions the run asks for", o["total"])
        ended = CounterMetricFamily("polar_sessions_ended", "Sessions ended, by status", labels=["status"])
        for status, n in o["by_status"].items():
            ended.add_metric([status], n)
        yield ended
        stages = GaugeMetricFamily("polar_sessions_in_stage", "Sessions now in each stage", labels=["stage"])
        for stage, n in o["stages"].items():
            stages.add_metric([stage], n)
        yield stages
        yield _gauge("polar_sessions_per_second", "Sessions ended per second (last 5 minutes)", o["sessions_per_s"])
        yield _gauge("polar_eta_seconds", "Estimated seconds until every session has ended", o["eta_s"] or 0.0)
        yield CounterMetricFamily("polar_tokens_captured", "Tokens in accepted trajectories", value=o["tokens"])
        yield CounterMetricFamily("polar_trainable_tokens", "Tokens with loss mask 1", value=o["trainable_tokens"])
        yield CounterMetricFamily("polar_calls", "Model calls in accepted trajectories", value=o["calls"])
        yield CounterMetricFamily("polar_chain_breaks", "Calls that did not extend their chain", value=o["chain_breaks"])
        yield CounterMetricFamily("polar_requeues", "Sessions re-run after their gateway was lost", value=o["requeues"])
        yield CounterMetricFamily("polar_errors", "Errors seen (sessions, logs, journal)", value=o["errors_total"])
        reward = GaugeMetricFamily("polar_task_reward_mean", "Mean reward of a task's trajectories", labels=["task"])
        for task in o["tasks"]:
            if task["reward"]["mean"] is not None:
                reward.add_metric([task["task_id"]], task["reward"]["mean"])
        yield reward
        versions = CounterMetricFamily("polar_weight_version_calls", "Calls by policy weight version", labels=["version"])
        for version, n in o["weight_versions"].items():
            versions.add_metric([version], n)
        yield versions
        up = GaugeMetricFamily("polar_gateway_up", "1 while a gateway is up (journal)", labels=["gateway"])
        for gw in o["gateways"]:
            up.add_metric([str(gw["name"])], 1.0 if gw.get("up") else 0.0)
        yield up


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def prometheus_text(overview: dict[str, Any]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(overview))
    return generate_latest(registry)


class MetricsLog:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.writable = os.access(run_dir, os.W_OK) and (not self.path.exists() or os.access(self.path, os.W_OK))

    def append(self, overview: dict[str, Any]) -> bool:
        if not self.writable:
            return False
        line = json.dumps({"t": round(time.time(), 3), **{k: overview[k] for k in _LOGGED}})
        try:
            with nofollow.fopen(self.path, "a") as f:  # a planted link or FIFO is never written through
                f.write(line + "\n")
        except OSError:
            return False
        return True
