"""What the proxy adds to a call, next to sglang-router, on the same scripted engine, in one run.

One scripted engine; four ways to reach it: directly (its /v1/chat/completions), through the
polar-hpc proxy in tito mode (the proxy renders with the model's tokenizer, calls /generate, parses
tool calls and ships a CallRecord per call to a stand-in gateway), through a second proxy in
passthrough mode, and through sglang-router (`python -m sglang_router.launch_router`, cache_aware
policy, forwarding the same chat route). At each concurrency C, a round runs max(C, 64) sessions per
target, C at a time, each a two-call calculator conversation (a tool call, then the answer with the
history re-sent). At C=1 the targets take turns session by session within the round, in a fresh
order each time (the host's state drifts within a fraction of a second, by more than a target adds,
so only turns this short compare like with like); at C>1 each target runs its sessions alone. Each
round starts with the next target in turn (so none always runs first or last). Each figure is the
median over rounds of that round's per-call latency percentile or calls/s; "added" figures are a
target's percentile minus the direct one in the same round. `*_cpu_ms` is the time the threads of
the proxy or router process ran on a CPU per call, and `*_engine_cpu_ms` the engine's, while the
target ran (so the whole cost of a call on each path is their sum). Run it on a quiet machine: every
process shares its CPUs. Last line: one JSON object {"c1": {...}, "c64": {...}, "c256": {...}}.

    uv run python bench/proxy.py [--concurrency 1 64 256] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import queue
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import zmq

from polar_hpc import procs, wire

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
MIN_SESSIONS = 64  # per round, so that even C=1 yields enough calls for percentiles
CALLS = 2  # per session
PROXIES = {"proxy": "tito", "passthrough": "passthrough"}  # target name (the proxy's id): mode


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
        if sock.poll(10):
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


async def session(http: aiohttp.ClientSession, url: str, token: str, latencies: list[float]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    messages = [{"role": "user", "content": "What is 17 * 23 + 4?"}]
    for _ in range(CALLS):
        t0 = time.perf_counter()
        async with http.post(url, json={"model": "m", "messages": messages, "tools": TOOLS},
                             headers=headers) as resp:
            answer = await resp.json()
        latencies.append(time.perf_counter() - t0)
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {answer}")
        message = answer["choices"][0]["message"]
        messages = messages + [message]
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "395"})


async def measure(targets: dict[str, str], tokens: dict[str, list[str]], c: int,
                  pids: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """One round: each target's sessions (one per token after the first, which warms the connection
    and the caches), `c` at a time. At c=1 the targets take turns session by session, in an order
    drawn afresh for each session, so that what the host does meanwhile hits them alike; at c>1
    each target runs its sessions alone (together they would share the engine). Per target:
    latency percentiles, calls/s while it ran, and for each figure name: pid in `pids[target]`,
    that process's CPU time per call (ms)."""
    latencies: dict[str, list[float]] = {name: [] for name in targets}
    wall = dict.fromkeys(targets, 0.0)
    cpu = {name: dict.fromkeys(pids[name], 0.0) for name in targets}  # figure name: CPU seconds
    n = len(next(iter(tokens.values())))
    if c == 1:
        turns = random.Random(n)  # a fresh order for each session, so no target always follows another
        stints = [(name, [tokens[name][i]]) for i in range(1, n)
                  for name in turns.sample(list(targets), len(targets))]
    else:
        stints = [(name, tokens[name][1:]) for name in targets]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for name, url in targets.items():
            await session(http, url, tokens[name][0], [])
        for name, stint in stints:
            gate = asyncio.Semaphore(c)
            used = {figure: cpu_s(pid) for figure, pid in pids[name].items()}
            t0 = time.perf_counter()
            await asyncio.gather(*(gated(gate, session(http, targets[name], t, latencies[name]))
                                   for t in stint))
            wall[name] += time.perf_counter() - t0
            for figure, t in used.items():
                cpu[name][figure] += cpu_s(pids[name][figure]) - t
    out = {}
    for name, got in latencies.items():
        q = statistics.quantiles(got, n=100, method="inclusive")
        out[name] = {"p50": statistics.median(got) * 1000, "p99": q[98] * 1000,
                     "calls_per_s": len(got) / wall[name],
                     **{figure: t * 1000 / len(got) for figure, t in cpu[name].items()}}
    return out


async def gated(gate: asyncio.Semaphore, work: Coroutine[Any, Any, None]) -> None:
    async with gate:
        await work


def cpu_s(pid: int) -> float:
    """Seconds a process's live threads have run on a CPU so far (Linux schedstat, ns-exact)."""
    return sum(int((task / "schedstat").read_text().split()[0])
               for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, args: list[str], tmp: Path) -> tuple[procs.Child, str]:
    ready = tmp / f"{name}.ready"
    child = procs.spawn(name, args + ["--ready-file", str(ready)], tmp / f"{name}.log")
    return child, procs.wait_ready(child, ready)["url"]


def start_router(engine_url: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
         str(port), "--worker-urls", engine_url, "--policy", "cache_aware", "--log-level", "warn",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=open(tmp / "router.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not start: {(tmp / 'router.log').read_text()}") from None
            time.sleep(0.2)


def figures(rounds: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Medians over rounds; added latency and throughput relative to the same round's direct."""
    def median(fn) -> float:
        return round(statistics.median(fn(r) for r in rounds), 3)

    out = {"direct_p50_ms": median(lambda r: r["direct"]["p50"]),
           "direct_engine_cpu_ms": median(lambda r: r["direct"]["engine_cpu_ms"])}
    for name in ("proxy", "passthrough", "router"):
        out[f"{name}_p50_ms"] = median(lambda r, n=name: r[n]["p50"])
        out[f"{name}_added_p50_ms"] = median(lambda r, n=name: r[n]["p50"] - r["direct"]["p50"])
        out[f"{name}_added_p99_ms"] = median(lambda r, n=name: r[n]["p99"] - r["direct"]["p99"])
        out[f"{name}_throughput_ratio"] = median(
            lambda r, n=name: r[n]["calls_per_s"] / r["direct"]["calls_per_s"])
        out[f"{name}_cpu_ms"] = median(lambda r, n=name: r[n]["cpu_ms"])
        out[f"{name}_engine_cpu_ms"] = median(lambda r, n=name: r[n]["engine_cpu_ms"])
    return out


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=positive, nargs="+", default=[1, 64, 256])
    parser.add_argument("--rounds", type=positive, default=15, help="Interleaved rounds per concurrency.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pxb") as d:
        tmp = Path(d)
        engine, engine_url = start("engine", ["engine", "--kind", "scripted", "--port", "0"], tmp)
        gateway = Gateway(f"ipc://{tmp}/gw.ipc")
        children, targets = [engine], {"direct": engine_url}
        watched = {"direct": {"engine_cpu_ms": engine.proc.pid}}  # target: {figure: process}
        router = None
        try:
            for proxy_id, mode in PROXIES.items():
                child, targets[proxy_id] = start(proxy_id, [
                    "proxy", "--gateway", f"ipc://{tmp}/gw.ipc", "--engine-url", engine_url,
                    "--mode", mode, "--proxy-id", proxy_id], tmp)
                children.append(child)
                watched[proxy_id] = {"cpu_ms": child.proc.pid, "engine_cpu_ms": engine.proc.pid}
            router, targets["router"] = start_router(engine_url, tmp)
            watched["router"] = {"cpu_ms": router.pid, "engine_cpu_ms": engine.proc.pid}
            results, expected = {}, 0
            for c in args.concurrency:
                n = max(c, MIN_SESSIONS) + 1  # the first session warms up
                rounds = []
                names = list(targets)
                for round_ in range(args.rounds):  # interleaved, so load drifts hit all alike
                    order = names[round_ % len(names):] + names[: round_ % len(names)]
                    tokens = {name: [f"{name}-c{c}-{round_}-{i}" for i in range(n)] for name in order}
                    for name in PROXIES:
                        gateway.open(name, tokens[name])
                        expected += CALLS * n
                    rounds.append(asyncio.run(measure(
                        {name: targets[name] + "/v1/chat/completions" for name in order}, tokens, c,
                        watched)))
                results[f"c{c}"] = figures(rounds)
                print(f"c={c}: {json.dumps(results[f'c{c}'])}", file=sys.stderr, flush=True)
            gateway.wait_records(expected)
        finally:
            gateway.close()
            if router is not None:
                router.terminate()
                router.wait(timeout=10)
            procs.stop(children[::-1])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
