"""`polar-hpc dashboard RUN_DIR`: a web page of a run, live or finished, read from its run dir.

One aiohttp server (loopback by default). The page (`assets/`: plain HTML, JS and CSS, shipped in
the package) calls JSON APIs; every API and `/metrics` needs the access token printed at start, as
`Authorization: Bearer TOKEN` or `?token=TOKEN` (the page URL carries it), compared in constant
time. APIs: `/api/overview` (progress, ETA, figures, gateways, processes), `/api/series` (plots;
`live`: `observe.livelog`'s points of call latency and engine queues), `/api/errors` (kinds with
their lines), `/api/trajectories` (browser rows: `task`, `status`, `min_reward`, `max_reward`,
`offset`, `limit` <= 500), `/api/trajectory/{id}` (an id from those rows: the server reads the
record at the place it found it; no request names a path), and `/metrics` (Prometheus text). A
background task polls the run dir every `poll_s` and, when the run dir is writable, appends a
snapshot to `<run>/metrics.jsonl` every `log_every_s`.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from polar_hpc.config import ConfigError
from polar_hpc.observe import metrics, tokens
from polar_hpc.observe.run import RunReader

ASSETS = Path(__file__).resolve().parent / "assets"
_FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
          "/style.css": ("style.css", "text/css")}


@dataclass
class DashboardOptions:
    run_dir: Path
    host: str = "127.0.0.1"
    port: int = 8265
    token: str | None = None  # default: a fresh random one
    poll_s: float = 2.0
    log_every_s: float = 15.0


class Dashboard:
    def __init__(self, opts: DashboardOptions) -> None:
        if not (opts.run_dir / "journal").is_dir() and not (opts.run_dir / "shards").is_dir():
            raise ConfigError(f"{opts.run_dir}: not a run directory (no journal/ or shards/ folder)")
        self.opts = opts
        self.token = opts.token or secrets.token_urlsafe(24)
        self.reader = RunReader(opts.run_dir)
        self.lock = threading.Lock()
        self.log = metrics.MetricsLog(opts.run_dir)
        self.tokenizer = tokens.run_tokenizer(opts.run_dir)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        for route in _FILES:
            app.router.add_get(route, self._asset)
        app.router.add_get("/api/overview", self._json(lambda r: self.reader.overview()))
        app.router.add_get("/api/series", self._json(lambda r: {**self.reader.series.view(),
                                                                "live": self.reader.live.points}))
        app.router.add_get("/api/errors", self._json(self._errors))
        app.router.add_get("/api/trajectories", self._json(self._trajectories))
        app.router.add_get("/api/trajectory/{id}", self._json(self._trajectory))
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(self._start)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if request.path in _FILES:
            return await handler(request)
        if not authorized(request, self.token):
            return web.json_response({"error": "missing or wrong access token"}, status=401)
        return await handler(request)

    async def _asset(self, request: web.Request) -> web.Response:
        name, kind = _FILES[request.path]
        return web.Response(body=(ASSETS / name).read_bytes(), content_type=kind,
                            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    def _json(self, fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            def locked() -> Any:
                with self.lock:
                    return fn(request)
            try:
                body = await asyncio.to_thread(locked)
            except ValueError as e:
                return web.json_response({"error": str(e)}, status=400)
            if body is None:
                return web.json_response({"error": "not found"}, status=404)
            return web.json_response(body)
        return handle

    def _errors(self, request: web.Request) -> dict[str, Any]:
        return {"errors": self.reader.errors.view(), "other": self.reader.errors.other,
                "chain_breaks": self.reader.shards.chain_breaks.view(20)}

    def _trajectories(self, request: web.Request) -> dict[str, Any]:
        q = request.query
        return self.reader.shards.query(
            task=q.get("task") or None, status=q.get("status") or None,
            min_reward=_number(q, "min_reward", float), max_reward=_number(q, "max_reward", float),
            offset=_number(q, "offset", int) or 0, limit=min(500, _number(q, "limit", int) or 100),
        )

    def _trajectory(self, request: web.Request) -> dict[str, Any] | None:
        raw = request.match_info["id"]
        if not raw.isdigit() or len(raw) > 12:
            raise ValueError(f"trajectory id {raw[:40]!r}: expected a row id from /api/trajectories")
        traj = self.reader.shards.trajectory(int(raw))
        return None if traj is None else tokens.view(traj, self.tokenizer)

    async def _metrics(self, request: web.Request) -> web.Response:
        with self.lock:
            overview = self.reader.overview()
        return web.Response(body=metrics.prometheus_text(overview), headers={"Content-Type": metrics.CONTENT_TYPE})

    async def _start(self, app: web.Application) -> None:
        app["poller"] = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        logged = 0.0
        while True:
            def step() -> None:
                nonlocal logged
                with self.lock:
                    self.reader.poll()
                    if time.monotonic() - logged >= self.opts.log_every_s:
                        logged = time.monotonic()
                        self.log.append(self.reader.overview())
            await asyncio.to_thread(step)
            await asyncio.sleep(self.opts.poll_s)


def authorized(request: web.Request, token: str) -> bool:
    """The request bears `token` (`Authorization: Bearer` or `?token=`), compared in constant time."""
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.startswith("Bearer ") else request.query.get("token", "")
    return hmac.compare_digest(given.encode(), token.encode())


def _number(query: Any, name: str, kind: type) -> Any:
    text = query.get(name)
    if text in (None, ""):
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name}={text[:40]!r}: not a number") from None
    if value != value or (kind is int and value < 0):  # NaN, negative offsets
        raise ValueError(f"{name}={text[:40]!r}: out of range")
    return value


def serve(opts: DashboardOptions) -> int:
    """Serve until interrupted; prints the page's URL (with the token) once listening."""
    dash = Dashboard(opts)
    dash.reader.poll()

    async def main() -> None:
        runner = web.AppRunner(dash.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, opts.host, opts.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://{opts.host}:{port}"
        print(f"dashboard of {opts.run_dir}\nopen {base}/?token={dash.token}\n"
              f"Prometheus: {base}/metrics (Authorization: Bearer {dash.token})"
              + ("" if dash.log.writable else "\nrun dir not writable: no metrics.jsonl"), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0
