"""The orchestrator process (`polar-hpc orchestrator`): a ZeroMQ ROUTER every other process talks to.

It reads the run's tasks (`<run>/tasks.jsonl`), expands them into sessions and runs the parts that
each do one job: `scheduling` (credit -> Assign, results, requeue), `registry` (engines and weight
updates), `front` (a service run's trainers: submit, cancel, inbox, drain), `liveness`
(heartbeats, silent members) and `status`. This module binds the socket and hands each message to
its part by the dispatch table `ROUTES`, keyed on the wire type: a kind it does not take, or from a
role that may not send it (with `<run>/keys/` present every peer must hold one of the run's role
keys), or a service request in a batch run, never reaches a part; it is logged and dropped
(answered `Refused` where the sender waits), as is any malformed multipart. Without keys it binds
only to loopback. The messages waiting are handled as one batch: the batch's journal lines are
written in one write, then its answers are sent, so a crash loses nothing a peer was told. Its
endpoint (and, with keys, its CURVE public key) is written to `<run>/rendezvous.json`
(`procs.write_ready`: mode 0600, atomically) once it is bound, with the URL and token of its
Prometheus `/metrics` (`observe.live`: gateways' and proxies' snapshots, `wire.Metrics`, taken
from gateway keys only) unless the topology turns metrics off.

When the journal already holds an earlier life of the run (a requeued job), it resumes: finished
(task, sample) keys are not redone, the others run again as new attempts, except the tails of
groups decided before (`scheduling.Scheduler.resume`: cancelled, never run); a resumed service run
queues again what trainers had added. Each tick also decides the groups whose grace has passed.
In a Slurm job it admits by walltime: the driver's POLAR_ADMIT_UNTIL and POLAR_LIFE_S
(sessions.SessionTable). On SIGTERM it marks the sessions in flight `interrupted` in
the journal, stops the gateways and engines and exits. A client's Shutdown does the same.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
from pathlib import Path

import zmq
import zmq.asyncio

from polar_hpc import procs, security, wire
from polar_hpc.config import ConfigError, Task, load_tasks, load_topology
from polar_hpc.observe.live import Live
from polar_hpc.orchestrator import service, status
from polar_hpc.orchestrator.durations import Durations
from polar_hpc.orchestrator.front import Front
from polar_hpc.orchestrator.journal import Journal, replay, service_events
from polar_hpc.orchestrator.liveness import Watch
from polar_hpc.orchestrator.peers import Refusals, Route
from polar_hpc.orchestrator.registry import Registry
from polar_hpc.orchestrator.scheduling import Scheduler
from polar_hpc.orchestrator.sessions import ADMIT_UNTIL_ENV, FINAL, HELD, LIFE_ENV, SessionTable

log = logging.getLogger("polar_hpc.orchestrator")

_BATCH = 1000  # messages taken at once before their answers go out
_WAITING_ROUNDS = 1000  # loop turns given to waiting messages before a liveness check (a flood cannot hold it off)


def serve(run_dir: Path, host: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
          engine_urls: tuple[str, ...] = ()) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def main() -> int:  # built inside the loop: the CURVE authenticator runs on it
        return await Orchestrator(run_dir, host, port, advertise, engine_urls).run()

    return asyncio.run(main())


def _env_float(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _sessions(run_dir: Path, service_run: bool, done: dict, attempts: dict) -> tuple[SessionTable, service.Batches, bool]:
    """The run's sessions (the task file's, and in a service run those trainers added in an
    earlier life), its batches, and whether it was draining."""
    tasks_path = run_dir / "tasks.jsonl"
    empty = service_run and (not tasks_path.exists() or not tasks_path.read_text().strip())
    tasks = [] if empty else load_tasks(tasks_path, files_checked=True)  # sandbox files checked by `prepare`
    submitted, draining = service_events(run_dir) if service_run else ([], False)
    added = [Task.model_validate(e["task"]) for e in submitted]
    batches = service.Batches()
    batches.add("initial", [t.id for t in tasks])
    for event, task in zip(submitted, added):
        batches.add(event["batch"], [task.id], event.get("max_staleness"))
    return SessionTable.from_tasks(tasks + added, done, attempts), batches, draining


class Orchestrator:
    def __init__(self, run_dir: Path, host: str, port: int, advertise: str | None = None,
                 engine_urls: tuple[str, ...] = ()) -> None:
        self.run_dir = run_dir
        self.topology = topology = load_topology(run_dir / "topology.yaml")
        self.service = topology.service
        self.done, attempts, decided = replay(run_dir)
        self.resumed = bool(attempts)
        table, batches, draining = _sessions(run_dir, self.service.enabled, self.done, attempts)
        table.admit_until, table.life_s = _env_float(ADMIT_UNTIL_ENV), _env_float(LIFE_ENV)
        slurm = topology.slurm
        table.durations = Durations(slurm.admit_quantile if slurm.admit_by == "observed" else None,
                                    slurm.admit_min_samples)
        self.journal = Journal(run_dir)
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.plain = zmq.Socket.shadow(self.sock.underlying)  # the same socket: plain non-blocking calls
        wire.limit_size(self.sock)
        self.auth = security.secure_server(self.ctx, self.sock, run_dir)
        if self.auth is None and not _loopback(host):
            raise ConfigError(f"{security.keys_dir(run_dir)}: no keys; without them the orchestrator binds only "
                              f"to loopback, not {host}")
        if port == 0:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock.bind(f"tcp://{host}:{port}")
        self.endpoint = f"tcp://{advertise or host}:{port}"
        self.refusals = Refusals()
        self._outbox: list[tuple[bytes, wire.Message]] | None = None  # while a batch is handled
        self._held: dict[bytes, list[list[bytes]]] = {}  # peer -> messages waiting for room in its queue
        self._senders: set[asyncio.Task] = set()
        self.stopping = asyncio.Event()
        peers = wire.Liveness(topology.gateway.peer_timeout_s)
        self.registry = Registry(self.service, topology.engine.kind, topology.engine.weight_version, engine_urls,
                                 security.engine_api_key(run_dir), self.journal, self.send, self.to_gateways, peers)
        self.scheduler = Scheduler(table, batches, self.journal, self.send, peers, self.refusals,
                                   lambda: self.registry.policy, self.stopping)
        self.scheduler.resume(self.done, decided)  # decided groups stay decided; their tails never run again
        self.front = Front(self.service, run_dir, self.scheduler, self.journal, draining)
        self.watch = Watch(peers, self.scheduler, self.registry, self.send)
        self.live = Live(run_dir, topology.metrics, self.status, self.registry.listing,
                         security.engine_api_key(run_dir)) if topology.metrics.enabled else None

    async def run(self) -> int:
        table = self.scheduler.table
        if self.resumed:
            self.journal.write("resumed", done=len(self.done), restart=os.environ.get("SLURM_RESTART_COUNT"))
        self.journal.write_many("queued", (dict(session=s.session_id, task=s.task.id, sample=s.sample_index,
                                                attempt=s.attempt) for s in table.queue))
        self.journal.flush()
        info = {"endpoint": self.endpoint, "pid": os.getpid()}
        if self.auth is not None:
            info["curve_server_key"] = security.server_public_key(self.run_dir)
        if self.live is not None:
            info |= await self.live.start()
        procs.write_ready(self.run_dir / "rendezvous.json", info)
        log.info("listening on %s with %d sessions (%d already done)", self.endpoint, len(table.sessions),
                 len(self.done))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        tasks = [asyncio.create_task(self._recv()), asyncio.create_task(self._tick())]
        await self.stopping.wait()
        for s in table.sessions.values():
            if s.state not in FINAL and s.state not in ("queued", *HELD):
                self.journal.write("interrupted", session=s.session_id, reason="orchestrator stopping")
        for identity in self.watch.members():
            self.send(identity, wire.Shutdown(reason="run finished"))  # the journal is written first
        for t in tasks:
            t.cancel()
        if self.live is not None:
            await self.live.stop()
        self.journal.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.destroy(linger=1000)
        return 0

    def send(self, identity: bytes, msg: wire.Message) -> None:
        """Send now, or at the end of the batch of messages being handled, after the journal."""
        if self._outbox is not None:
            self._outbox.append((identity, msg))
            return
        self.journal.flush()
        self._send(identity, msg)

    def _send(self, identity: bytes, msg: wire.Message) -> None:
        """A plain non-blocking send; when the peer's queue is full, its messages wait, in order,
        for room while the loop goes on."""
        frames = [identity, wire.encode(msg)]
        if identity in self._held:
            self._held[identity].append(frames)
            return
        try:
            self.plain.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self._held[identity] = [frames]
            task = asyncio.get_running_loop().create_task(self._send_held(identity))
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)
        except zmq.ZMQError as e:  # the peer is gone (ROUTER_MANDATORY)
            log.warning("cannot reach %r: %s", identity, e)

    async def _send_held(self, identity: bytes) -> None:
        held = self._held[identity]
        try:
            while held:
                await self.sock.send_multipart(held[0])
                held.pop(0)
        except zmq.ZMQError as e:
            log.warning("cannot reach %r: %s (%d messages dropped)", identity, e, len(held))
        finally:
            del self._held[identity]

    def to_gateways(self, msg: wire.Message) -> None:
        for identity in list(self.scheduler.gateways):
            self.send(identity, msg)

    async def _recv(self) -> None:
        """Every message, whatever its frames, size or content: handled, or refused and logged. The
        messages waiting are taken in one batch (up to _BATCH); their journal lines are written
        once, then their answers are sent."""
        secured = self.auth is not None
        while True:
            batch = [await self.sock.recv_multipart(copy=False)]
            while len(batch) < _BATCH:
                try:
                    batch.append(self.plain.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
            self._outbox = []
            for frames in batch:
                self._take(frames, secured)
            outbox, self._outbox = self._outbox, None
            self.journal.flush()
            for identity, msg in outbox:
                self._send(identity, msg)

    def _take(self, frames: list[zmq.Frame], secured: bool) -> None:
        identity = frames[0].bytes
        try:
            msg = wire.unpack([f.bytes for f in frames], 2)
        except wire.BadMessage as e:
            self.refusals.note(identity, f"dropped a message: {e}")
            return
        try:
            self._handle(identity, security.peer_roles(frames[-1], secured), msg)
        except Exception:  # a bug must not end the loop every peer depends on
            log.exception("handling %s from %s failed", type(msg).__name__, identity.hex())

    def _handle(self, identity: bytes, roles: frozenset[str], msg: wire.AnyMessage) -> None:
        route = ROUTES.get(type(msg))
        if route is None:
            why = "the orchestrator takes no such message"
        elif not route.roles & roles:
            why = f"the {'/'.join(sorted(roles)) or 'unknown'} key may not send it"
        elif route.service and not self.service.enabled:
            why = "this run is not a service run (set service.enabled in its topology)"
        else:
            self.watch.heard(identity)
            answer = route.handler(self, identity, msg)
            if answer is not None:
                self.send(identity, answer)
            return
        self.refusals.note(identity, f"refused {type(msg).__name__}: {why}")
        if route is not None and route.answered:
            self.send(identity, wire.Refused(error=f"{type(msg).__name__} refused: {why}"))

    async def _tick(self) -> None:
        while True:
            if self.service.enabled:
                self.front.take_inbox()
            await self._heard_waiting()
            self.scheduler.decide_due()
            self.watch.beat()
            self.journal.flush()
            await asyncio.sleep(self.topology.gateway.heartbeat_s)

    async def _heard_waiting(self) -> None:
        """Let `_recv` take the messages already waiting before members are judged silent: after a
        stall of this loop (a slow journal write, a starved CPU) their heartbeats wait unheard.
        The async socket's EVENTS read also schedules their handling (pyzmq, edge-triggered)."""
        for _ in range(_WAITING_ROUNDS):
            events = self.sock.get(zmq.EVENTS)
            if not (isinstance(events, int) and events & zmq.POLLIN):
                return
            await asyncio.sleep(0)

    def hello(self, identity: bytes, msg: wire.Hello) -> wire.Engines:
        """A gateway registers; it is told the engines up now."""
        self.scheduler.hello(identity, msg)
        return self.registry.listing()

    def status(self) -> wire.StatusReply:
        sched = self.scheduler
        return status.reply(sched.table, len(sched.gateways), self.registry.members() + sched.members(),
                            sched.rate.per_s(), sched.assigned_policy,
                            self.front.draining if self.service.enabled else None)

    def metrics(self, identity: bytes, msg: wire.Metrics) -> None:
        why = self.live.take(identity, msg) if self.live is not None else None
        if why is not None:
            self.refusals.note(identity, f"dropped Metrics: {why}")

    def drain(self) -> wire.StatusReply:
        self.front.drain()
        return self.status()

    def shutdown(self, msg: wire.Shutdown) -> None:
        log.info("shutdown requested: %s", msg.reason)
        self.journal.write("shutdown", reason=msg.reason)
        self.stopping.set()


_GATEWAY = frozenset({security.GATEWAY})
_ENGINE = frozenset({security.ENGINE})
_MEMBERS = _GATEWAY | _ENGINE
_CLIENTS = frozenset({security.CLIENT, security.ADMIN})

# wire type -> its handler (orchestrator, sender identity, message) -> the answer or None, the roles
# that may send it, whether only a service run takes it, and whether its sender waits for an answer
ROUTES: dict[type, Route] = {
    wire.Hello: Route(lambda o, peer, m: o.hello(peer, m), _GATEWAY),
    wire.Credit: Route(lambda o, peer, m: o.scheduler.credit(peer, m), _GATEWAY),
    wire.SessionUpdate: Route(lambda o, peer, m: o.scheduler.update(peer, m), _GATEWAY),
    wire.Result: Route(lambda o, peer, m: o.scheduler.result(peer, m), _GATEWAY),
    wire.Report: Route(lambda o, peer, m: o.scheduler.report(peer, m), _GATEWAY),
    wire.EngineHello: Route(lambda o, peer, m: o.registry.hello(peer, m), _ENGINE),
    wire.EngineBye: Route(lambda o, peer, m: o.registry.lose(peer, "deregistered"), _ENGINE),
    wire.Metrics: Route(lambda o, peer, m: o.metrics(peer, m), _GATEWAY),
    wire.Heartbeat: Route(lambda o, peer, m: None, _MEMBERS),  # its sign of life is noted for any message
    wire.StatusRequest: Route(lambda o, peer, m: o.status(), _CLIENTS, answered=True),
    wire.BatchStatusRequest: Route(lambda o, peer, m: o.front.batch_status(m), _CLIENTS, answered=True),
    wire.SubmitTasks: Route(lambda o, peer, m: o.front.submit(m.batch_id, m.tasks, m.max_staleness), _CLIENTS,
                            service=True, answered=True),
    wire.CancelTasks: Route(lambda o, peer, m: o.front.cancel(m), _CLIENTS, service=True, answered=True),
    wire.UpdateWeights: Route(lambda o, peer, m: o.registry.request(peer, m), _CLIENTS, service=True, answered=True),
    wire.Drain: Route(lambda o, peer, m: o.drain(), _CLIENTS, service=True, answered=True),
    wire.Shutdown: Route(lambda o, peer, m: o.shutdown(m), frozenset({security.ADMIN})),
}
