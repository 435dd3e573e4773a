"""The orchestrator process (`polar-hpc orchestrator`): a ZeroMQ ROUTER every other process talks to.

It reads the run's tasks (`<run>/tasks.jsonl`), expands them into sessions, hands sessions to
gateways that send credit, journals every state change, answers StatusRequest from clients, and
requeues the sessions of a gateway that goes silent. Its endpoint is written to
`<run>/rendezvous.json` (mode 0600, atomically) once it is bound. A client's Shutdown stops the
gateways and then the orchestrator.
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

import zmq
import zmq.asyncio

from polar_hpc import wire
from polar_hpc.config import load_tasks, load_topology
from polar_hpc.orchestrator.journal import Journal
from polar_hpc.orchestrator.sessions import SessionTable

log = logging.getLogger("polar_hpc.orchestrator")


@dataclass
class _Gateway:
    gateway_id: str
    credit: int = 0
    sessions: set[str] = field(default_factory=set)


def serve(run_dir: Path, host: str = "127.0.0.1", port: int = 0) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(Orchestrator(run_dir, host, port).run())


def write_rendezvous(run_dir: Path, info: dict) -> None:
    path = run_dir / "rendezvous.json"
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


class Orchestrator:
    def __init__(self, run_dir: Path, host: str, port: int) -> None:
        self.run_dir = run_dir
        self.topology = load_topology(run_dir / "topology.yaml")
        self.table = SessionTable.from_tasks(load_tasks(run_dir / "tasks.jsonl"))
        self.journal = Journal(run_dir)
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if port == 0:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock.bind(f"tcp://{host}:{port}")
        self.endpoint = f"tcp://{host}:{port}"
        self.gateways: dict[bytes, _Gateway] = {}
        self.liveness = wire.Liveness(self.topology.gateway.peer_timeout_s)
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        for s in self.table.sessions.values():
            self.journal.write("queued", session=s.session_id, task=s.task.id, sample=s.sample_index)
        write_rendezvous(self.run_dir, {"endpoint": self.endpoint, "pid": os.getpid()})
        log.info("listening on %s with %d sessions", self.endpoint, len(self.table.sessions))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        tasks = [asyncio.create_task(self._recv()), asyncio.create_task(self._tick())]
        await self.stopping.wait()
        for identity in list(self.gateways):
            self._send(identity, wire.Shutdown(reason="run finished"))
        for t in tasks:
            t.cancel()
        self.journal.close()
        self.ctx.destroy(linger=1000)
        return 0

    def _send(self, identity: bytes, msg: wire.Message) -> None:
        try:
            self.sock.send_multipart([identity, wire.encode(msg)])
        except zmq.ZMQError as e:  # the peer is gone (ROUTER_MANDATORY)
            log.warning("cannot reach %r: %s", identity, e)

    async def _recv(self) -> None:
        while True:
            identity, payload = await self.sock.recv_multipart()
            try:
                msg = wire.decode(payload)
            except Exception as e:
                log.error("undecodable message from %r: %s", identity, e)
                continue
            self._handle(identity, msg)

    def _handle(self, identity: bytes, msg: wire.AnyMessage) -> None:
        gw = self.gateways.get(identity)
        if gw is not None:
            self.liveness.heard(identity)
        if isinstance(msg, wire.Hello):
            self.gateways[identity] = _Gateway(msg.gateway_id)
            self.liveness.heard(identity)
            self.journal.write("gateway_up", gateway=msg.gateway_id, host=msg.host, slots=msg.slots)
        elif isinstance(msg, wire.Credit) and gw is not None:
            gw.credit += msg.n
            self._dispatch(identity, gw)
        elif isinstance(msg, wire.SessionUpdate):
            if self.table.update(msg.session_id, msg.state) is not None:
                self.journal.write("state", session=msg.session_id, state=msg.state)
        elif isinstance(msg, wire.Result):
            if gw is not None:
                gw.sessions.discard(msg.session_id)
            s = self.table.finish(msg)
            if s is not None:  # the first result of a (task, sample): the attempt that counts
                self.journal.write(
                    "result", session=msg.session_id, task=s.task.id, sample=s.sample_index, attempt=s.attempt,
                    status=msg.status, reward=msg.reward, shard=msg.shard,
                )
        elif isinstance(msg, wire.StatusRequest):
            self._send(identity, self.table.status(len(self.gateways)))
        elif isinstance(msg, wire.Shutdown):
            log.info("shutdown requested by a client: %s", msg.reason)
            self.stopping.set()

    def _dispatch(self, identity: bytes, gw: _Gateway) -> None:
        while gw.credit > 0:
            spec = self.table.take(identity)
            if spec is None:
                return
            gw.credit -= 1
            gw.sessions.add(spec.session_id)
            self.journal.write("assigned", session=spec.session_id, gateway=gw.gateway_id, attempt=spec.attempt)
            self._send(identity, wire.Assign(session=spec))

    async def _tick(self) -> None:
        while True:
            beat = wire.Heartbeat(sender="orchestrator", t=time.time())
            for identity in list(self.gateways):
                self._send(identity, beat)
            for identity in self.liveness.lost():
                self._lose(identity)
            await asyncio.sleep(self.topology.gateway.heartbeat_s)

    def _lose(self, identity: bytes) -> None:
        gw = self.gateways.pop(identity)
        self.liveness.forget(identity)
        log.warning("gateway %s is silent; requeueing %d sessions", gw.gateway_id, len(gw.sessions))
        self.journal.write("gateway_lost", gateway=gw.gateway_id)
        for sid in gw.sessions:
            s = self.table.requeue(sid)
            self.journal.write("requeued", session=s.session_id, previous=sid, attempt=s.attempt)
        for other_id, other in self.gateways.items():
            self._dispatch(other_id, other)
