"""What the proxy adds to a call, next to sglang-router, on the same scripted engine, in one run.

One scripted engine; three ways to reach it: directly (its /v1/chat/completions), through the
polar-hpc proxy (tito mode by default: the proxy renders with the model's tokenizer, streams from
/generate, parses tool calls and ships a CallRecord per call to a stand-in gateway), and through
sglang-router (`python -m sglang_router.launch_router`, cache_aware policy, forwarding the same chat
route). At each concurrency C, C sessions run at once, each a two-call calculator conversation (a
tool call, then the answer with the history re-sent). Per call latency percentiles and calls/s per
target, pooled over `--rounds` interleaved rounds; "added" figures are the target's percentile
minus the direct one. Run it on a quiet machine: every process shares its CPUs. Last line: one JSON
object {"c1": {...}, "c64": {...}, "c256": {...}}.

    uv run python bench/proxy.py [--concurrency 1 64 256] [--mode tito|passthrough] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import zmq

from polar_hpc import procs, wire

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


class Gateway:
    """The proxy's peer: opens sessions, heartbeats, and counts the records it is sent."""

    def __init__(self, endpoint: str) -> None:
        self.records = 0
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.bind(endpoint)
        self._peer: bytes | None = None
        self._opened: set[str] = set()
        self._todo: list[wire.Message] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        beat = wire.encode(wire.Heartbeat("gateway", 0.0))
        last = 0.0
        while not self._done.is_set():
            if self._sock.poll(10):
                self._peer, data = self._sock.recv_multipart()
                message = wire.decode(data)
                if isinstance(message, wire.CallRecord):
                    self.records += 1
                elif isinstance(message, wire.SessionOpened):
                    with self._lock:
                        self._opened.add(message.session_id)
            if self._peer is None:
                continue
            with self._lock:
                todo, self._todo = self._todo, []
            for message in todo:
                self._sock.send_multipart([self._peer, wire.encode(message)])
            if time.monotonic() - last > 0.3:
                self._sock.send_multipart([self._peer, beat])
                last = time.monotonic()
        self._sock.close(linger=0)
        self._ctx.term()

    def open(self, tokens: list[str]) -> None:
        with self._lock:
            self._todo += [wire.OpenSession(session_id=t, token=t) for t in tokens]
        deadline = time.monotonic() + 30
        while not set(tokens) <= self._opened:
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not open the sessions")
            time.sleep(0.01)

    def close(self) -> None:
        with self._lock:
            self._todo.append(wire.Shutdown(reason="bench done"))
        time.sleep(0.3)
        self._done.set()
        self._thread.join(timeout=5)


async def session(http: aiohttp.ClientSession, url: str, token: str, latencies: list[float]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    messages = [{"role": "user", "content": "What is 17 * 23 + 4?"}]
    for _ in range(2):
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


async def measure(url: str, tokens: list[str], latencies: list[float]) -> float:
    """Run one session per token at once; add each call's latency; return the wall time."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await session(http, url, tokens[0], [])  # warm the connection and the caches
        t0 = time.perf_counter()
        await asyncio.gather(*(session(http, url, t, latencies) for t in tokens))
        return time.perf_counter() - t0


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50_ms": statistics.median(latencies) * 1000, "p99_ms": q[98] * 1000,
            "calls_per_s": len(latencies) / wall}


def start(name: str, args: list[str], tmp: Path) -> tuple[procs.Child, str]:
    ready = tmp / f"{name}.ready"
    child = procs.spawn(name, args + ["--ready-file", str(ready)], tmp / f"{name}.log")
    return child, procs.wait_ready(child, ready)["url"]


def start_router(engine_url: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
         str(port), "--worker-urls", engine_url, "--policy", "cache_aware", "--log-level", "warn"],
        stdout=open(tmp / "router.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            import urllib.request

            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not start: {(tmp / 'router.log').read_text()}")
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--mode", default="tito", choices=["tito", "passthrough"])
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds per target.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pxb") as d:
        tmp = Path(d)
        engine, engine_url = start("engine", ["engine", "--kind", "scripted", "--port", "0"], tmp)
        gateway = Gateway(f"ipc://{tmp}/gw.ipc")
        proxy, proxy_url = start("proxy", ["proxy", "--gateway", f"ipc://{tmp}/gw.ipc",
                                           "--engine-url", engine_url, "--mode", args.mode], tmp)
        router, router_url = start_router(engine_url, tmp)
        targets = {name: url + "/v1/chat/completions" for name, url in (
            ("direct", engine_url), ("proxy", proxy_url), ("router", router_url))}
        figures = {}
        try:
            for c in args.concurrency:
                latencies: dict[str, list[float]] = {name: [] for name in targets}
                walls = dict.fromkeys(targets, 0.0)
                for round_ in range(args.rounds):  # interleaved, so load drifts hit all alike
                    for name, url in targets.items():
                        tokens = [f"c{c}-{round_}-{i}" for i in range(c)]
                        if name == "proxy":
                            gateway.open(tokens)
                        walls[name] += asyncio.run(measure(url, tokens, latencies[name]))
                got = {name: summary(latencies[name], walls[name]) for name in targets}
                d, p, r = got["direct"], got["proxy"], got["router"]
                figures[f"c{c}"] = {
                    "direct_p50_ms": round(d["p50_ms"], 2), "proxy_p50_ms": round(p["p50_ms"], 2),
                    "router_p50_ms": round(r["p50_ms"], 2),
                    "proxy_added_p50_ms": round(p["p50_ms"] - d["p50_ms"], 2),
                    "proxy_added_p99_ms": round(p["p99_ms"] - d["p99_ms"], 2),
                    "router_added_p50_ms": round(r["p50_ms"] - d["p50_ms"], 2),
                    "router_added_p99_ms": round(r["p99_ms"] - d["p99_ms"], 2),
                    "proxy_throughput_ratio": round(p["calls_per_s"] / d["calls_per_s"], 3),
                    "router_throughput_ratio": round(r["calls_per_s"] / d["calls_per_s"], 3),
                }
                print(f"c={c}: {json.dumps(figures[f'c{c}'])}", file=sys.stderr, flush=True)
            expected = sum(2 * (c + 1) * args.rounds for c in args.concurrency)
            if gateway.records != expected:
                raise RuntimeError(f"the proxy recorded {gateway.records} calls, not {expected}")
        finally:
            gateway.close()
            router.terminate()
            router.wait(timeout=10)
            procs.stop([proxy, engine])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
