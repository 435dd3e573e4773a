"""The trainer's handle on a running service job: `Client(run_dir)`.

It finds the orchestrator through `<run>/rendezvous.json` and speaks CURVE with the run's client key
`<run>/keys/client.json` (a process that cannot read it cannot connect); that key may send the
requests below and nothing else (not a gateway's Result, not Shutdown). One request at a time, each
answered by the orchestrator (anything malformed in between is skipped):

- `submit(tasks, batch_id=None, block=True) -> batch id`: tasks are dicts or config.Task, validated
  here first (ConfigError naming the task and field). The default batch id is derived from the task
  ids, so a trainer that restarts and submits the same tasks gets the same batch back and nothing is
  queued twice (the orchestrator skips task ids it has). When the queue is full, `block` waits the
  hinted time and tries again; otherwise `ServiceBusy` carries the hint. Nothing is ever dropped.
  `max_staleness=k`: a session that ends more than k policy versions after the one it was
  dispatched under is marked stale (journal; `BatchState.stale`); read with
  `Filter(weight_versions=(newest - k, None))` to keep only trajectories within the window.
- `status(batch_id=None)`: {batch: BatchState(states, total, done, stale)}; `run_status()`: the
  run's StatusReply (engines with their weight versions, versions in flight);
  `cancel(batch_id=... | task_id=...)` -> sessions cancelled; `wait(batch_id)` polls until every
  session of the batch has ended.
- `update_weights(path, version, mode=None)`: every engine loads `path` as `version`; calls in
  flight finish first (`wait`), are aborted and retried by the harness (`abort`), or go on on the
  new weights, each token recording its version (`continue`); None: the topology's
  `service.weight_update_mode`. Returns WeightsUpdated (mode, engines, longest pause, failures;
  WeightUpdateFailed if every engine failed, ConfigError for an unknown mode or one the run's
  engine kind lacks).
- `drain()`: no more tasks; the run ends once every session has ended.

No answer within `timeout_s` raises ConnectionError (a wrong key gets none: CURVE drops it).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import zmq

from polar_hpc import security, wire
from polar_hpc.config import Task
from polar_hpc.errors import ConfigError, PolarError, RequestRefused, WeightUpdateFailed
from polar_hpc.orchestrator.service import validate


class ServiceBusy(PolarError):
    def __init__(self, busy: wire.Busy) -> None:
        super().__init__(f"the run's queue is full ({busy.queued}/{busy.max_queued}); retry in {busy.retry_after_s:.1f}s")
        self.retry_after_s = busy.retry_after_s


def batch_id_for(task_ids: list[str]) -> str:
    return "b-" + hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()[:16]


class Client:
    def __init__(self, run_dir: Path | str, timeout_s: float = 30.0) -> None:
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        rendezvous = self.run_dir / "rendezvous.json"
        try:
            self.endpoint = json.loads(rendezvous.read_text())["endpoint"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{rendezvous}: no running job found there ({e})") from None
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            security.secure_client(self._sock, self.run_dir, security.CLIENT)
            self._sock.connect(self.endpoint)
        return self._sock

    def _ask(self, msg: wire.Message, timeout_s: float | None = None) -> wire.AnyMessage:
        payload = wire.encode(msg)
        if len(payload) > wire.MAX_MESSAGE_BYTES:  # the orchestrator would drop the connection
            raise ConfigError(f"{type(msg).__name__} of {len(payload)} bytes is over the {wire.MAX_MESSAGE_BYTES} "
                              "a message may carry; split it")
        sock = self._socket()
        sock.send(payload)
        wait = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        while sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            try:
                reply = wire.unpack(sock.recv_multipart(), 1)
            except wire.BadMessage:
                continue
            if not isinstance(reply, wire.Heartbeat):
                if isinstance(reply, wire.Refused):
                    raise RequestRefused(reply.error)
                return reply
        sock.close()  # a late answer must not be read as the next request's
        self._sock = None
        raise ConnectionError(f"no answer from the orchestrator at {self.endpoint} within {wait:.0f}s "
                              f"(is the job running, and are these the run's keys in {self.run_dir}/keys?)")

    def submit(self, tasks: list[dict[str, Any] | Task], batch_id: str | None = None, block: bool = True,
               timeout_s: float | None = None, max_staleness: int | None = None) -> str:
        data = [t.model_dump(mode="json") if isinstance(t, Task) else t for t in tasks]
        data = [t.model_dump(mode="json") for t in validate(data)]  # bad input fails here, not in the job
        batch_id = batch_id or batch_id_for([t["id"] for t in data])
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
        while True:
            reply = self._ask(wire.SubmitTasks(batch_id=batch_id, tasks=data, max_staleness=max_staleness))
            if isinstance(reply, wire.Submitted):
                return reply.batch_id
            assert isinstance(reply, wire.Busy), reply
            if not block or time.monotonic() + reply.retry_after_s > deadline:
                raise ServiceBusy(reply)
            time.sleep(reply.retry_after_s)

    def status(self, batch_id: str | None = None) -> dict[str, wire.BatchState]:
        reply = self._ask(wire.BatchStatusRequest(batch_id=batch_id))
        assert isinstance(reply, wire.BatchStatus), reply
        return reply.batches

    def run_status(self) -> wire.StatusReply:
        reply = self._ask(wire.StatusRequest())
        assert isinstance(reply, wire.StatusReply), reply
        return reply

    def cancel(self, batch_id: str | None = None, task_id: str | None = None) -> int:
        if (batch_id is None) == (task_id is None):
            raise ValueError("cancel: give a batch_id or a task_id")
        reply = self._ask(wire.CancelTasks(batch_id=batch_id, task_id=task_id))
        assert isinstance(reply, wire.Cancelled), reply
        return reply.sessions

    def wait(self, batch_id: str, timeout_s: float | None = None, poll_s: float = 0.2) -> wire.BatchState:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
        while True:
            state = self.status(batch_id)[batch_id]
            if state.done:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not done after {timeout_s}s: {state.states}")
            time.sleep(poll_s)

    def update_weights(self, path: Path | str, version: str, mode: str | None = None,
                       timeout_s: float = 900.0) -> wire.WeightsUpdated:
        request = wire.UpdateWeights(model_path=str(Path(path).resolve()), weight_version=version, mode=mode)
        reply = self._ask(request, timeout_s)
        assert isinstance(reply, wire.WeightsUpdated), reply
        if reply.errors and not reply.engines:
            raise WeightUpdateFailed(f"no engine loaded weights {version}: " + "; ".join(reply.errors))
        return reply

    def drain(self) -> wire.StatusReply:
        reply = self._ask(wire.Drain())
        assert isinstance(reply, wire.StatusReply), reply
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
