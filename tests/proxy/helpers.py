"""Real processes for proxy tests: proxies, and a gateway played by the test.

`FakeGateway` owns a real ZeroMQ ROUTER bound on ipc in a thread: it heartbeats the proxy (unless
`beating` is cleared), counts its heartbeats, keeps metrics snapshots for `wait_metrics` (sent
only by a proxy launched with `metrics_s`), and queues every other message for `expect`.
`start_proxy` runs `polar-hpc proxy` and returns once its ready file names its URL; `Proxy.stop`
stops it as its gateway does (Shutdown over the link; a signal alone leaves a proxy serving its
open sessions for most of the stop budget).
`wait_gauge` waits until an engine's /metrics gauge (SGLang's names) reads a value.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import zmq

from polar_hpc import wire

BIN = Path(sys.executable).parent
MODEL = "polar-scripted"
CALCULATOR = {  # the calculator tool's name, description and JSON schema, for every API's shape
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]},
}


def wait_ready(proc: subprocess.Popen, ready: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args} not ready after {timeout}s")
        time.sleep(0.02)
    return json.loads(ready.read_text())["url"]


def engine_gauges(url: str) -> dict[str, float]:
    """The gauges of an engine's Prometheus /metrics by their names without the `sglang:` prefix."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return {line.split("{")[0].removeprefix("sglang:"): float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("sglang:")}


def wait_gauge(url: str, name: str, value: float, timeout: float = 60.0) -> None:
    """Poll the engine's gauge `name` (e.g. num_running_reqs) until it reads `value`."""
    deadline = time.monotonic() + timeout
    while (now := engine_gauges(url).get(name)) != value:
        assert time.monotonic() < deadline, f"the engine's {name} is {now}, not {value}, after {timeout}s"
        time.sleep(0.02)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_engine(tmp: Path, name: str, *flags: str) -> tuple[subprocess.Popen, str, Path]:
    """A scripted engine of its own (with its sample log); returns (process, url, log)."""
    ready, log = tmp / f"{name}.json", tmp / f"{name}.samples.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "polar-hpc"), "engine", "--kind", "scripted", "--port", "0", "--ready-file",
         str(ready), "--sample-log", str(log), *flags], stderr=open(tmp / f"{name}.log", "w"))
    return proc, wait_ready(proc, ready), log


class FakeGateway:
    def __init__(self, path: Path) -> None:
        self.endpoint = f"ipc://{path}"
        self.beating = threading.Event()
        self.beating.set()
        self.heartbeats: list[wire.Heartbeat] = []
        self._inbox: queue.Queue = queue.Queue()
        self._metrics: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.bind(self.endpoint)
        self._peer: bytes | None = None
        self._proxies: dict[str, bytes] = {}  # proxy_id -> its link's identity, from its ProxyHello
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last_beat = 0.0
        beat = wire.encode(wire.Heartbeat("gateway", 0.0))
        while not self._done.is_set():
            if self._sock.poll(20):
                self._peer, data = self._sock.recv_multipart()
                message = wire.decode(data)
                if isinstance(message, wire.Heartbeat):
                    self.heartbeats.append(message)
                elif isinstance(message, wire.Metrics):
                    self._metrics.put(message)
                else:
                    if isinstance(message, wire.ProxyHello):
                        self._proxies[message.proxy_id] = self._peer
                    self._inbox.put(message)
            while self._peer is not None and not self._outbox.empty():
                to, item = self._outbox.get()
                frames = item if isinstance(item, list) else [wire.encode(item)]
                self._sock.send_multipart([self._proxies.get(to, self._peer), *frames])
            due = time.monotonic() - last_beat > 0.2
            if self._peer is not None and self.beating.is_set() and due:
                self._sock.send_multipart([self._peer, beat])
                last_beat = time.monotonic()
        self._sock.close(linger=0)
        self._ctx.term()

    def send(self, message: wire.Message | list[bytes], to: str | None = None) -> None:
        """Send a message, or (a list) these raw frames, to the proxy `to` (None: the last that spoke)."""
        self._outbox.put((to, message))

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def next(self, timeout: float = 10.0) -> wire.Message:
        return self._inbox.get(timeout=timeout)

    def expect(self, cls: type, timeout: float = 10.0):
        message = self.next(timeout)
        assert isinstance(message, cls), f"expected {cls.__name__}, got {message!r}"
        return message

    def open(self, session_id: str, token: str, task_id: str = "") -> None:
        """Open a session (a sample of `task_id`) and return once the proxy has acknowledged it."""
        self.send(wire.OpenSession(session_id=session_id, token=token, task_id=task_id))
        assert self.expect(wire.SessionOpened) == wire.SessionOpened(session_id)

    def wait_metrics(self, done: Callable[[dict[tuple[str, str], float]], bool],
                     timeout: float = 30.0) -> dict[tuple[str, str], float]:
        """The first metrics snapshot for which `done` holds, as {(sample name, its one label
        value or ""): value}."""
        deadline = time.monotonic() + timeout
        while True:
            snapshot = self._metrics.get(timeout=max(0.0, deadline - time.monotonic()))
            samples = {(s.name, next(iter(s.labels.values()), "")): s.value for s in snapshot.samples}
            if done(samples):
                return samples

    def quiet(self, seconds: float) -> None:
        """Assert no message other than heartbeats arrives for `seconds`."""
        try:
            message = self._inbox.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {message!r}")

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


class Proxy:
    def __init__(self, proc: subprocess.Popen, name: str, url: str, gateway: FakeGateway, log: Path) -> None:
        self.proc, self.name, self.url, self.gateway, self.log = proc, name, url, gateway, log
        self.base_url = url + "/v1"

    def stop(self) -> None:
        """Shutdown from its gateway, then its exit (a signal after a hang's ceiling)."""
        if self.proc.poll() is None and not self.gateway.closed:
            self.gateway.send(wire.Shutdown(reason="test done"), to=self.name)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        stop(self.proc)


def launch(gateway: FakeGateway, engine_url: str | list[str], name: str = "p", engine_kind: str = "scripted",
           heartbeat_s: float = 1.0, peer_timeout_s: float = 10.0, relay_socket: str | None = None,
           metrics_s: float = 0.0, **settings: object) -> wire.ProxyLaunch:
    """What a gateway would start a proxy with; `settings`: fields of the topology's `proxy:`."""
    return wire.ProxyLaunch(
        gateway=gateway.endpoint, engine_urls=[engine_url] if isinstance(engine_url, str) else engine_url,
        model=MODEL, engine_kind=engine_kind, heartbeat_s=heartbeat_s, peer_timeout_s=peer_timeout_s,
        settings=wire.ProxySettings(**settings), proxy_id=name, relay_socket=relay_socket, metrics_s=metrics_s,
    )


def start_proxy(
    tmp: Path, gateway: FakeGateway, engine_url: str | list[str], name: str = "p", **options: object
) -> Proxy:
    """A proxy child (`polar-hpc proxy LAUNCH`) of `launch(gateway, engine_url, name, **options)`,
    once it has said ProxyHello."""
    ready = tmp / f"{name}.ready.json"
    args = [sys.executable, "-m", "polar_hpc", "proxy", launch(gateway, engine_url, name, **options).argument(),
            "--ready-file", str(ready)]
    proc = subprocess.Popen(args, stderr=open(tmp / f"{name}.log", "w"))
    url = wait_ready(proc, ready)
    hello = gateway.expect(wire.ProxyHello)
    assert hello == wire.ProxyHello(proxy_id=name, url=url)
    return Proxy(proc, name, url, gateway, tmp / f"{name}.log")


def sample_for(log: Path, rid: str) -> dict:
    """The engine's own sample-log line for the response id `rid`."""
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry["rid"] == rid:
            return entry
    raise AssertionError(f"engine logged no sample {rid}")


class FakeEngine:
    """A stand-in engine on a real socket; every POST is answered according to `mode`:
    "hang" never answers and sets `aborted` once the proxy drops the connection; "error" answers
    HTTP 500; "bare" answers a chat.completion without token ids; "drop" closes the connection.
    A GET (its path noted in `gets`) is answered 404."""

    def __init__(self) -> None:
        self.mode = "hang"
        self.received = threading.Event()
        self.aborted = threading.Event()
        self.gets: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            while True:
                head = [f.readline()]
                while head[-1] not in (b"\r\n", b""):
                    head.append(f.readline())
                if head[-1] == b"":
                    return
                if head[0].startswith(b"GET "):
                    self.gets.append(head[0].split()[1].decode())
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                sizes = [h.split(b":")[1] for h in head if h.lower().startswith(b"content-length")]
                length = int(sizes[0])
                f.read(length)
                self.received.set()
                if self.mode == "hang":
                    while conn.recv(1):
                        pass
                    self.aborted.set()
                    return
                if self.mode == "drop":
                    return
                status, body = (500, {"message": "boom"}) if self.mode == "error" else (200, {
                    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hi"}}],
                })
                data = json.dumps(body).encode()
                conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (status, len(data), data))

    def close(self) -> None:
        self._server.close()


def check_capture(record: wire.CallRecord, log: Path) -> dict:
    """The record's ids and logprobs are exactly what the engine sampled; returns the sample."""
    sample = sample_for(log, record.meta["rid"])
    assert record.prompt_ids == sample["input_ids"]
    assert record.output_ids == sample["output_ids"]
    assert record.output_logprobs == sample["output_logprobs"]
    assert record.weight_version == sample["weight_version"]
    return sample


def extends(later: wire.CallRecord, earlier: wire.CallRecord) -> bool:
    """`later`'s prompt starts with `earlier`'s prompt + sampled ids (one trace when merged)."""
    done = earlier.prompt_ids + earlier.output_ids
    return later.prompt_ids[: len(done)] == done and len(later.prompt_ids) > len(done)
