"""What bench/proxy.py and bench/engine.py share: interleaved rounds of sessions, and their plumbing.

`run_round(sessions, tokens, c, rng, pids)`: one round. `sessions[target](http, token, out)` runs one
session of that target, appending each call's latency (s) to `out["latencies"]` and adding the
tokens it sampled to `out["tokens"]`. Each target's sessions (one per token after its first, which
warms the connection and the caches) are cut into waves of `c`; the waves are taken in turn, all
targets' first waves (in an order `rng` draws afresh for each wave), then all second waves, and
so on, each wave's sessions `c` at a time. So the targets never share the engine, and what the host
does meanwhile (its load drifts by more than a target adds within a second or two) hits them
alike: at c=1 the targets take turns session by session. Per target it returns `latencies`,
`tokens`, `wall` (s the target's waves took) and, for each figure in `pids[target]` (figure: pid),
that process's CPU seconds while the target's waves ran.

`Gateway`: the proxies' peer in a process of its own, as a real gateway is. `start` spawns a
polar-hpc child and waits for its ready file; `pin(pid, cpus)` moves every thread of a process to
those CPUs (threads it starts later inherit them); `cpu_s(pid)`, `gated`, `positive`, `free_port`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import random
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import zmq

from polar_hpc import procs, wire

Session = Callable[[aiohttp.ClientSession, str, dict], Awaitable[None]]


async def run_round(sessions: dict[str, Session], tokens: dict[str, list[str]], c: int,
                    rng: random.Random, pids: dict[str, dict[str, int]]) -> dict[str, dict]:
    out = {name: {"latencies": [], "tokens": 0, "wall": 0.0, **dict.fromkeys(pids.get(name, {}), 0.0)}
           for name in sessions}
    n = len(next(iter(tokens.values()))) - 1
    waves = [(name, [tokens[name][1 + i + j] for j in range(min(c, n - i))])
             for i in range(0, n, c) for name in rng.sample(list(sessions), len(sessions))]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)  # a call may queue long at C=256
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        for name, session in sessions.items():
            await session(http, tokens[name][0], {"latencies": [], "tokens": 0})
        for name, wave in waves:
            gate, watched = asyncio.Semaphore(c), pids.get(name, {})
            used = {figure: cpu_s(pid) for figure, pid in watched.items()}
            t0 = time.perf_counter()
            await asyncio.gather(*(gated(gate, sessions[name](http, t, out[name])) for t in wave))
            out[name]["wall"] += time.perf_counter() - t0
            for figure, t in used.items():
                out[name][figure] += cpu_s(watched[figure]) - t
    return out


async def gated(gate: asyncio.Semaphore, work: Coroutine[Any, Any, None]) -> None:
    async with gate:
        await work


def cpu_s(pid: int) -> float:
    """Seconds a process's live threads have run on a CPU so far (Linux schedstat, ns-exact)."""
    return sum(int((task / "schedstat").read_text().split()[0])
               for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def pin(pid: int, cpus: set[int] | None) -> None:
    """Every thread of process `pid` (and those it starts later) on `cpus`; None: left as it is."""
    if cpus is not None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), cpus)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proxy_args(name: str, tmp: Path, engine_url: str, mode: str, engine_kind: str = "scripted",
               model: str = "polar-scripted", metrics_s: float = 0.0) -> list[str]:
    """`polar-hpc proxy`'s arguments for a proxy `name` of the Gateway at ipc://TMP/gw.ipc, as a
    gateway writes them (a topology's defaults but `mode`)."""
    launch = wire.ProxyLaunch(gateway=f"ipc://{tmp}/gw.ipc", engine_urls=[engine_url], model=model,
                              engine_kind=engine_kind, heartbeat_s=1.0, peer_timeout_s=10.0,
                              settings=wire.ProxySettings(mode=mode), proxy_id=name, metrics_s=metrics_s)
    return ["proxy", launch.argument()]


def start(name: str, args: list[str], tmp: Path) -> tuple[procs.Child, str]:
    ready = tmp / f"{name}.ready"
    child = procs.spawn(name, args + ["--ready-file", str(ready)], tmp / f"{name}.log")
    return child, procs.wait_ready(child, ready)["url"]


class Gateway:
    """The proxies' peer, in a process of its own as a real gateway is (so that taking records costs
    the load generator nothing): opens sessions, heartbeats, and counts the records it is sent."""

    def __init__(self, endpoint: str) -> None:
        mp = multiprocessing.get_context("spawn")
        self._commands, self._replies = mp.Queue(), mp.Queue()
        self._proc = mp.Process(target=_gateway, args=(endpoint, self._commands, self._replies), daemon=True)
        self._proc.start()

    def _ask(self, *command: object) -> None:
        self._commands.put(command)
        error = self._replies.get(timeout=60)
        if error is not None:
            raise error

    def open(self, proxy_id: str, tokens: list[str]) -> None:
        """Returns once the proxy `proxy_id` said hello and accepted every token."""
        self._ask("open", proxy_id, tokens)

    def wait_records(self, expected: int) -> None:
        """Records leave after the answers: wait for the last ones to arrive."""
        self._ask("wait", expected)

    def close(self) -> None:
        self._ask("close")
        self._proc.join(timeout=5)


def _gateway(endpoint: str, commands: multiprocessing.Queue, replies: multiprocessing.Queue) -> None:
    """The gateway process: serves the proxies on a ROUTER socket, and the bench's commands one at
    a time (each a generator that yields until it is done; a reply when it is, or an error after
    30 s), until "close"."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    peers: dict[str, bytes] = {}  # proxy id -> its ROUTER identity
    opened: set[str] = set()
    records = 0

    def open_sessions(proxy_id: str, tokens: list[str]) -> Iterator[None]:
        while proxy_id not in peers:
            yield
        for t in tokens:
            sock.send_multipart([peers[proxy_id], wire.encode(wire.OpenSession(session_id=t, token=t))])
        while not set(tokens) <= opened:
            yield

    def wait_records(expected: int) -> Iterator[None]:
        while records < expected:
            yield

    jobs = {"open": open_sessions, "wait": wait_records}
    beat, last = wire.encode(wire.Heartbeat("gateway", 0.0)), 0.0
    job, deadline = None, 0.0
    while True:
        if sock.poll(1 if job else 10):
            peer, data = sock.recv_multipart()
            message = wire.decode(data)
            if isinstance(message, wire.CallRecord):
                records += 1
            elif isinstance(message, wire.ProxyHello):
                peers[message.proxy_id] = peer
            elif isinstance(message, wire.SessionOpened):
                opened.add(message.session_id)
            continue
        if time.monotonic() - last > 0.3:
            for peer in peers.values():
                sock.send_multipart([peer, beat])
            last = time.monotonic()
        if job is None:
            try:
                kind, *args = commands.get_nowait()
            except queue.Empty:
                continue
            if kind == "close":
                break
            job, deadline = jobs[kind](*args), time.monotonic() + 30
        if next(job, "done") == "done":
            replies.put(None)
            job = None
        elif time.monotonic() > deadline:
            replies.put(RuntimeError(f"gateway: {kind} not done in 30 s ({records} records, "
                                     f"{len(peers)} proxies, {len(opened)} sessions open)"))
            job = None
    for peer in peers.values():
        sock.send_multipart([peer, wire.encode(wire.Shutdown(reason="bench done"))])
    time.sleep(0.3)
    replies.put(None)
    sock.close(linger=0)
    ctx.term()
