"""The engine step of a Slurm run (`polar-hpc engine --kind KIND --run-dir RUN [--tag TAG]`), one per
GPU node of the run's job or of a grow job (launch/member.py).

It starts the node's engine servers (SGLang, vLLM: one per `tp_size` GPUs of the node, server i on
port `engine.port + i` with its own slice of CUDA_VISIBLE_DEVICES (`split_devices`), vLLM's cache in
`<run>/cache/engine-TAG-i`; scripted: one, on the CPU, with the command line `polar-hpc run` gives
it (engines.command); `engines.kinds` says how each kind starts),
refusing a port another process already listens on, waits until each answers GET /health, checks
that it is the server it started (`identity.check`: it demands the run's key, and only that one),
readies it (`launch.ready`: vLLM's version label set to `engine.weight_version`), registers each
URL and weight version (engine id `TAG-i`; TAG, default the node, also names the
servers' logs `logs/engine-TAG[-i].log` and caches) with the orchestrator
found through `<run>/rendezvous.json` (EngineHello, over CURVE with the run's engine key), heartbeats,
and on Shutdown from the orchestrator or SIGTERM/SIGINT deregisters (EngineBye) and stops the
servers (SIGUSR1/SIGUSR2 are trapped and left to the driver). A server that
exits takes the step down with code 1 (the driver restarts the step); stopping is SIGTERM to each
server's process group, SIGKILL after the stop budget (`procs.stop_budget`, else STOP_GRACE_S).
The servers get the run's engine API key in their
environment and demand it on every route but /health. Anything else the
orchestrator sends (a malformed message included) is logged and skipped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import zmq

from polar_hpc import procs, security, wire
from polar_hpc.config import Topology, load_topology
from polar_hpc.errors import ChildFailed
from polar_hpc.engines import command, identity, kinds

STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL to what is left of a server's process group


def run_step(kind: str, run_dir: Path, tag: str | None = None) -> int:
    kinds.get(kind)  # an unknown kind: ConfigError
    topology = load_topology(run_dir / "topology.yaml")
    host = socket.gethostname()
    node = os.environ.get("SLURMD_NODENAME", host)
    tag = tag or node  # names its engines, logs and caches: a grow job's differ from the run's own on one node
    print(f"engine step {tag} on {node}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}", flush=True)
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):  # Slurm's --signal may reach every step: the driver acts on it
        signal.signal(sig, lambda signum, _frame: print(f"signal {signum}: left to the driver", flush=True))
    sock = None
    servers: list[tuple[procs.Child, int]] = []
    try:
        _start_servers(kind, topology, run_dir, tag, security.engine_env(run_dir), servers)
        urls = [_wait_healthy(child, port, host, topology, stopping) for child, port in servers]
        key, launch = security.engine_api_key(run_dir), kinds.get(kind).launch
        for (child, port), url in zip(servers, urls):
            why = identity.check(f"http://127.0.0.1:{port}", key) if url and key else None
            if why is not None:
                raise ChildFailed(f"{child.name}: not registered, it cannot prove it is this run's engine: {why}")
            errors = launch.ready(f"http://127.0.0.1:{port}", topology.engine.weight_version, key) if url and launch else []
            if errors:
                raise ChildFailed(f"{child.name}: not registered, its weight version was not set: {'; '.join(errors)}")
        sock = _connect(run_dir, stopping)
        if sock is None:
            return 0
        for i, url in enumerate(urls):
            hello = wire.EngineHello(engine_id=f"{tag}-{i}", url=url, weight_version=topology.engine.weight_version,
                                     host=host)
            sock.send(wire.encode(hello))
        print(f"registered {', '.join(urls)}", flush=True)
        while not stopping:
            for child, _ in servers:
                if child.proc.poll() is not None:
                    print(f"{child.name} exited with code {child.proc.returncode}:\n{child.tail()}", flush=True)
                    return 1
            sock.send(wire.encode(wire.Heartbeat(sender=tag, t=time.time())))
            if sock.poll(int(topology.gateway.heartbeat_s * 1000)) and _shutdown(sock):
                break
        return 0
    finally:
        if sock is not None:
            for i in range(len(servers)):
                sock.send(wire.encode(wire.EngineBye(engine_id=f"{tag}-{i}")))
            sock.close(linger=1000)
        procs.stop([child for child, _ in servers], grace_s=procs.stop_budget(STOP_GRACE_S))


def _start_servers(kind: str, topology: Topology, run_dir: Path, tag: str, base_env: dict[str, str],
                   servers: list[tuple[procs.Child, int]]) -> None:
    """Start the step's servers, appending each to `servers` as it starts (so all are stopped)."""
    engine, logs, launch = topology.engine, run_dir / "logs", kinds.get(kind).launch
    if launch is None:  # the scripted engine: one CPU server
        port = _free_port()
        args = command.scripted(engine, run_dir, port=port, host="0.0.0.0", node=tag)
        servers.append((procs.spawn(f"engine-{tag}", args, logs / f"engine-{tag}.log", base_env), port))
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    for i, devices in enumerate(split_devices(visible, topology.slurm.gpu.gpus, engine.tp_size)):
        env = launch.environment(base_env, run_dir / "cache" / f"engine-{tag}-{i}")
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        port = engine.port + i
        if identity.port_taken(port):
            raise ChildFailed(f"{kind} server {i}: port {port} (engine.port + {i}) on {tag} is already taken "
                                    "by another process; this run serves only an engine it started: free the port "
                                    "or set engine.port")
        argv = launch.command(engine, "0.0.0.0", port)
        try:
            servers.append((procs.spawn_command(f"{kind}-{tag}-{i}", argv, logs / f"engine-{tag}-{i}.log", env), port))
        except OSError as e:  # engine.python missing or not executable
            raise ChildFailed(f"{kind} server {i}: cannot run {argv[0]}: {e.strerror}") from None


def split_devices(visible: str | None, gpus: int, tp_size: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each server of the node (None: leave the variable as it is)."""
    devices = [d for d in (visible or "").split(",") if d] or [str(i) for i in range(gpus)]
    if len(devices) < tp_size:
        return [visible]
    return [",".join(devices[i * tp_size:(i + 1) * tp_size]) for i in range(len(devices) // tp_size)]


def _shutdown(sock: zmq.Socket) -> bool:
    """Read what the orchestrator sent (heartbeats); True on Shutdown."""
    while sock.poll(0):
        try:
            if isinstance(wire.unpack(sock.recv_multipart(), 1), wire.Shutdown):
                return True
        except wire.BadMessage as e:
            print(f"ignoring a message from the orchestrator: {e}", flush=True)
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _wait_healthy(child: procs.Child, port: int, host: str, topology: Topology, stopping: list) -> str:
    deadline = time.monotonic() + topology.engine.startup_timeout_s
    while not stopping:
        child.check()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return f"http://{host}:{port}"
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ChildFailed(f"{child.name}: no /health after {topology.engine.startup_timeout_s:.0f}s")
        time.sleep(0.5)
    return ""


def _connect(run_dir: Path, stopping: list) -> zmq.Socket | None:
    path = run_dir / "rendezvous.json"
    while not path.exists() and not stopping:
        time.sleep(0.2)
    if stopping:
        return None
    sock = zmq.Context.instance().socket(zmq.DEALER)
    security.secure_client(sock, run_dir, security.ENGINE)
    sock.connect(json.loads(path.read_text())["endpoint"])
    return sock


def main(kind: str, run_dir: Path, tag: str | None = None) -> None:
    try:
        code = run_step(kind, run_dir, tag)
    except ChildFailed as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = 1
    raise SystemExit(code)
