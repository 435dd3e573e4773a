"""The proxy process: one asyncio loop serving harnesses over HTTP, linked to its gateway by ZeroMQ.

`serve(ProxyOptions)` blocks until the gateway sends Shutdown, stays silent for `peer_timeout_s`,
or the process gets SIGTERM/SIGINT; it then cancels in-flight calls, closes the HTTP server and
returns.

- Once listening it writes `{"url": "http://HOST:PORT"}` to `ready_file` (tmp + os.replace).
- Gateway link: a DEALER connected to the gateway's ROUTER. It sends ProxyHello first, Heartbeat
  every `heartbeat_s`, one CallRecord per answered call and SessionClosed after CloseSession, all
  through one FIFO queue: every record of a session leaves before its SessionClosed.
- Sessions: OpenSession makes calls bearing `Authorization: Bearer <token>` belong to a session.
  Engines (the live engine URLs) moves calls to the first URL listed when the current engine is
  not among them (routing over several engines is the proxy's to grow). CloseSession revokes the token (later calls get 401), cancels the session's in-flight calls
  (engine requests aborted, no record sent, the harness gets 401), then answers
  SessionClosed(n_calls = records sent). Records of a session are numbered from 0 as sent.
- HTTP: POST /v1/chat/completions (adapted by `openai_chat`), GET /v1/models (no key needed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from aiohttp import web

from polar_hpc import wire
from polar_hpc.proxy import openai_chat as oc
from polar_hpc.proxy.engine_client import EngineClient, EngineError

log = logging.getLogger("polar_hpc.proxy")

_GATEWAY = "gateway"
_MAX_BODY = 256 << 20


@dataclass(frozen=True)
class ProxyOptions:
    gateway: str  # zmq endpoint of the gateway's ROUTER, e.g. ipc:///tmp/gw.ipc
    engine_url: str  # base URL of the engine, before /v1
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    ready_file: Path | None = None
    model: str = "polar-scripted"  # served model name, sent to the engine on every call
    proxy_id: str = "proxy"
    heartbeat_s: float = 1.0
    peer_timeout_s: float = 10.0


def serve(opts: ProxyOptions) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s proxy %(levelname)s %(message)s")
    asyncio.run(_run(opts))


@dataclass(eq=False)
class _Session:
    session_id: str
    token: str
    n_calls: int = 0
    open: bool = True
    calls: set[asyncio.Task] = field(default_factory=set)


class _GatewayLink:
    """The DEALER to the gateway; messages leave in the order `send` was called."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, peer_timeout_s: float) -> None:
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 500)
        self._sock.connect(endpoint)
        self._outbox: asyncio.Queue[wire.Message | None] = asyncio.Queue()
        self.liveness = wire.Liveness(peer_timeout_s)
        self.liveness.heard(_GATEWAY)

    def send(self, message: wire.Message) -> None:
        self._outbox.put_nowait(message)

    async def pump(self) -> None:
        """Send queued messages until `close` queues the end marker."""
        while (message := await self._outbox.get()) is not None:
            await self._sock.send(wire.encode(message))

    async def recv(self) -> wire.AnyMessage:
        while True:
            data = await self._sock.recv()
            self.liveness.heard(_GATEWAY)
            try:
                return wire.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.warning("ignoring undecodable message from gateway: %s", e)

    async def close(self, pump: asyncio.Task) -> None:
        """Flush what is queued (briefly), then close the socket."""
        self._outbox.put_nowait(None)
        await asyncio.wait([pump], timeout=1.0)
        pump.cancel()
        self._sock.close()


class _Proxy:
    def __init__(self, opts: ProxyOptions, engine: EngineClient, link: _GatewayLink) -> None:
        self.opts = opts
        self.engine = engine
        self.link = link
        self._sessions: dict[str, _Session] = {}
        self._by_token: dict[str, _Session] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app

    # --- gateway side ---------------------------------------------------------------------------

    async def gateway_loop(self) -> None:
        """Handle gateway messages; returns on Shutdown."""
        while True:
            message = await self.link.recv()
            if isinstance(message, wire.OpenSession):
                self._open(message.session_id, message.token)
                self.link.send(wire.SessionOpened(session_id=message.session_id))
            elif isinstance(message, wire.CloseSession):
                await self._close(message.session_id)
            elif isinstance(message, wire.Engines):
                self._engines(message.urls)
            elif isinstance(message, wire.Shutdown):
                log.info("gateway asked to shut down: %s", message.reason)
                return

    def _engines(self, urls: list[str]) -> None:
        """Engine membership changed: keep the current engine while it is up, else take the first."""
        urls = [u.rstrip("/") for u in urls]
        if urls and self.engine.base_url not in urls:
            log.info("engine %s is gone; now using %s", self.engine.base_url, urls[0])
            self.engine.base_url = urls[0]

    async def heartbeat_loop(self) -> None:
        """Heartbeat the gateway; returns once it has been silent for peer_timeout_s."""
        while not self.link.liveness.lost():
            self.link.send(wire.Heartbeat(sender=self.opts.proxy_id, t=time.time()))
            await asyncio.sleep(self.opts.heartbeat_s)
        log.warning("gateway silent for over %ss", self.opts.peer_timeout_s)

    def _open(self, session_id: str, token: str) -> None:
        """A repeated OpenSession rebinds the session to the new token, keeping its calls."""
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(session_id, token)
        else:
            self._by_token.pop(session.token, None)
            session.token = token
        self._by_token[token] = session

    async def _close(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            self.link.send(wire.SessionClosed(session_id=session_id, n_calls=0))
            return
        session.open = False
        self._by_token.pop(session.token, None)
        calls = set(session.calls)
        for call in calls:
            call.cancel()
        if calls:
            await asyncio.wait(calls)
        self.link.send(wire.SessionClosed(session_id=session_id, n_calls=session.n_calls))

    def cancel_calls(self) -> None:
        for session in self._sessions.values():
            for call in session.calls:
                call.cancel()

    # --- harness side ---------------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> _Session | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self._by_token.get(token.strip())

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.opts.model, "object": "model", "created": 0, "owned_by": "polar-hpc"}
        return _json(200, {"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.Response:
        raw = await request.read()
        session = self._authenticate(request)
        if session is None:
            return _unauthorized()
        try:
            body = oc.parse_request(raw)
        except oc.BadRequest as e:
            return _json(400, oc.error_body(str(e), param=e.param))
        call = asyncio.ensure_future(self._chat_call(session, body))
        session.calls.add(call)
        call.add_done_callback(session.calls.discard)
        try:
            await asyncio.wait([call])
        except asyncio.CancelledError:
            call.cancel()
            raise
        if call.cancelled():
            if not session.open:
                return _unauthorized()
            return _json(503, oc.error_body("proxy is shutting down", type="server_error"))
        try:
            response = call.result()
        except EngineError as e:
            kind = "invalid_request_error" if e.status == 400 else "upstream_error"
            return _json(e.status, oc.error_body(e.message, type=kind))
        if body.get("stream"):
            return web.Response(
                body=oc.sse_events(response, body),
                content_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return _json(200, response)

    async def _chat_call(self, session: _Session, request: dict[str, Any]) -> dict[str, Any]:
        """Ask the engine, record the call, and return what the harness is to be sent."""
        t_start = time.time()
        body = oc.engine_request(request, self.opts.model)
        answer = await self.engine.post_json(oc.ENGINE_PATH, body)
        got = oc.capture(answer)
        response = oc.harness_response(answer, request)
        self.link.send(
            wire.CallRecord(
                session_id=session.session_id,
                call_index=session.n_calls,
                api=oc.API,
                request=request,
                response=response,
                prompt_ids=got.prompt_ids,
                output_ids=got.output_ids,
                output_logprobs=got.output_logprobs,
                finish_reason=got.finish_reason,
                weight_version=got.weight_version,
                engine_url=self.engine.base_url,
                stream=bool(request.get("stream")),
                t_start=t_start,
                t_end=time.time(),
            )
        )
        session.n_calls += 1
        return response


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        status=status, body=msgspec.json.encode(body), content_type="application/json"
    )


def _unauthorized() -> web.Response:
    message = "Incorrect API key provided: unknown or closed session."
    return _json(401, oc.error_body(message, code="invalid_api_key"))


def _write_ready(path: Path, url: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"url": url}))
    os.replace(tmp, path)


async def _run(opts: ProxyOptions) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ctx = zmq.asyncio.Context()
    link = _GatewayLink(ctx, opts.gateway, opts.peer_timeout_s)
    engine = EngineClient(opts.engine_url)
    proxy = _Proxy(opts, engine, link)
    runner = web.AppRunner(proxy.app(), access_log=None, shutdown_timeout=5)
    await runner.setup()
    await web.TCPSite(runner, opts.host, opts.port).start()
    url = f"http://{opts.host}:{runner.addresses[0][1]}"
    link.send(wire.ProxyHello(proxy_id=opts.proxy_id, url=url))
    pump = asyncio.create_task(link.pump())
    tasks = [
        asyncio.create_task(proxy.gateway_loop()),
        asyncio.create_task(proxy.heartbeat_loop()),
        pump,
    ]
    for task in tasks:
        task.add_done_callback(lambda t: _stop_on_end(t, stop))
    if opts.ready_file is not None:
        _write_ready(Path(opts.ready_file), url)
    log.info("serving %s (gateway %s, engine %s)", url, opts.gateway, opts.engine_url)
    try:
        await stop.wait()
    finally:
        proxy.cancel_calls()
        await runner.cleanup()
        for task in tasks[:2]:
            task.cancel()
        await asyncio.gather(*tasks[:2], return_exceptions=True)
        await link.close(pump)
        await engine.close()
        ctx.term()
        log.info("stopped")


def _stop_on_end(task: asyncio.Task, stop: asyncio.Event) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_coro().__qualname__, exc_info=task.exception())
    stop.set()
