"""The gateway process (`polar-hpc gateway`): one per CPU node.

Starts its proxy as a child process (linked over ZeroMQ ipc), handing it the topology's validated
settings as one `wire.ProxyLaunch` argument, connects to the orchestrator
(DEALER), announces itself, asks for work with credits and runs the sessions it is assigned through
the pipeline, writing trajectories to its own shard writer. What the pipeline tells the orchestrator
(Credit, SessionUpdate, Result) waits in an `Outbox` until the event loop's turn ends and goes as
one Report; any other message sends the waiting Report first, so the order is kept. Heartbeats both links; exits when the
orchestrator says Shutdown or goes silent (its sessions are then cancelled and written as such).
Without `engine_url` (Slurm mode) it waits for the orchestrator's first non-empty Engines and
starts its proxy on the first URL; every later Engines is forwarded to the proxy. The orchestrator
link uses the run's gateway CURVE key when the run has keys; the proxy alone gets the run's engine
API key (in its environment). Both receive loops survive any message: one with the wrong frame
count or undecodable, of a kind the link does not carry, or on the proxy socket from any peer but
the proxy (known by the secret routing id the gateway gave it, `security.PROXY_LINK_ENV`), is
logged and dropped.
Stopping (SIGTERM, Shutdown, a lost peer) fits the stop budget (`procs.stop_budget`): sessions not
yet in POSTRUN are cancelled and written as such, those in POSTRUN may finish, for at most
DRAIN_SHARE of the budget (what is left then is cancelled unwritten); then the open shard is
sealed and only then is the proxy told to stop (it outlives the drain: see proxy.server).
Its sandboxes' cgroups are its own (`sandbox.Cgroups` of the run): on its exit by any path (Shutdown,
SIGTERM, a lost peer, an exception) every process in them is killed and they are removed; at its
start it does the same for those of dead gateways of the same run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from polar_hpc import metrics, procs, security, wire
from polar_hpc.config import Topology, load_topology
from polar_hpc.errors import ChildFailed
from polar_hpc.gateway.pipeline import Pipeline, ProxyLink
from polar_hpc.sandbox import Cgroups, SandboxError, backend, launcher
from polar_hpc.sandbox.cgroups import run_key
from polar_hpc.shards.writer import ShardWriter

log = logging.getLogger("polar_hpc.gateway")
DRAIN_SHARE = 0.5  # of the budget, for the sessions to be written; then the shard is sealed


@dataclass
class GatewayOptions:
    run_dir: Path
    orchestrator: str
    engine_url: str | None
    gateway_id: str
    tmp_dir: Path | None = None


class Outbox:
    """A gateway's news for the orchestrator, coalesced until `take`: of each session only its latest
    SessionUpdate, none once its Result is in; Credits summed."""

    def __init__(self) -> None:
        self.updates: dict[str, wire.SessionUpdate] = {}
        self.results: list[wire.Result] = []
        self.credit = 0

    def add(self, msg: wire.Credit | wire.SessionUpdate | wire.Result) -> None:
        if isinstance(msg, wire.Credit):
            self.credit += msg.n
        elif isinstance(msg, wire.SessionUpdate):
            self.updates[msg.session_id] = msg
        else:
            self.updates.pop(msg.session_id, None)
            self.results.append(msg)

    def take(self) -> wire.Report | None:
        """The Report of everything added since the last take; None when nothing was."""
        items: list = [*self.updates.values(), *self.results]
        if self.credit:
            items.append(wire.Credit(n=self.credit))
        self.updates, self.results, self.credit = {}, [], 0
        return wire.Report(items=items) if items else None


_REPORTED = (wire.Credit, wire.SessionUpdate, wire.Result)


class ProxyLinkRouter(ProxyLink):
    """The gateway's end of the proxy link (ROUTER over ipc)."""

    def __init__(self, sock: zmq.asyncio.Socket, relay_socket: Path) -> None:
        self.sock = sock
        self.socket: Path = relay_socket  # where sandboxes hand the proxy their listeners (always set)
        self.link_id = secrets.token_hex(16)  # the proxy's routing id: given to it alone
        self.identity: bytes | None = None
        self.url = ""
        self.hello = asyncio.Event()
        self.records: dict[str, list[wire.CallRecord]] = defaultdict(list)
        self._opened: dict[str, asyncio.Future] = {}
        self._closed: dict[str, asyncio.Future] = {}

    def on_message(self, identity: bytes, msg: wire.AnyMessage) -> bool:
        """Take a message from the proxy; False (dropped) when it is from another peer."""
        if identity != self.link_id.encode():
            return False
        if isinstance(msg, wire.CallRecord):
            self.records[msg.session_id].append(msg)
        elif isinstance(msg, (wire.SessionOpened, wire.SessionClosed)):
            waiting = self._opened if isinstance(msg, wire.SessionOpened) else self._closed
            fut = waiting.pop(msg.session_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif isinstance(msg, wire.ProxyHello):
            self.identity, self.url = identity, msg.url
            self.hello.set()
        elif not isinstance(msg, wire.Heartbeat):
            log.error("dropped a %s from the proxy: not a message of that link", type(msg).__name__)
        return True

    def send(self, msg: wire.Message) -> None:
        self.sock.send_multipart([self.identity, wire.encode(msg)])

    async def open(self, session_id: str, token: str, task_id: str) -> None:
        """Returns once the proxy accepts the token, so the harness's first call cannot race it."""
        await self._ask(self._opened, session_id, wire.OpenSession(session_id, token, task_id))

    async def close(self, session_id: str) -> list[wire.CallRecord]:
        """Every record of the session: the proxy sends SessionClosed after the last one."""
        try:
            await self._ask(self._closed, session_id, wire.CloseSession(session_id=session_id))
        except TimeoutError:
            log.error("proxy did not close session %s in 30 s; keeping the records received", session_id)
        return self.records.pop(session_id, [])

    async def _ask(self, waiting: dict, session_id: str, msg: wire.Message) -> None:
        fut = waiting[session_id] = asyncio.get_running_loop().create_future()
        self.send(msg)
        await asyncio.wait_for(fut, 30.0)


def serve(opts: GatewayOptions) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cgroups = Cgroups(run_key(opts.run_dir))
    for owner in cgroups.sweep():
        log.warning("removed the sandbox cgroups of a dead gateway of this run (%s)", owner)
    try:
        return asyncio.run(_Gateway(opts, cgroups).run())
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second one must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        if killed := cgroups.close():
            log.warning("killed %d sandbox processes left at exit", killed)


class _Gateway:
    def __init__(self, opts: GatewayOptions, cgroups: Cgroups) -> None:
        self.opts = opts
        self.cgroups = cgroups
        self.topology: Topology = load_topology(opts.run_dir / "topology.yaml")
        m = self.topology.metrics
        self.meter = metrics.GatewayMeter(opts.gateway_id, m.interval_s) if m.enabled else None
        self.ctx = zmq.asyncio.Context()
        self.stopping = asyncio.Event()
        self.budget_s = procs.stop_budget()
        self.exit_code = 0
        self.outbox = Outbox()
        self._flushing = False  # a flush of the outbox is scheduled
        self._snapshot_due = False  # the meter has a snapshot to send before the next report

    async def run(self) -> int:
        opts, gw = self.opts, self.topology.gateway
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        for sig in (signal.SIGUSR1, signal.SIGUSR2):  # Slurm's --signal reaches every step: the driver acts on it
            loop.add_signal_handler(sig, log.info, "signal %s: left to the driver", sig)
        log.info("CUDA_VISIBLE_DEVICES=%s", os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
        tmp_root = Path(tempfile.mkdtemp(prefix=f"polar-{opts.gateway_id}-", dir=opts.tmp_dir))
        try:
            make_sandbox, warning = backend(self.topology.sandbox, tmp_root.parent, (opts.run_dir.resolve(),),
                                            self.cgroups)
        except SandboxError as e:
            log.error("%s", e)
            tmp_root.rmdir()
            return 2
        if warning:
            log.warning(warning)
        launcher.build(tmp_root)  # once, before any sandbox (a failure is logged once)
        proxy_sock = self.ctx.socket(zmq.ROUTER)
        proxy_endpoint = f"ipc://{tmp_root}/proxy.sock"
        proxy_sock.bind(proxy_endpoint)
        log.info("proxy link at %s", proxy_endpoint)
        self.proxy = ProxyLinkRouter(proxy_sock, tmp_root / "relay.sock")  # as short as proxy.sock: fits where it does
        self.orch = self.ctx.socket(zmq.DEALER)
        security.secure_client(self.orch, opts.run_dir, security.GATEWAY)
        self.orch.connect(opts.orchestrator)
        self.writer = ShardWriter(opts.run_dir / "shards", opts.gateway_id, gw.shard_max_bytes, gw.shard_max_age_s)
        self.pipeline = Pipeline(gw.pools, make_sandbox, tmp_root, self.proxy, self.writer, self._to_orchestrator)
        self.liveness = wire.Liveness(gw.peer_timeout_s)
        self.engines = asyncio.Event()
        self.engine_urls = [opts.engine_url] if opts.engine_url else []
        self.engine_versions: dict[str, str] = {}
        self.proxy_proc: procs.Child | None = None
        loops = [
            asyncio.create_task(self._recv(proxy_sock, 2, self._from_proxy)),
            asyncio.create_task(self._recv(self.orch, 1, self._from_orchestrator)),
        ]
        try:
            self._to_orchestrator(wire.Hello(gateway_id=opts.gateway_id, host=socket.gethostname(), slots=gw.pools.run))
            self.liveness.heard("orchestrator")
            loops.append(asyncio.create_task(self._tick()))
            if not self.engine_urls:
                log.info("waiting for an engine to register with the orchestrator")
                await _first(self.engines.wait(), self.stopping.wait())
            if not self.stopping.is_set():
                self.proxy_proc = self._start_proxy(proxy_endpoint, self.engine_urls, self.proxy.socket)
                await self._wait_for_proxy(self.proxy_proc)
            if not self.stopping.is_set():
                self.proxy.send(wire.Engines(urls=self.engine_urls, versions=self.engine_versions))
                self.liveness.heard("proxy")
                self._to_orchestrator(wire.Credit(n=gw.pools.init))
                await self.stopping.wait()
        finally:
            await self.pipeline.drain(self.budget_s * DRAIN_SHARE)
            self._flush()
            self.writer.close()  # the open shard sealed: what was written is readable without a resume
            if self.proxy.identity is not None:
                self.proxy.send(wire.Shutdown(reason="gateway stopping"))
            for t in loops:
                t.cancel()
            procs.stop([self.proxy_proc] if self.proxy_proc else [])
            self.ctx.destroy(linger=500)
            shutil.rmtree(tmp_root, ignore_errors=True)  # its sockets; the sandboxes' folders are gone already
        return self.exit_code

    def _start_proxy(self, endpoint: str, engine_urls: list[str], relay_socket: Path):
        opts, topo = self.opts, self.topology
        launch = wire.ProxyLaunch(
            gateway=endpoint, engine_urls=engine_urls, model=topo.engine.model, engine_kind=topo.engine.kind,
            heartbeat_s=topo.gateway.heartbeat_s, peer_timeout_s=topo.gateway.peer_timeout_s, settings=topo.proxy,
            proxy_id=f"{opts.gateway_id}-proxy", relay_socket=str(relay_socket),
            metrics_s=topo.metrics.interval_s if topo.metrics.enabled else 0.0,
        )
        log_path = opts.run_dir / "logs" / f"proxy-{socket.gethostname()}-{opts.gateway_id}.log"
        env = security.engine_env(opts.run_dir) | {security.PROXY_LINK_ENV: self.proxy.link_id}
        return procs.spawn("proxy", ["proxy", launch.argument()], log_path, env)

    async def _wait_for_proxy(self, proxy_proc) -> None:
        deadline = time.monotonic() + 60
        while not self.proxy.hello.is_set() and not self.stopping.is_set():  # a stop need not wait for it
            proxy_proc.check()
            if time.monotonic() > deadline:
                raise ChildFailed(f"proxy not ready after 60 s:\n{proxy_proc.tail()}")
            await asyncio.sleep(0.02)
        log.info("proxy serving harnesses at %s", self.proxy.url)

    async def _recv(self, sock: zmq.asyncio.Socket, parts: int, handle) -> None:
        """Hand each message of `sock` (`parts` frames: [identity,] payload) to `handle`; anything
        malformed, or a handler that fails on it, is logged and the loop goes on."""
        while True:
            frames = await sock.recv_multipart()
            try:
                msg = wire.unpack(frames, parts)
            except wire.BadMessage as e:
                log.error("dropped a message: %s", e)
                continue
            try:
                handle(frames[0] if parts == 2 else b"", msg)
            except Exception:
                log.exception("handling a %s failed", type(msg).__name__)

    def _from_proxy(self, identity: bytes, msg: wire.AnyMessage) -> None:
        if isinstance(msg, wire.Metrics) and identity == self.proxy.link_id.encode():
            msg.role = "proxy"  # forwarded as the proxy's, whatever it says it is
            self._to_orchestrator(msg)
        elif self.proxy.on_message(identity, msg):
            self.liveness.heard("proxy")
        else:
            log.error("dropped a %s from a peer that is not the proxy", type(msg).__name__)

    def _from_orchestrator(self, _identity: bytes, msg: wire.AnyMessage) -> None:
        self.liveness.heard("orchestrator")
        if isinstance(msg, wire.Assign):
            for spec in msg.sessions:
                self.pipeline.assign(spec)
        elif isinstance(msg, wire.Engines):
            self.engine_versions = msg.versions
            if msg.urls:
                self.engine_urls = msg.urls
                self.engines.set()
            if self.proxy.identity is not None:
                self.proxy.send(msg)
        elif isinstance(msg, wire.Cancel):
            self.pipeline.cancel(msg.session_id)
        elif isinstance(msg, wire.Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            self.stopping.set()
        elif not isinstance(msg, wire.Heartbeat):
            log.error("dropped a %s from the orchestrator: not a message of that link", type(msg).__name__)

    def _to_orchestrator(self, msg: wire.Message) -> None:
        if self.meter is not None and self.meter.sent(msg):
            self._snapshot_due = True  # a session ended: its counts reach the orchestrator before its result
        if isinstance(msg, _REPORTED):
            self.outbox.add(msg)
            if not self._flushing:
                self._flushing = True
                asyncio.get_running_loop().call_soon(self._flush)
            return
        self._flush()
        self.orch.send(wire.encode(msg))

    def _flush(self) -> None:
        self._flushing = False
        if self._snapshot_due and self.meter is not None:
            self._snapshot_due = False
            self.orch.send(wire.encode(self.meter.snapshot()))
        report = self.outbox.take()
        if report is not None:
            self.orch.send(wire.encode(report))

    async def _tick(self) -> None:
        hb = self.topology.gateway.heartbeat_s
        while not self.stopping.is_set():
            beat = wire.Heartbeat(sender=self.opts.gateway_id, t=time.time())
            self._to_orchestrator(beat)
            if self.meter is not None and self.meter.due():
                self._to_orchestrator(self.meter.snapshot())
            if self.proxy.identity is not None:
                self.proxy.send(beat)
            self.writer.maybe_roll()
            lost = self.liveness.lost()
            if lost or (self.proxy_proc is not None and self.proxy_proc.proc.poll() is not None):
                log.error("lost contact with %s; stopping", ", ".join(lost) or "proxy (exited)")
                self.exit_code = 1
                self.stopping.set()
            await asyncio.sleep(hb)


async def _first(*aws) -> None:
    """Wait until the first of `aws` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
