"""The orchestrator's metrics (`Live`): every process's counters, served and logged while the run goes.

Gateways send their own snapshot and forward their proxy's (`wire.Metrics`, see
`polar_hpc.metrics`); `take(identity, msg)` keeps the newest of each (sender, process) once
`metrics.check` passes it (at most `MAX_PROCESSES`), and says why it dropped one otherwise. The
orchestrator's own figures are read from its session table when asked (`status()`: sessions by
state, in all, per second, ETA, mean reward, tokens, gateways), and the engines' every
`interval_s` from each engine's own `/metrics` (GET with the run's engine API key, 2 s, at most
1 MiB): requests running and waiting and the prefix-cache hit rate (`engines.gauges`, SGLang's or
vLLM's names), with the weight version the registry knows and whether the engine answered.

`start()` serves `/metrics` (Prometheus text; each peer sample labelled with its `process`) on
`metrics.host` (loopback by default) and returns `{"metrics_url", "metrics_token"}` for
rendezvous.json (0600); every request needs that token, as `Authorization: Bearer TOKEN` or
`?token=TOKEN`. Every `interval_s`, and once more at `stop()`, one JSON line `{"t", "source":
"orchestrator", "run", "engines", "processes"}` is appended to `<run>/metrics.jsonl` (histogram
buckets left out: `_sum` / `_count` give the mean per interval), so a finished run can be plotted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from polar_hpc import metrics, nofollow, wire
from polar_hpc.config import MetricsConfig
from polar_hpc.engines import gauges
from polar_hpc.observe.server import authorized

log = logging.getLogger("polar_hpc.orchestrator")

MAX_PROCESSES = 4096
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Live:
    def __init__(self, run_dir: Path, config: MetricsConfig, status: Callable[[], wire.StatusReply],
                 engines: Callable[[], wire.Engines], engine_key: str | None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.config, self.status, self.engines, self.engine_key = config, status, engines, engine_key
        self.token = secrets.token_urlsafe(24)
        self.snapshots: dict[tuple[bytes, str], wire.Metrics] = {}
        self.engine_figures: dict[str, dict[str, float]] = {}
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task | None = None

    def take(self, identity: bytes, msg: wire.Metrics) -> str | None:
        why = metrics.check(msg, ("gateway", "proxy"))
        key = (identity, msg.process)
        if why is None and key not in self.snapshots and len(self.snapshots) >= MAX_PROCESSES:
            why = f"already {MAX_PROCESSES} processes reporting"
        if why is None:
            self.snapshots[key] = msg
        return why

    # --- serving --------------------------------------------------------------------------------

    async def start(self) -> dict[str, str]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self._task = asyncio.create_task(self._loop())
        return {"metrics_url": f"http://{self.config.host}:{port}/metrics", "metrics_token": self.token}

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._append()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        if not authorized(request, self.token):
            return web.json_response({"error": "missing or wrong access token"}, status=401)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE})

    async def _loop(self) -> None:
        while True:
            listing = self.engines()
            self.engine_figures = await asyncio.to_thread(self._poll_engines, listing)
            try:
                self._append()
            except OSError as e:
                log.warning("cannot append to %s: %s", self.path, e)
            await asyncio.sleep(self.config.interval_s)

    # --- engines --------------------------------------------------------------------------------

    def _poll_engines(self, listing: wire.Engines) -> dict[str, dict[str, float]]:
        figures = {}
        for url in sorted({*listing.urls, *listing.versions})[:256]:  # those given by URL have a version only
            f: dict[str, float] = {"up": 0.0}
            version = wire.version_number(listing.versions.get(url, ""))
            if version is not None:
                f["weight_version"] = float(version)
            try:
                f |= engine_figures(self._get(url.rstrip("/") + "/metrics"))
                f["up"] = 1.0
            except (OSError, ValueError) as e:
                log.debug("engine %s: no metrics: %s", url, e)
            figures[url] = f
        return figures

    def _get(self, url: str) -> str:
        headers = {"Authorization": f"Bearer {self.engine_key}"} if self.engine_key else {}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return r.read(gauges.MAX_BYTES).decode(errors="replace")

    # --- the log --------------------------------------------------------------------------------

    def _append(self) -> None:
        s = self.status()
        run = {"states": s.states, "total": s.total, "done": s.done, "sessions_per_s": s.sessions_per_s,
               "mean_reward": s.mean_reward, "tokens": s.tokens, "gateways": s.gateways}
        processes = {m.process: {_key(x): x.value for x in m.samples if not x.name.endswith("_bucket")}
                     for m in self.snapshots.values()}
        line = {"t": round(time.time(), 3), "source": "orchestrator", "run": run,
                "engines": self.engine_figures, "processes": processes}
        try:
            with nofollow.fopen(self.path, "a") as f:  # a planted link or FIFO is never written through
                f.write(json.dumps(line) + "\n")
        except OSError as e:
            log.warning("metrics.jsonl not written: %s", e)


def engine_figures(text: str) -> dict[str, float]:
    """Requests running and waiting, and the prefix-cache hit rate, from an engine's Prometheus text."""
    read = gauges.read(text)
    figures = {k: read[k] for k in ("running", "waiting") if k in read}
    rate = gauges.hit_rate(read)
    return figures if rate is None else figures | {"cache_hit_rate": rate}


def _key(sample: wire.MetricSample) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}}" if labels else sample.name


class _Collector:
    def __init__(self, live: Live) -> None:
        self.live = live

    def collect(self):  # noqa: ANN201 (prometheus_client's collector protocol)
        s = self.live.status()
        states = GaugeMetricFamily("polar_run_sessions", "Sessions by state (the orchestrator's table)",
                                   labels=["state"])
        for state, n in sorted(s.states.items()):
            states.add_metric([state], n)
        yield states
        for name, doc, value in (
            ("polar_run_sessions_total", "Sessions the run has", s.total),
            ("polar_run_sessions_per_second", "Sessions ended per second (last minute)", s.sessions_per_s),
            ("polar_run_eta_seconds", "Estimated seconds until every session has ended", s.eta_s or 0.0),
            ("polar_run_mean_reward", "Mean reward of the sessions ended", s.mean_reward or 0.0),
            ("polar_run_tokens", "Tokens in the trajectories of the sessions ended", s.tokens),
            ("polar_run_gateways", "Gateways connected", s.gateways),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        yield from self._engines()
        yield from self._peers()

    def _engines(self):  # noqa: ANN202
        docs = {"up": "1 while the engine answers its /metrics", "running": "Requests the engine runs now",
                "waiting": "Requests queued in the engine", "weight_version": "The engine's weight version",
                "cache_hit_rate": "Prompt tokens the engine's prefix cache held, over all prompt tokens"}
        for figure, doc in docs.items():
            family = GaugeMetricFamily(f"polar_engine_{figure}", doc, labels=["engine"])
            for url, f in sorted(self.live.engine_figures.items()):
                if figure in f:
                    family.add_metric([url], f[figure])
            yield family

    def _peers(self):  # noqa: ANN202
        families: dict[str, Metric] = {}
        for snap in self.live.snapshots.values():
            for x in snap.samples:
                name = metrics.family_of(x.name)
                assert name is not None  # checked when taken
                if name not in families:
                    kind, doc, _ = metrics.CATALOG[name]
                    families[name] = Metric(name, doc, kind)
                families[name].add_sample(x.name, {**x.labels, "process": snap.process}, x.value)
        yield from families.values()
