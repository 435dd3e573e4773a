"""Per-process counters (`prometheus_client`) and the snapshots processes send the orchestrator.

`CATALOG` names every family a process may report: its type, help and label names. A family's
name says which role keeps it (`polar_proxy_*`, `polar_gateway_*`); the orchestrator's own
figures and the engines' are in `observe.live`. `Meter(role, process)` holds the families of one
role in its own registry; `snapshot()` is them as one `wire.Metrics`. The proxy's meter
(`ProxyMeter`) counts calls by API and capture mode, tokens captured (prompt, sampled), errors by
kind and chain breaks, new sessions by how the router placed them and each engine's requests and
prefix-cache hit rate as the router last read them (`engines(placed, readings)`, before each
snapshot), and times each call: `start_call()` opens a per-call clock (a context variable, so it
follows the call's task), `engine_time(t0)` adds the time since `t0` spent waiting
on an engine (every attempt), and `call_timings(meta, t_start, t_end)` writes `engine_ms` and
`proxy_ms` (the call's time less the engine's) into the CallRecord's meta, metrics on or off. The
gateway's (`GatewayMeter`) watches the messages it sends the orchestrator: sessions by stage and
ended by status, INIT (sandbox start and prepare) seconds, failures by status. A process sends a
snapshot every `every_s`, and when a session ends (the proxy's on closing it, the gateway's before
its Result), at most one per MIN_GAP_S: one that would come sooner goes at the next heartbeat; so
the orchestrator's figures trail a run's last sessions by at most a heartbeat.

Metrics are on unless the topology says `metrics.enabled: false`; the gateway tells its proxy in
its launch (`wire.ProxyLaunch.metrics_s`, the snapshot interval in seconds, 0: off), so a proxy
with metrics off does no counting at all. `check(msg, roles)` is the orchestrator's test of a received
snapshot: only known families of the role it names (one of `roles`), known labels, bounded counts and lengths,
finite values; it returns why a snapshot is refused, or None.
"""

from __future__ import annotations

import contextvars
import math
import re
import time
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from polar_hpc import wire

prometheus_client.disable_created_metrics()

MAX_SAMPLES = 2000  # in one snapshot: a proxy's or gateway's families need under 200
MAX_LABEL = 128  # characters of a label value
MIN_GAP_S = 0.25  # between two snapshots of one process: at most 4 a second, however fast sessions end
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# family -> (type, help, label names)
CATALOG: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "polar_proxy_calls": ("counter", "Model calls answered, by API and capture mode", ("api", "mode")),
    "polar_proxy_call_seconds": ("histogram", "Seconds from a call's parsed body to its answer", ()),
    "polar_proxy_engine_seconds": ("histogram", "Seconds of a call spent waiting on engines", ()),
    "polar_proxy_added_seconds": ("histogram", "Seconds of a call the proxy added (call less engine)", ()),
    "polar_proxy_tokens": ("counter", "Tokens captured, by kind (prompt, sampled)", ("kind",)),
    "polar_proxy_errors": ("counter", "Calls answered with an error, by kind", ("kind",)),
    "polar_proxy_chain_breaks": ("counter", "Calls that did not extend their session's chain", ()),
    "polar_proxy_sessions_placed": ("counter", "New sessions placed on an engine, by how (group, group_busy, "
                                    "least_loaded)", ("how",)),
    "polar_proxy_engine_requests": ("gauge", "Requests running and queued in each engine, as its /metrics "
                                    "last said", ("engine",)),
    "polar_proxy_engine_cache_hit_rate": ("gauge", "Each engine's prefix-cache hit rate (cached prompt tokens "
                                          "over prompt tokens), as its /metrics last said", ("engine",)),
    "polar_gateway_sessions_in_stage": ("gauge", "Sessions now in each pipeline stage", ("stage",)),
    "polar_gateway_sessions_ended": ("counter", "Sessions ended, by status", ("status",)),
    "polar_gateway_sandbox_start_seconds": ("histogram", "Seconds in INIT (sandbox start and prepare)", ()),
    "polar_gateway_errors": ("counter", "Sessions that did not complete, by status", ("kind",)),
}
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
_NAME = re.compile(r"polar_[a-z_]{1,80}")
_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


class Meter:
    def __init__(self, role: str, process: str, every_s: float) -> None:
        self.role, self.process, self.every_s = role, process, every_s
        self.registry = CollectorRegistry(auto_describe=False)
        self.f: dict[str, Any] = {}
        for name, (kind, doc, labels) in CATALOG.items():
            if name.startswith(f"polar_{role}_"):
                extra = {"buckets": _SECONDS} if kind == "histogram" else {}
                self.f[name] = _KINDS[kind](name, doc, labels, registry=self.registry, **extra)
        self._sent = 0.0  # monotonic time of the last snapshot
        self._ended = False  # a session ended since

    def due(self) -> bool:
        """Called every heartbeat: True (send `snapshot()` now) every `every_s`, or when a session
        ended since the last snapshot."""
        since = time.monotonic() - self._sent
        return since >= self.every_s or (self._ended and since >= MIN_GAP_S)

    def ended(self) -> bool:
        """A session ended: True to send a snapshot now, unless one went in the last MIN_GAP_S
        (then the next heartbeat's `due()` sends it)."""
        self._ended = True
        return time.monotonic() - self._sent >= MIN_GAP_S

    def snapshot(self) -> wire.Metrics:
        self._sent, self._ended = time.monotonic(), False
        samples = [wire.MetricSample(s.name, dict(s.labels), float(s.value))
                   for family in self.registry.collect() for s in family.samples]
        return wire.Metrics(role=self.role, process=self.process, t=time.time(), samples=samples)


_CLOCK: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("polar_engine_s", default=None)


def start_call() -> None:
    _CLOCK.set([0.0])


def engine_time(t0: float) -> None:
    """Add the `time.perf_counter()` seconds since `t0` to the current call's engine time."""
    clock = _CLOCK.get()
    if clock is not None:
        clock[0] += time.perf_counter() - t0


def call_timings(meta: dict[str, Any], t_start: float, t_end: float) -> None:
    clock = _CLOCK.get()
    total_ms = (t_end - t_start) * 1000
    engine_ms = min(total_ms, clock[0] * 1000) if clock is not None else 0.0
    meta["engine_ms"] = round(engine_ms, 3)
    meta["proxy_ms"] = round(total_ms - engine_ms, 3)


class ProxyMeter(Meter):
    def __init__(self, process: str, every_s: float) -> None:
        super().__init__("proxy", process, every_s)
        f = self.f
        self._call_s, self._engine_s = f["polar_proxy_call_seconds"], f["polar_proxy_engine_seconds"]
        self._added_s, self._calls = f["polar_proxy_added_seconds"], f["polar_proxy_calls"]
        tokens = f["polar_proxy_tokens"]
        self._prompt, self._sampled = tokens.labels("prompt"), tokens.labels("sampled")
        self._by_api: dict[tuple[str, Any], Any] = {}  # (api, mode) -> its labelled counter
        self._placed: dict[str, int] = {}  # the router's counts at the last `engines`

    def call(self, api: str, record: wire.CallRecord) -> None:
        meta = record.meta
        key = (api, meta.get("mode", ""))
        calls = self._by_api.get(key)
        if calls is None:
            calls = self._by_api[key] = self._calls.labels(api, str(key[1]))
        calls.inc()
        self._call_s.observe(record.t_end - record.t_start)
        self._engine_s.observe(meta["engine_ms"] / 1000)
        self._added_s.observe(meta["proxy_ms"] / 1000)
        self._prompt.inc(len(record.prompt_ids))
        self._sampled.inc(len(record.output_ids))
        if record.call_index > 0 and "new_chain" in meta:
            self.f["polar_proxy_chain_breaks"].inc()

    def error(self, kind: str) -> None:
        self.f["polar_proxy_errors"].labels(kind).inc()

    def engines(self, placed: dict[str, int], readings: dict[str, Any]) -> None:
        """The router's count of placed sessions by how, and its last `routing.Reading` of each
        engine (engines without one are left out)."""
        counter = self.f["polar_proxy_sessions_placed"]
        for how, n in placed.items():
            counter.labels(how).inc(n - self._placed.get(how, 0))
        self._placed = dict(placed)
        requests, rate = self.f["polar_proxy_engine_requests"], self.f["polar_proxy_engine_cache_hit_rate"]
        requests.clear()
        rate.clear()
        for url, reading in readings.items():
            requests.labels(url[:MAX_LABEL]).set(reading.requests)
            if reading.hit_rate is not None:
                rate.labels(url[:MAX_LABEL]).set(reading.hit_rate)


class GatewayMeter(Meter):
    def __init__(self, process: str, every_s: float) -> None:
        super().__init__("gateway", process, every_s)
        self._stage: dict[str, tuple[str, float]] = {}  # session -> (stage, when it entered)
        for stage in ("INIT", "READY", "RUN", "POSTRUN"):
            self.f["polar_gateway_sessions_in_stage"].labels(stage).set(0)

    def sent(self, msg: wire.Message) -> bool:
        """Note a message the gateway sends the orchestrator; True when a snapshot should go first
        (a session ended, see `ended`)."""
        stages = self.f["polar_gateway_sessions_in_stage"]
        if isinstance(msg, wire.SessionUpdate):
            was = self._stage.get(msg.session_id)
            if was is not None:
                stages.labels(was[0]).dec()
                if was[0] == "INIT":
                    self.f["polar_gateway_sandbox_start_seconds"].observe(max(0.0, msg.t - was[1]))
            self._stage[msg.session_id] = (msg.state, msg.t)
            stages.labels(msg.state).inc()
        elif isinstance(msg, wire.Result):
            was = self._stage.pop(msg.session_id, None)
            if was is not None:
                stages.labels(was[0]).dec()
            self.f["polar_gateway_sessions_ended"].labels(msg.status).inc()
            if msg.status != "completed":
                self.f["polar_gateway_errors"].labels(msg.status).inc()
            return self.ended()
        return False


def check(msg: wire.Metrics, roles: tuple[str, ...]) -> str | None:
    """Why the orchestrator must drop this snapshot from a peer that may report for `roles`, or
    None to keep it."""
    role = msg.role
    if role not in roles:
        return f"this peer may not report {role[:40]!r} metrics"
    if len(msg.samples) > MAX_SAMPLES:
        return f"{len(msg.samples)} samples (at most {MAX_SAMPLES})"
    if not 0 < len(msg.process) <= MAX_LABEL:
        return "a process name of 1 to 128 characters is needed"
    for s in msg.samples:
        family = family_of(s.name)
        if family is None or not family.startswith(f"polar_{role}_"):
            return f"sample {s.name[:80]!r}: not a {role} metric"
        allowed = set(CATALOG[family][2]) | ({"le"} if s.name.endswith("_bucket") else set())
        if set(s.labels) - allowed or any(len(v) > MAX_LABEL for v in s.labels.values()):
            return f"sample {s.name}: labels {sorted(s.labels)[:5]} (expected {sorted(allowed)}, values <= 128 chars)"
        if not math.isfinite(s.value):
            return f"sample {s.name}: value {s.value} is not a number"
    return None


def family_of(sample: str) -> str | None:
    if not _NAME.fullmatch(sample):
        return None
    for name, (kind, _, _) in CATALOG.items():
        for suffix in _SUFFIXES[kind]:
            if sample == name + suffix:
                return name
    return None
