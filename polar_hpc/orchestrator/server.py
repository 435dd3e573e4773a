"""The orchestrator process (`polar-hpc orchestrator`): a ZeroMQ ROUTER every other process talks to.

It reads the run's tasks (`<run>/tasks.jsonl`), expands them into sessions, hands sessions to
gateways that send credit, journals every state change, answers StatusRequest from clients, and
requeues the sessions of a gateway that goes silent. Engine steps register (EngineHello) and
heartbeat; the live engine URLs are relayed to every gateway (Engines). Its endpoint (and, in a
run with keys, its CURVE public key) is written to `<run>/rendezvous.json` (mode 0600, atomically)
once it is bound; with `<run>/keys/` present every peer must hold one of the run's role keys, and
each message kind is taken only from the roles `ROUTES` (the dispatch table, keyed on the wire
type) allows, news of a session only from the gateway running it; anything else, and any
malformed multipart, is logged and dropped (answered `Refused` where the sender waits). Without
keys it binds only to loopback.

When the journal already holds an earlier life of the run (a requeued job), it resumes: finished
(task, sample) keys are not redone, the others run again as new attempts. On SIGTERM it marks the
sessions in flight `interrupted` in the journal, stops the gateways and exits. A client's Shutdown
stops the gateways and then the orchestrator.

Service mode (`service.enabled`): the run has no fixed task list. Trainers add batches
(SubmitTasks, or files in `<run>/inbox/`), idempotent by task id; more queued sessions than
`service.max_queued` answer Busy and take nothing. CancelTasks cancels a batch or a task (queued
sessions at once, running ones through their gateway). UpdateWeights makes every engine (those
registered and those given with `--engine-url`) load new weights (`engines.kinds`, in the
request's mode or `service.weight_update_mode`); an engine that registers later
with other weights (a restarted engine step) is given the newest at once. The run is done only after Drain,
once every session has ended. A resumed service run queues again what trainers had added.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import signal
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio

from polar_hpc import security, wire
from polar_hpc.config import ConfigError, Task, load_tasks, load_topology
from polar_hpc.engines import kinds
from polar_hpc.orchestrator import service
from polar_hpc.orchestrator.peers import Refusals, Route
from polar_hpc.orchestrator.journal import Journal, replay, service_events
from polar_hpc.shards.batch import version_number
from polar_hpc.orchestrator.sessions import FINAL, SessionTable

log = logging.getLogger("polar_hpc.orchestrator")


@dataclass
class _Gateway:
    gateway_id: str
    host: str = ""
    credit: int = 0
    sessions: set[str] = field(default_factory=set)


def serve(run_dir: Path, host: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
          engine_urls: tuple[str, ...] = ()) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def main() -> int:  # built inside the loop: the CURVE authenticator runs on it
        return await Orchestrator(run_dir, host, port, advertise, engine_urls).run()

    return asyncio.run(main())


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def write_rendezvous(run_dir: Path, info: dict) -> None:
    path = run_dir / "rendezvous.json"
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


class Orchestrator:
    def __init__(self, run_dir: Path, host: str, port: int, advertise: str | None = None,
                 engine_urls: tuple[str, ...] = ()) -> None:
        self.run_dir = run_dir
        self.topology = load_topology(run_dir / "topology.yaml")
        self.service = self.topology.service
        self.done, attempts = replay(run_dir)
        self.resumed = bool(attempts)
        tasks_path = run_dir / "tasks.jsonl"
        empty = self.service.enabled and (not tasks_path.exists() or not tasks_path.read_text().strip())
        tasks = [] if empty else load_tasks(tasks_path, files_checked=True)  # sandbox files checked by `prepare`
        submitted, self.draining = service_events(run_dir) if self.service.enabled else ([], False)
        added = [Task.model_validate(e["task"]) for e in submitted]  # by trainers, in an earlier life
        self.table = SessionTable.from_tasks(tasks + added, self.done, attempts)
        self.batches = service.Batches()
        self.batches.add("initial", [t.id for t in tasks])
        for event, task in zip(submitted, added):
            self.batches.add(event["batch"], [task.id], event.get("max_staleness"))
        self.cancelling: set[str] = set()  # running sessions cancelled on purpose
        self.static_engines = {url: self.topology.engine.weight_version for url in engine_urls}  # url -> version
        self.weights_lock = asyncio.Lock()
        self.latest_weights: wire.UpdateWeights | None = None  # engines that register later load these
        self.policy = self.topology.engine.weight_version  # the newest weight version
        self.assigned_policy: dict[str, str] = {}  # running session -> the newest version at its dispatch
        self.journal = Journal(run_dir)
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        wire.limit_size(self.sock)
        self.auth = security.secure_server(self.ctx, self.sock, run_dir)
        if self.auth is None and not _loopback(host):
            raise ConfigError(f"{security.keys_dir(run_dir)}: no keys; without them the orchestrator binds only "
                              f"to loopback, not {host}")
        self.refusals = Refusals()
        self.engine_key = security.engine_api_key(run_dir)
        if port == 0:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock.bind(f"tcp://{host}:{port}")
        self.endpoint = f"tcp://{advertise or host}:{port}"
        self.gateways: dict[bytes, _Gateway] = {}
        self.engines: dict[bytes, wire.EngineHello] = {}
        self.down: dict[tuple[str, str], wire.Member] = {}  # (kind, name) -> the member as last seen
        self.liveness = wire.Liveness(self.topology.gateway.peer_timeout_s)
        self.ended: deque[float] = deque()  # when sessions ended, for the rate
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        if self.resumed:
            self.journal.write("resumed", done=len(self.done), restart=os.environ.get("SLURM_RESTART_COUNT"))
        self.journal.write_many("queued", (dict(session=s.session_id, task=s.task.id, sample=s.sample_index,
                                                attempt=s.attempt) for s in self.table.queue))
        info = {"endpoint": self.endpoint, "pid": os.getpid()}
        if self.auth is not None:
            info["curve_server_key"] = security.server_public_key(self.run_dir)
        write_rendezvous(self.run_dir, info)
        log.info("listening on %s with %d sessions (%d already done)", self.endpoint, len(self.table.sessions),
                 len(self.done))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        tasks = [asyncio.create_task(self._recv()), asyncio.create_task(self._tick())]
        await self.stopping.wait()
        for s in self.table.sessions.values():
            if s.state not in FINAL and s.state != "queued":
                self.journal.write("interrupted", session=s.session_id, reason="orchestrator stopping")
        for identity in list(self.gateways) + list(self.engines):
            self._send(identity, wire.Shutdown(reason="run finished"))
        for t in tasks:
            t.cancel()
        self.journal.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.destroy(linger=1000)
        return 0

    def _send(self, identity: bytes, msg: wire.Message) -> None:
        try:
            self.sock.send_multipart([identity, wire.encode(msg)])
        except zmq.ZMQError as e:  # the peer is gone (ROUTER_MANDATORY)
            log.warning("cannot reach %r: %s", identity, e)

    async def _recv(self) -> None:
        """Every message, whatever its frames, size or content: handled, or refused and logged."""
        secured = self.auth is not None
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            identity = frames[0].bytes
            try:
                msg = wire.unpack([f.bytes for f in frames], 2)
            except wire.BadMessage as e:
                self.refusals.note(identity, f"dropped a message: {e}")
                continue
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
            if identity in self.gateways or identity in self.engines:
                self.liveness.heard(identity)
            answer = route.handler(self, identity, msg)
            if answer is not None:
                self._send(identity, answer)
            return
        self.refusals.note(identity, f"refused {type(msg).__name__}: {why}")
        if route is not None and route.answered:
            self._send(identity, wire.Refused(error=f"{type(msg).__name__} refused: {why}"))

    def _holder(self, identity: bytes, session_id: str) -> _Gateway | None:
        """The registered gateway `identity` if it runs `session_id`; None (refused) otherwise."""
        gw = self.gateways.get(identity)
        if gw is None or session_id not in gw.sessions:
            self.refusals.note(identity, f"refused news of session {session_id!r}: not a gateway running it")
            return None
        return gw

    def _hello(self, identity: bytes, msg: wire.Hello) -> None:
        self.gateways[identity] = _Gateway(msg.gateway_id, msg.host)
        self.down.pop(("gateway", msg.gateway_id), None)
        self.liveness.heard(identity)
        self.journal.write("gateway_up", gateway=msg.gateway_id, host=msg.host, slots=msg.slots)
        self._send(identity, self._engine_list())

    def _credit(self, identity: bytes, msg: wire.Credit) -> None:
        gw = self.gateways.get(identity)
        if gw is None:
            self.refusals.note(identity, "refused Credit: not a registered gateway")
            return
        gw.credit += max(0, msg.n)
        self._dispatch(identity, gw)

    def _session_update(self, identity: bytes, msg: wire.SessionUpdate) -> None:
        if self._holder(identity, msg.session_id) is not None and self.table.update(msg.session_id, msg.state):
            self.journal.write("state", session=msg.session_id, state=msg.state)

    def _gateway_result(self, identity: bytes, msg: wire.Result) -> None:
        gw = self._holder(identity, msg.session_id)
        if gw is not None:
            gw.sessions.discard(msg.session_id)
            self._result(msg)

    def _engine_hello(self, identity: bytes, msg: wire.EngineHello) -> None:
        self.engines[identity] = msg
        self.down.pop(("engine", msg.engine_id), None)
        self.liveness.heard(identity)
        self.journal.write("engine_up", engine=msg.engine_id, url=msg.url, weight_version=msg.weight_version)
        self._relay_engines()
        latest = self.latest_weights
        if latest is not None and msg.weight_version != latest.weight_version:  # a restarted engine step
            asyncio.get_running_loop().create_task(self._update_weights(None, latest, [msg.url]))

    def _engine_bye(self, identity: bytes, msg: wire.EngineBye) -> None:
        self._lose_engine(identity, "deregistered")

    def _heartbeat(self, identity: bytes, msg: wire.Heartbeat) -> None:
        pass  # liveness is noted for every message of a member

    def _status_request(self, identity: bytes, msg: wire.StatusRequest) -> wire.StatusReply:
        return self._status()

    def _submit_request(self, identity: bytes, msg: wire.SubmitTasks) -> wire.Message:
        return self._submit(msg.batch_id, msg.tasks, msg.max_staleness)

    def _weights_request(self, identity: bytes, msg: wire.UpdateWeights) -> wire.Refused | None:
        if msg.mode not in (None, *kinds.MODES):
            return wire.Refused(error=f"weight update mode {msg.mode!r} is not known ({', '.join(kinds.MODES)})")
        asyncio.get_running_loop().create_task(self._update_weights(identity, msg))  # answers when done
        return None

    def _drain(self, identity: bytes, msg: wire.Drain) -> wire.StatusReply:
        self.draining = True
        self.journal.write("drain")
        return self._status()

    def _shutdown(self, identity: bytes, msg: wire.Shutdown) -> None:
        log.info("shutdown requested: %s", msg.reason)
        self.journal.write("shutdown", reason=msg.reason)
        self.stopping.set()

    def _result(self, msg: wire.Result) -> None:
        dispatched = self.assigned_policy.pop(msg.session_id, "")
        if msg.status == "cancelled" and msg.session_id not in self.cancelling:  # its gateway stopped under it: not the attempt that counts
            self.journal.write("interrupted", session=msg.session_id, reason="gateway stopped", shard=msg.shard)
            if not self.stopping.is_set() and self.table.sessions.get(msg.session_id) is not None:
                self._requeue(msg.session_id)
            return
        s = self.table.finish(msg)
        if s is not None:  # the first result of a (task, sample): the attempt that counts
            self.ended.append(time.monotonic())
            stale = self.batches.is_stale(s.task.id, version_number(dispatched), version_number(self.policy))
            self.journal.write(
                "result", session=msg.session_id, task=s.task.id, sample=s.sample_index, attempt=s.attempt,
                status=msg.status, reward=msg.reward, shard=msg.shard, n_tokens=msg.n_tokens,
                **({"stale": True} if stale else {}),
            )

    # --- service mode -------------------------------------------------------------------------

    def _submit(self, batch_id: str, data: list[dict], max_staleness: int | None = None) -> wire.Message:
        if not self.service.enabled:
            return wire.Refused(error="this run is not a service run (set service.enabled in its topology)")
        if self.draining:
            return wire.Refused(error="the run is draining: it takes no more tasks")
        try:
            tasks = service.validate(data)
        except ConfigError as e:
            return wire.Refused(error=str(e))
        new = [t for t in tasks if t.id not in self.batches.batch_of]
        sessions = sum(t.num_samples for t in new)
        if sessions > self.service.max_queued:
            return wire.Refused(error=f"batch {batch_id}: {sessions} sessions can never fit service.max_queued "
                                      f"= {self.service.max_queued}; split it")
        if new and len(self.table.queue) + sessions > self.service.max_queued:
            return wire.Busy(queued=len(self.table.queue), max_queued=self.service.max_queued,
                             retry_after_s=self._retry_after(sessions))
        if max_staleness is not None and max_staleness < 0:
            return wire.Refused(error=f"batch {batch_id}: max_staleness must be >= 0, not {max_staleness}")
        added, known = self.batches.add(batch_id, [t.id for t in tasks], max_staleness)
        for task in new:
            self.journal.write("submitted", batch=batch_id, task=task.model_dump(mode="json"),
                               max_staleness=max_staleness)
            for s in self.table.add(task):
                self.journal.write("queued", session=s.session_id, task=task.id, sample=s.sample_index,
                                   attempt=s.attempt)
        for identity, gw in self.gateways.items():
            self._dispatch(identity, gw)
        return wire.Submitted(batch_id=batch_id, added=added, known=known)

    def _retry_after(self, sessions: int) -> float:
        """Time until `sessions` places free up at the recent rate (0.5 s to 30 s)."""
        rate = len(self.ended) / 60 if self.ended else 0.0
        excess = len(self.table.queue) + sessions - self.service.max_queued
        return min(30.0, max(0.5, excess / rate if rate > 0 else 5.0))

    def _batch_status(self, identity: bytes, msg: wire.BatchStatusRequest) -> wire.Message:
        batch_id = msg.batch_id
        if batch_id is not None and batch_id not in self.batches.tasks:
            return wire.Refused(error=f"no batch {batch_id!r} in this run")
        chosen = [batch_id] if batch_id is not None else list(self.batches.tasks)
        by_task: dict[str, list[str]] = {}
        for s in self.table.sessions.values():
            by_task.setdefault(s.task.id, []).append(s.state)
        batches = {}
        for b in chosen:
            states = [state for tid in self.batches.tasks[b] for state in by_task.get(tid, [])]
            batches[b] = wire.BatchState(states=dict(Counter(states)), total=len(states),
                                         done=all(state in FINAL for state in states), stale=self.batches.stale[b])
        return wire.BatchStatus(batches=batches)

    def _cancel(self, identity: bytes, msg: wire.CancelTasks) -> wire.Message:
        if msg.task_id is not None:
            if msg.task_id not in self.batches.batch_of:
                return wire.Refused(error=f"no task {msg.task_id!r} in this run")
            task_ids = {msg.task_id}
        elif msg.batch_id in self.batches.tasks:
            task_ids = set(self.batches.tasks[msg.batch_id])
        else:
            return wire.Refused(error=f"no batch {msg.batch_id!r} in this run")
        n = 0
        for s in list(self.table.sessions.values()):
            if s.task.id not in task_ids or s.state in FINAL:
                continue
            n += 1
            if self.table.cancel_queued(s.session_id) is not None:
                self.journal.write("result", session=s.session_id, task=s.task.id, sample=s.sample_index,
                                   attempt=s.attempt, status="cancelled", reward=None, shard="", n_tokens=0)
            elif s.gateway is not None and s.session_id not in self.cancelling:
                self.cancelling.add(s.session_id)
                self._send(s.gateway, wire.Cancel(session_id=s.session_id))
        return wire.Cancelled(sessions=n)

    async def _update_weights(self, identity: bytes | None, msg: wire.UpdateWeights, only: list[str] | None = None) -> None:
        """Every engine (or `only` these) loads the weights; the trainer that asked gets the answer."""
        async with self.weights_lock:
            urls = only or sorted(set(self.static_engines) | {e.url for e in self.engines.values()})
            mode = msg.mode or self.service.weight_update_mode
            self.journal.write("weights_update", path=msg.model_path, weight_version=msg.weight_version, engines=urls,
                               mode=mode)
            update = kinds.get(self.topology.engine.kind).weights.update_engines
            pause_ms, errors = await update(urls, msg.model_path, msg.weight_version, mode,
                                            self.service.weight_update_timeout_s, self.engine_key)
            failed = {e.split(": ", 1)[0] for e in errors}
            for url in self.static_engines:
                if url not in failed:
                    self.static_engines[url] = msg.weight_version
            for engine in self.engines.values():
                if engine.url not in failed:
                    engine.weight_version = msg.weight_version
            ok = [u for u in urls if u not in failed]
            if (ok or not errors) and only is None:  # the newest weights, even with no engine up yet
                self.policy, self.latest_weights = msg.weight_version, msg
            self.journal.write("weights", weight_version=msg.weight_version, engines=ok, errors=errors,
                               pause_ms=round(pause_ms, 3))
            log.info("weights %s on %d engines (%d failed), pause %.1f ms", msg.weight_version, len(ok), len(errors),
                     pause_ms)
            if self.engines:  # the proxies stamp the new version on calls to engines that report none
                self._relay_engines()
        if identity is not None:
            self._send(identity, wire.WeightsUpdated(weight_version=msg.weight_version, mode=mode, engines=ok,
                                                     pause_ms=pause_ms, errors=errors))

    def _take_inbox(self) -> None:
        for path in service.inbox_files(self.run_dir):
            try:
                tasks = load_tasks(path)  # FILE:LINE: field errors; sandbox files relative to the inbox
            except ConfigError as e:
                self.journal.write("inbox", file=path.name, moved_to=str(service.consume(path, str(e))), error=str(e))
                continue
            answer = self._submit(f"inbox-{path.stem}", [t.model_dump(mode="json") for t in tasks])
            if isinstance(answer, wire.Busy):
                return  # the file stays; it is taken once there is room
            error = answer.error if isinstance(answer, wire.Refused) else None
            target = service.consume(path, error)
            self.journal.write("inbox", file=path.name, moved_to=str(target), error=error)

    def _requeue(self, session_id: str) -> None:
        s = self.table.sessions.get(session_id)
        if s is None or s.state in FINAL:
            return
        self.assigned_policy.pop(session_id, None)
        s = self.table.requeue(session_id)
        self.journal.write("requeued", session=s.session_id, previous=session_id, attempt=s.attempt)
        for other_id, other in self.gateways.items():
            self._dispatch(other_id, other)

    def _dispatch(self, identity: bytes, gw: _Gateway) -> None:
        while gw.credit > 0:
            spec = self.table.take(identity)
            if spec is None:
                return
            gw.credit -= 1
            gw.sessions.add(spec.session_id)
            self.journal.write("assigned", session=spec.session_id, gateway=gw.gateway_id, attempt=spec.attempt)
            self.assigned_policy[spec.session_id] = self.policy
            self._send(identity, wire.Assign(session=spec))

    def _engine_list(self) -> wire.Engines:
        versions = {**self.static_engines, **{e.url: e.weight_version for e in self.engines.values()}}
        return wire.Engines(urls=sorted(e.url for e in self.engines.values()), versions=versions)

    def _relay_engines(self) -> None:
        engines = self._engine_list()
        for identity in list(self.gateways):
            self._send(identity, engines)

    def _status(self) -> wire.StatusReply:
        now = time.monotonic()
        while self.ended and now - self.ended[0] > 60:
            self.ended.popleft()
        rate = len(self.ended) / 60 if self.ended else 0.0
        members = [wire.Member("engine", e.engine_id, e.host, True, 0, f"{e.url} weights {e.weight_version}")
                   for e in self.engines.values()]
        members += [wire.Member("engine", url, "", True, 0, f"{url} weights {version}")
                    for url, version in self.static_engines.items()]
        members += [wire.Member("gateway", g.gateway_id, g.host, True, len(g.sessions)) for g in self.gateways.values()]
        members += list(self.down.values())
        reply = self.table.status(len(self.gateways), members, rate)
        reply.versions_in_flight = dict(Counter(self.assigned_policy.values()))
        if self.service.enabled:
            reply.done = reply.done and self.draining
        return reply

    async def _tick(self) -> None:
        while True:
            if self.service.enabled and not self.draining:
                self._take_inbox()
            beat = wire.Heartbeat(sender="orchestrator", t=time.time())
            for identity in list(self.gateways) + list(self.engines):
                self._send(identity, beat)
            for identity in self.liveness.lost():
                if identity in self.engines:
                    self._lose_engine(identity, "silent")
                else:
                    self._lose(identity)
            await asyncio.sleep(self.topology.gateway.heartbeat_s)

    def _lose_engine(self, identity: bytes, why: str) -> None:
        engine = self.engines.pop(identity, None)
        self.liveness.forget(identity)
        if engine is not None:
            log.warning("engine %s at %s is %s", engine.engine_id, engine.url, why)
            self.down[("engine", engine.engine_id)] = wire.Member("engine", engine.engine_id, engine.host, False,
                                                                  detail=why)
            self.journal.write("engine_down", engine=engine.engine_id, reason=why)
            self._relay_engines()

    def _lose(self, identity: bytes) -> None:
        gw = self.gateways.pop(identity)
        self.liveness.forget(identity)
        log.warning("gateway %s is silent; requeueing %d sessions", gw.gateway_id, len(gw.sessions))
        self.journal.write("gateway_lost", gateway=gw.gateway_id)
        self.down[("gateway", gw.gateway_id)] = wire.Member("gateway", gw.gateway_id, gw.host, False, detail="silent")
        for sid in gw.sessions:
            self._requeue(sid)


_MEMBERS = frozenset({security.GATEWAY, security.ENGINE})
_CLIENTS = frozenset({security.CLIENT, security.ADMIN})

# wire type -> its handler (which returns the answer, if any), the roles that may send it, whether
# only a service run takes it, and whether its sender waits for an answer
ROUTES: dict[type, Route] = {
    wire.Hello: Route(Orchestrator._hello, frozenset({security.GATEWAY})),
    wire.Credit: Route(Orchestrator._credit, frozenset({security.GATEWAY})),
    wire.SessionUpdate: Route(Orchestrator._session_update, frozenset({security.GATEWAY})),
    wire.Result: Route(Orchestrator._gateway_result, frozenset({security.GATEWAY})),
    wire.EngineHello: Route(Orchestrator._engine_hello, frozenset({security.ENGINE})),
    wire.EngineBye: Route(Orchestrator._engine_bye, frozenset({security.ENGINE})),
    wire.Heartbeat: Route(Orchestrator._heartbeat, _MEMBERS),
    wire.StatusRequest: Route(Orchestrator._status_request, _CLIENTS, answered=True),
    wire.BatchStatusRequest: Route(Orchestrator._batch_status, _CLIENTS, answered=True),
    wire.SubmitTasks: Route(Orchestrator._submit_request, _CLIENTS, service=True, answered=True),
    wire.CancelTasks: Route(Orchestrator._cancel, _CLIENTS, service=True, answered=True),
    wire.UpdateWeights: Route(Orchestrator._weights_request, _CLIENTS, service=True, answered=True),
    wire.Drain: Route(Orchestrator._drain, _CLIENTS, service=True, answered=True),
    wire.Shutdown: Route(Orchestrator._shutdown, frozenset({security.ADMIN})),
}
