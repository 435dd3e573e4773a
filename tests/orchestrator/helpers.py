"""Start a real orchestrator process on a run directory, read what it sends, play a gateway.

Waits for a message the test expects end at a ceiling only a hang reaches (HANG_S); a test that
checks that nothing arrives passes its own short timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from polar_hpc import wire

HANG_S = 60.0


def start_orchestrator(run_dir: Path, topology: str, task: dict | list[dict] | None,
                       args: tuple = ()) -> tuple[subprocess.Popen, str]:
    """Write the run's topology and its task or tasks (none: an empty task file), start `polar-hpc
    orchestrator` with `args`, return it and its endpoint."""
    (run_dir / "topology.yaml").write_text(topology)
    tasks = [] if task is None else task if isinstance(task, list) else [task]
    (run_dir / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", "orchestrator", "--run-dir", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rendezvous = run_dir / "rendezvous.json"
    deadline = time.monotonic() + 30
    while not rendezvous.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.02)
    assert rendezvous.stat().st_mode & 0o777 == 0o600
    return proc, json.loads(rendezvous.read_text())["endpoint"]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = HANG_S) -> None:
    """Poll `condition` until it holds; fail naming `what` once only a hang could explain the wait."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.02)


def reply(sock, kind, timeout_s: float = HANG_S):
    """The next message of type `kind` on `sock`, skipping others (heartbeats); None after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        msg = wire.decode(sock.recv())
        if isinstance(msg, kind):
            return msg
    return None


def assigned(sock, n: int, timeout_s: float = HANG_S) -> list[wire.SessionSpec]:
    """The next `n` sessions assigned on `sock`, over as many Assign messages as they came in."""
    specs: list[wire.SessionSpec] = []
    while len(specs) < n:
        specs += next_message(sock, wire.Assign, timeout_s).sessions
    assert len(specs) == n, f"{len(specs)} sessions assigned where {n} were expected"
    return specs


def next_message(sock, kind, timeout_s: float = HANG_S):
    """The next message of type `kind` on `sock`, skipping others (heartbeats)."""
    msg = reply(sock, kind, timeout_s)
    if msg is None:
        raise AssertionError(f"no {kind.__name__} within {timeout_s}s")
    return msg


class Gateway:
    """A gateway played by a thread of the test: it owns its DEALER socket, says Hello with `slots`
    credits, heartbeats every `heartbeat_s` whatever the test's own thread is doing, and answers
    each Assign with what `serve(session_ids)` returns (Reports, Credits...), and any other message
    but a heartbeat with what `answer(message)` returns (nothing by default). `specs` are the
    sessions assigned to it, `messages` everything else it was sent. `stop()` ends it."""

    def __init__(self, ctx: zmq.Context, endpoint: str, name: str, slots: int,
                 serve: Callable[[list[str]], list[wire.Message]], heartbeat_s: float = 0.1,
                 answer: Callable[[wire.Message], list[wire.Message]] = lambda _: []) -> None:
        self.name, self.serve, self.heartbeat_s, self.answer = name, serve, heartbeat_s, answer
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.connect(endpoint)
        self.sock.send(wire.encode(wire.Hello(gateway_id=name, host="h", slots=slots)))
        self.sock.send(wire.encode(wire.Credit(n=slots)))
        self.specs: list[wire.SessionSpec] = []
        self.messages: list[wire.Message] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gateway-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            next_beat = 0.0
            while not self._stop.is_set():
                if time.monotonic() >= next_beat:
                    self.sock.send(wire.encode(wire.Heartbeat(sender=self.name, t=time.time())))
                    next_beat = time.monotonic() + self.heartbeat_s
                if self.sock.poll(int(self.heartbeat_s * 1000)):
                    msg = wire.decode(self.sock.recv())
                    if isinstance(msg, wire.Assign):
                        self.specs.extend(msg.sessions)
                        for answer in self.serve([s.session_id for s in msg.sessions]):
                            self.sock.send(wire.encode(answer))
                    elif not isinstance(msg, wire.Heartbeat):
                        self.messages.append(msg)
                        for answer in self.answer(msg):
                            self.sock.send(wire.encode(answer))
        except BaseException as e:  # shown by stop()
            self.error = e

    @property
    def ran(self) -> list[str]:
        return [s.session_id for s in self.specs]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(HANG_S)
        assert not self._thread.is_alive(), f"gateway {self.name}'s thread did not stop"
        self.sock.close(linger=0)
        if self.error is not None:
            raise self.error
