"""The proxy process: one uvloop event loop serving harnesses over HTTP, linked to its gateway by ZMQ.

`serve(launch, ready_file)` runs with a `wire.ProxyLaunch`, the one argument of `polar-hpc proxy`
(the topology's `proxy:` settings as validated where the topology was read, the engine's and
gateway's values it needs, what its gateway gives it), logged as its first line ("launch {...}").
A launch that does not decode names the field (`wire.proxy_launch`), and a `tokenizer` that cannot
be loaded (tito mode) raises ConfigError, before it listens.
It blocks until the gateway sends Shutdown or stays silent for `peer_timeout_s`; it then cancels
in-flight calls, closes the HTTP server and returns. SIGTERM/SIGINT (Slurm signals every process
of a step at once) does not stop it while its gateway lives: the gateway drains through it (closing
sessions, collecting their records) and then sends Shutdown; it waits for that for at most
STAY_SHARE of the stop budget (`procs.stop_budget`), and no longer once no session is open or the
gateway that started it is gone.

- Start-up: the capture mode warms first (tito: the tokenizer is loaded, from `tokenizer` or the
  engine's folder, logged as "tito: tokenizer ..."), for up to `WARM_S`; only then does the proxy
  listen and say ProxyHello, and the gateway assigns no session before ProxyHello, so no harness
  call waits for the tokenizer (an engine that does not answer in time: the first call loads it).
- Garbage collection: once started, what start-up allocated is frozen (`gc.freeze`) and a young
  collection runs every `GC_YOUNG` allocations, not 700: a call's decoded JSON is thousands of
  short-lived containers, and collecting them in small steps was 8 % of the proxy's CPU.
- It listens with a backlog of `BACKLOG` connections: the sessions of a gateway may all connect
  at once (with aiohttp's 128, a burst of 256 had connections dropped and retried a second later).
- Once listening it writes `{"url": "http://HOST:PORT"}` to `ready_file` (tmp + os.replace).
- Gateway link (`gateway_link`): ProxyHello first, Heartbeat every `heartbeat_s`, one CallRecord
  per answered call (sent once the answer is written) and SessionClosed after CloseSession, in
  order.
- Engines (the live engine URLs, relayed by the gateway from the orchestrator) replaces the
  router's membership; an engine (these, or one given at start) is used only once it has proved
  it is this run's (`engines.identity.check` with the run's key, off the event loop).
- Sessions: OpenSession makes calls bearing the token as their API key belong to a session, and
  the session one of its task's group for the router (`routing.Router.join`).
  CloseSession revokes the token (later calls get 401), cancels the session's in-flight calls
  (engine requests aborted, no record sent, the harness gets 401), then answers
  SessionClosed(n_calls = records sent). Records of a session are numbered from 0 as sent.
- With `relay_socket` set, sandboxes without network hand it a listening socket of theirs
  (`relay.py`) with their session's token: the proxy serves HTTP on it, for that session alone
  (a call on it bearing another session's token gets 401), until the session closes.
- HTTP: POST /v1/chat/completions (`openai_chat`), /v1/responses (`openai_responses`),
  /v1/messages (`anthropic`), each streaming or not, errors in the API's own shape; GET /v1/models
  (no key needed). A body naming another model is answered by the run's model, or refused (404)
  with `strict_model`.
- Bounds: the API key is checked before any of the body is read (401); a body over `max_body`
  bytes gets 413. Both are answered at once; what the client still sends is then discarded (up
  to `_DRAIN` times `max_body`, for `_DRAIN_S`) so a client that writes its whole body first still
  reads the answer, and the connection is closed if more is coming. A body that is not a
  well-formed request (not UTF-8, not JSON, nested too deep, fields of the wrong type) gets 400.
  A body over `calls.BIG` is parsed, rendered and tokenized in a worker thread.
- No engine registered: a call waits up to `engine_wait_s` for one (`routing.Router`), else gets
  503 with `Retry-After`. Engine errors are logged with the session, status and message.
- Capture: `mode` tito (`tito.Tito`: the proxy renders with the model's tokenizer, from
  `tokenizer` or, once an engine answers, the engine's /get_model_info `tokenizer_path`) or passthrough
  (`passthrough.Passthrough`); engines chosen by `routing.Router`.
- A call the engine aborts (weight update in `abort` mode) gets a retryable error (`aborted`): no
  record; the session's next record carries meta["aborted_attempts"] (their count, weight versions
  and seconds from the call's start to the abort).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import uvloop
import zmq.asyncio
from aiohttp import ClientError, web

from polar_hpc import metrics, procs, wire
from polar_hpc.errors import ConfigError
from polar_hpc.engines import identity, kinds
from polar_hpc.proxy import aborted, anthropic, openai_responses, relay
from polar_hpc.proxy import openai_chat as oc
from polar_hpc.proxy.calls import BIG, BadRequest, ToolCall, assistant_message, offload, release_memory
from polar_hpc.proxy.engine_client import EngineError
from polar_hpc.proxy.gateway_link import ProxyLinkDealer
from polar_hpc.proxy.passthrough import Passthrough
from polar_hpc.proxy.routing import NO_ENGINE, Router
from polar_hpc.proxy.tito import Renderer, Tito
from polar_hpc.security import ENGINE_KEY_ENV

log = logging.getLogger("polar_hpc.proxy")

_DRAIN, _DRAIN_S = 4, 10.0  # a refused body is discarded up to 4 times max_body, for 10 s
_NO_ENGINE_HEADERS = {**aborted.RETRY_HEADERS, "Retry-After": "10"}  # an engine restarts slowly
BACKLOG = 2048  # connections the kernel queues before the proxy accepts them (uvicorn's; aiohttp's is 128)
GC_YOUNG = 50_000  # container allocations between young collections (Python's default: 700)
STAY_SHARE = 0.8  # of the stop budget: how long a signalled proxy waits for its gateway's Shutdown
WARM_S = 5.0  # how long ProxyHello waits for the tokenizer (an engine slow to answer: the first call loads it)


def serve(launch: wire.ProxyLaunch, ready_file: Path | None = None) -> None:
    """Serve until the gateway stops (`ready_file`: written with {"url": ...} once listening)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s proxy %(levelname)s %(message)s")
    log.info("launch %s", launch.argument())
    uvloop.run(_run(launch, ready_file))


_APIS = (oc, openai_responses, anthropic)


@dataclass(eq=False)
class _InFlight:
    """One harness call being answered, in the task aiohttp runs its handler in."""

    task: asyncio.Task
    sent: web.StreamResponse | None = None  # the answer, once its head is being sent
    stopped: asyncio.Future | None = None  # set by `stop`; done once the handler has finished

    def stop(self) -> asyncio.Future:
        """Cancel the call (its session closed, or the proxy stops)."""
        if self.stopped is None:
            self.stopped = asyncio.get_running_loop().create_future()
            self.task.cancel()
        return self.stopped


@dataclass(eq=False)
class _Session:
    session_id: str
    token: str
    n_calls: int = 0
    open: bool = True
    calls: set[_InFlight] = field(default_factory=set)
    aborted: list[tuple[str, float]] = field(default_factory=list)  # (weight version, seconds) of attempts
    # aborted since the last record
    listener: relay.Listener | None = None  # the one its sandbox handed over, if any


class _Proven:
    """The engines the router may use: each URL once it has proved it is this run's
    (`identity.check` with the run's key, in a thread; a run without a key checks nothing)."""

    def __init__(self, router: Router, key: str | None) -> None:
        self.router, self.key = router, key
        self.ok: set[str] = set()
        self.checking: set[str] = set()
        self.wanted: tuple[list[str], dict[str, str] | None] = ([], None)
        self.tasks: set[asyncio.Task] = set()

    def want(self, urls: list[str], versions: dict[str, str] | None = None) -> None:
        urls = [u.rstrip("/") for u in urls]
        self.wanted = (urls, versions)
        self.router.set_engines([u for u in urls if self.key is None or u in self.ok], versions)
        for url in urls:
            if self.key is not None and url not in self.ok and url not in self.checking:
                self.checking.add(url)
                task = asyncio.create_task(self._check(url, self.key))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _check(self, url: str, key: str) -> None:
        why = await asyncio.to_thread(identity.check, url, key)
        self.checking.discard(url)
        if why is not None:
            log.error("engine %s refused: it cannot prove it is this run's: %s", url, why)
            return
        self.ok.add(url)
        self.want(*self.wanted)


class _Proxy:
    def __init__(self, opts: wire.ProxyLaunch, router: Router, mode, link: ProxyLinkDealer) -> None:
        self.opts, self.max_body = opts, opts.settings.max_body
        self.router = router
        self.engines = _Proven(router, os.environ.get(ENGINE_KEY_ENV) or None)
        self.mode = mode
        self.link = link
        self._sessions: dict[str, _Session] = {}
        self._by_token: dict[str, _Session] = {}
        self.http: web.Server | None = None  # the HTTP server's protocol factory, once set up
        self._bound: dict[Any, _Session] = {}  # connection (aiohttp's protocol) -> the session whose listener took it
        self._prune_at = 64
        self._connecting: set[asyncio.Task] = set()
        self.meter = metrics.ProxyMeter(opts.proxy_id, opts.metrics_s) if opts.metrics_s > 0 else None  # None: off

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        for api in _APIS:
            app.router.add_post(api.PATH, functools.partial(self._handle, api))
        app.router.add_get("/v1/models", self._models)
        return app

    # --- gateway side ---------------------------------------------------------------------------

    async def gateway_loop(self) -> None:
        """Handle gateway messages; returns on Shutdown."""
        while True:
            message = await self.link.recv()
            if isinstance(message, wire.OpenSession):
                self._open(message.session_id, message.token, message.task_id)
                self.link.send(wire.SessionOpened(session_id=message.session_id))
            elif isinstance(message, wire.CloseSession):
                await self._close(message.session_id)
            elif isinstance(message, wire.Engines):
                log.info("engines now: %s", ", ".join(message.urls) or "none")
                self.engines.want(message.urls, message.versions)
            elif isinstance(message, wire.Shutdown):
                log.info("gateway asked to shut down: %s", message.reason)
                return

    async def heartbeat_loop(self) -> None:
        """Heartbeat the gateway; returns once it has been silent for peer_timeout_s."""
        while not self.link.liveness.lost():
            self.link.send(wire.Heartbeat(sender=self.opts.proxy_id, t=time.time()))
            if self.meter is not None and self.meter.due():
                self.link.send(self._snapshot())
            await asyncio.sleep(self.opts.heartbeat_s)
        log.warning("gateway silent for over %ss", self.opts.peer_timeout_s)

    def _snapshot(self) -> wire.Metrics:
        assert self.meter is not None
        self.meter.engines(self.router.placed, self.router.readings())
        return self.meter.snapshot()

    def _open(self, session_id: str, token: str, group: str) -> None:
        """A repeated OpenSession rebinds the session to the new token, keeping its calls."""
        self.router.join(session_id, group)
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
        if session.listener is not None:
            session.listener.close()
        stopped = [flight.stop() for flight in list(session.calls)]
        if stopped:
            await asyncio.wait(stopped)
        self.mode.forget(session_id)
        self.router.forget(session_id)
        if self.meter is not None and self.meter.ended():  # before SessionClosed: it reaches the orchestrator first
            self.link.send(self._snapshot())
        self.link.send(wire.SessionClosed(session_id=session_id, n_calls=session.n_calls))

    def holding(self) -> bool:
        """Whether a session is still open (its gateway has yet to close it and collect its records)."""
        return bool(self._sessions)

    def take(self, token: str, sock) -> str | None:
        """A sandbox's listener (relay.Handoffs): served for the session of `token`, in place of the
        one it had; None, or why it is refused."""
        session = self._by_token.get(token)
        if session is None or self.http is None:
            return "unknown or closed session"
        if session.listener is not None:
            session.listener.close()
        session.listener = relay.Listener(sock, functools.partial(self._connected, session))
        return None

    def _connected(self, session: _Session, conn) -> None:
        def bound() -> Any:
            assert self.http is not None  # `take` keeps no listener before
            protocol = self.http()
            if len(self._bound) >= self._prune_at:  # connections that ended
                self._bound = {p: s for p, s in self._bound.items() if p.transport is not None}
                self._prune_at = max(64, 2 * len(self._bound))
            self._bound[protocol] = session
            return protocol

        task = asyncio.create_task(asyncio.get_running_loop().connect_accepted_socket(bound, conn))
        self._connecting.add(task)
        task.add_done_callback(functools.partial(_connected, conn, self._connecting))

    def close_listeners(self) -> None:
        for session in self._sessions.values():
            if session.listener is not None:
                session.listener.close()

    def cancel_calls(self) -> None:
        for session in self._sessions.values():
            for flight in list(session.calls):
                flight.stop()

    # --- harness side ---------------------------------------------------------------------------

    async def _refuse(self, request: web.Request, answer: web.Response) -> web.Response:
        """Send `answer` without reading the body, then discard what is still coming (bounded)."""
        await answer.prepare(request)
        await answer.write_eof()
        left = _DRAIN * self.max_body
        with contextlib.suppress(TimeoutError, OSError, ClientError, web.HTTPException):
            async with asyncio.timeout(_DRAIN_S):
                while left > 0 and (piece := await request.content.readany()):
                    left -= len(piece)
        if not request.content.is_eof():
            request.protocol.force_close()
        return answer

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.opts.model, "object": "model", "created": 0, "owned_by": "polar-hpc"}
        return _json(200, {"object": "list", "data": [model]})

    async def _handle(self, api, request: web.Request) -> web.StreamResponse:
        session = self._by_token.get(api.token(request.headers) or "")
        if session is None or self._bound.get(request.protocol, session) is not session:  # before a byte of the body is read
            return await self._refuse(request, _unauthorized(api))
        if (request.content_length or 0) > self.max_body:
            return await self._refuse(request, self._too_large(api))
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:  # no Content-Length, and more than the limit came
            return await self._refuse(request, self._too_large(api))
        try:
            return await self._call(api, session, request, raw)
        finally:
            if len(raw) > BIG:
                release_memory()

    def _too_large(self, api) -> web.Response:  # built only when needed: most calls never are
        message = f"Request body too large: this proxy accepts at most {self.max_body} bytes."
        return _json(413, api.error_body(413, message, "too_large"))

    async def _call(self, api, session: _Session, request: web.Request, raw: bytes) -> web.StreamResponse:
        try:
            body, call = await offload(len(raw), api.parse, raw)
        except BadRequest as e:
            return _json(400, api.error_body(400, str(e), "invalid_request", e.param))
        call.size = len(raw)
        asked = body.get("model")
        if self.opts.settings.strict_model and asked not in (None, self.opts.model):
            message = f"The model {asked!r} does not exist; this run serves {self.opts.model!r}."
            return _json(404, api.error_body(404, message, "not_found", "model"))
        current = asyncio.current_task()
        assert current is not None  # aiohttp runs each request as a task
        flight = _InFlight(current)
        session.calls.add(flight)
        try:
            return await self._serve(api, session, request, body, call, flight)
        except asyncio.CancelledError:
            if flight.stopped is None:  # not the proxy's doing: aiohttp is shutting down
                raise
            flight.task.uncancel()
        finally:
            session.calls.discard(flight)
            if flight.stopped is not None:
                flight.stopped.set_result(None)
        if flight.sent is not None:
            return flight.sent
        if not session.open:
            return _unauthorized(api)
        return _json(503, api.error_body(503, "proxy is shutting down", "unavailable"))

    async def _serve(self, api, session: _Session, request, body, call, flight: _InFlight):
        """Answer one call (streaming as it is sampled, if asked) and record it."""
        t_start = time.time()
        metrics.start_call()
        events = api.Events(call, body, self.opts.model) if call.stream else None

        async def begin() -> web.StreamResponse:
            """The call's event stream, started (headers and first event sent) on first use."""
            assert events is not None  # only a streamed call has one
            if flight.sent is None:
                flight.sent = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await flight.sent.prepare(request)
                await flight.sent.write(events.start())
            return flight.sent

        async def emit(piece: str | ToolCall) -> None:
            if events is not None:
                await (await begin()).write(events.delta(piece))

        try:
            outcome = await self.mode.answer(session.session_id, call, emit)
        except ConnectionResetError:  # the harness hung up mid-stream: nothing it saw to record
            log.info("session %s: harness closed its stream before the answer was complete",
                     session.session_id)
            return flight.sent
        except aborted.Aborted as e:
            session.aborted.append((e.weight_version, time.time() - t_start))
            return await aborted.answer(api, e, flight.sent, events)
        except BadRequest as e:  # found while rendering: nothing was streamed yet
            return _json(400, api.error_body(400, str(e), "invalid_request", e.param))
        except EngineError as e:
            log.warning("session %s: engine error, the harness gets %d: %s", session.session_id,
                        e.status, e.message[:2000])
            kind = {400: "context_length" if "context length" in e.message else "invalid_request",
                    NO_ENGINE: "unavailable"}.get(e.status, "upstream")
            if self.meter is not None:
                self.meter.error(kind)
            if flight.sent is None:
                headers = _NO_ENGINE_HEADERS if e.status == NO_ENGINE else None
                return _json(e.status, api.error_body(e.status, e.message, kind), headers)
            assert events is not None  # something was sent: the call streams
            await flight.sent.write(events.error(e.status, e.message, kind))
            await flight.sent.write_eof()
            return flight.sent
        t_end = time.time()
        response = api.response(outcome, body, self.opts.model, call.id)
        try:  # the harness's answer first; the record is sent even if the call is cancelled now
            if events is None:
                flight.sent = _json(200, response)
                await flight.sent.prepare(request)
                await flight.sent.write_eof()
            else:
                sent = await begin()
                await sent.write(events.end(outcome))
                await sent.write_eof()
        except ConnectionResetError:  # recorded: the harness saw every token but the last ones
            log.info("session %s: harness hung up before the end of its answer", session.session_id)
        finally:
            self._record(api, session, body, call, outcome, response, (t_start, t_end))
        return flight.sent

    def _record(self, api, session: _Session, body, call, outcome, response, times) -> None:
        for i, choice in enumerate([outcome, *outcome.choices]):  # n > 1: each choice a call record
            self._record_one(api, session, body, call, choice, response, times, i if outcome.choices else None)

    def _record_one(self, api, session: _Session, body, call, outcome, response, times, choice) -> None:
        meta = dict(outcome.meta)
        if choice is not None:
            meta["choice"] = choice
        if session.aborted:
            meta["aborted_attempts"] = aborted.summary(session.aborted)
            session.aborted = []
        if api is not oc:
            meta["chat"] = {"messages": call.messages, "tools": call.tools,
                            "reply": assistant_message(outcome)}
        metrics.call_timings(meta, *times)
        record = wire.CallRecord(
            session_id=session.session_id, call_index=session.n_calls, api=api.API,
            request=body, response=response, prompt_ids=outcome.prompt_ids,
            output_ids=outcome.output_ids, output_logprobs=outcome.output_logprobs,
            finish_reason=outcome.finish_reason, weight_version=outcome.weight_version,
            engine_url=outcome.engine_url, stream=call.stream, t_start=times[0],
            t_end=times[1], meta=meta, token_versions=outcome.token_versions or [],
        )
        self.link.send(record)
        if self.meter is not None:
            self.meter.call(api.API, record)
        session.n_calls += 1


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=msgspec.json.encode(body), content_type="application/json",
        headers=headers,
    )


def _connected(conn, connecting: set[asyncio.Task], task: asyncio.Task) -> None:
    connecting.discard(task)
    if task.cancelled() or task.exception() is not None:
        conn.close()


def _unauthorized(api) -> web.Response:
    message = "Incorrect API key provided: unknown or closed session."
    return _json(401, api.error_body(401, message, "authentication"))


def _capture_mode(opts: wire.ProxyLaunch, router: Router):
    try:
        engine = kinds.get(opts.engine_kind).client
    except ConfigError as e:
        raise ConfigError(f"proxy: {e}") from None
    settings = opts.settings
    if settings.mode == "passthrough":
        return Passthrough(router, opts.model, engine, settings.tokenizer)
    try:
        renderer = Renderer(settings.tokenizer) if settings.tokenizer else None
        return Tito(renderer, settings.tool_parser, router, engine)
    except ValueError as e:
        raise ConfigError(f"proxy: {e}") from None


async def _run(opts: wire.ProxyLaunch, ready_file: Path | None) -> None:
    loop = asyncio.get_running_loop()
    stop, signalled, gateway_pid = asyncio.Event(), asyncio.Event(), os.getppid()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    settings = opts.settings
    router = Router(list(opts.engine_urls), hold_s=settings.engine_wait_s, affinity_slack=settings.affinity_slack,
                    poll_s=settings.engine_poll_s)
    mode = _capture_mode(opts, router)
    ctx = zmq.asyncio.Context()
    link = ProxyLinkDealer(ctx, opts.gateway, opts.peer_timeout_s)
    proxy = _Proxy(opts, router, mode, link)
    stay = loop.create_task(_stay_for_gateway(signalled, stop, gateway_pid, proxy))
    proxy.engines.want(list(opts.engine_urls))  # none used until proven
    warming = asyncio.create_task(mode.warm())
    await asyncio.wait([warming], timeout=WARM_S)  # before the gateway hears of the proxy
    runner = web.AppRunner(proxy.app(), access_log=None, shutdown_timeout=5)
    await runner.setup()
    proxy.http = runner.server
    await web.TCPSite(runner, opts.host, settings.port, backlog=BACKLOG).start()
    url = f"http://{opts.host}:{runner.addresses[0][1]}"
    handoffs = relay.Handoffs(Path(opts.relay_socket), proxy.take) if opts.relay_socket is not None else None
    link.send(wire.ProxyHello(proxy_id=opts.proxy_id, url=url))
    tasks = [asyncio.create_task(proxy.gateway_loop()), asyncio.create_task(proxy.heartbeat_loop())]
    for task in tasks:
        task.add_done_callback(lambda t: _stop_on_end(t, stop))
    gc.freeze()  # what start-up made is never scanned again
    gc.set_threshold(GC_YOUNG)
    if ready_file is not None:
        procs.write_ready(ready_file, {"url": url})
    log.info("serving %s (gateway %s, engines %s, %s mode)", url, opts.gateway,
             ", ".join(router.urls), settings.mode)
    try:
        await stop.wait()
    finally:
        proxy.cancel_calls()
        if handoffs is not None:
            handoffs.close()
        proxy.close_listeners()
        await runner.cleanup()
        for task in [*tasks, warming, stay]:
            task.cancel()
        await asyncio.gather(*tasks, warming, stay, return_exceptions=True)
        link.close()
        await router.close()
        ctx.term()
        log.info("stopped")


async def _stay_for_gateway(signalled: asyncio.Event, stop: asyncio.Event, gateway_pid: int, proxy: _Proxy) -> None:
    """After a signal, stop once the gateway has said Shutdown (`stop`), has closed every session,
    is gone, or the budget is spent."""
    await signalled.wait()
    budget = procs.stop_budget() * STAY_SHARE
    log.info("signalled: serving the gateway's drain for at most %.1fs", budget)
    deadline = time.monotonic() + budget
    while (not stop.is_set() and proxy.holding() and os.getppid() == gateway_pid
           and time.monotonic() < deadline):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    stop.set()


def _stop_on_end(task: asyncio.Task, stop: asyncio.Event) -> None:
    if not task.cancelled() and task.exception() is not None:
        # typeshed's Generator lacks __qualname__, which generator objects have
        log.error("%s failed", task.get_coro().__qualname__, exc_info=task.exception())  # type: ignore[union-attr]
    stop.set()
