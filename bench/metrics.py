"""What metrics cost the proxy: throughput with metrics on and off, on the same scripted engine, in one run.

One scripted engine and two tito proxies in front of it, alike but for their launch's
`metrics_s` (`wire.ProxyLaunch`): `on` counts every call and sends a snapshot every second (as a run with
`metrics.enabled: true` does; a snapshot also goes at each session's close, which this bench's
stand-in gateway never asks for), `off` counts nothing (`metrics.enabled: false`). Both ship a
CallRecord per call (with its engine and proxy milliseconds) to the stand-in gateway of
bench/rounds.py. At each concurrency C, a round runs max(C, 64) one-call sessions per proxy in
waves of C taken in turn (`bench/rounds.run_round`: each proxy alone, the order drawn afresh for
each wave, so host load drift hits both alike). Figures, each the median over rounds:
`on_calls_per_s`, `off_calls_per_s`, `throughput_ratio` (on / off within a
round; goal >= 0.98), `on_p50_ms`, `off_p50_ms`, `on_cpu_ms`, `off_cpu_ms` (the proxy process's CPU
time per call, steadier than throughput on a shared machine, where the engine and this load
generator share the CPUs with the proxy) and `cpu_ratio` (on / off within a round: what counting
adds to the proxy's own work). Last line: one JSON object {"c1": {...},
"c64": {...}, "seed": ..., "load": [1, 5, 15 min load averages]}.

    uv run python bench/metrics.py [--concurrency 1 64] [--rounds 9] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from polar_hpc import procs
from rounds import Gateway, positive, proxy_args, run_round, start  # bench/rounds.py

TARGETS = {"on": 1.0, "off": 0.0}  # proxy id: its snapshot interval (0: metrics off)
MIN_SESSIONS = 64


def _asker(url: str):
    """One session of a proxy: one call, its latency appended to out["latencies"]."""
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 17 * 23 + 4?"}]}

    async def ask(http: aiohttp.ClientSession, token: str, out: dict) -> None:
        t0 = time.perf_counter()
        async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as resp:
            answer = await resp.json()
        out["latencies"].append(time.perf_counter() - t0)
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {answer}")
    return ask


def _round(urls: dict[str, str], pids: dict[str, int], tokens: dict[str, list[str]], c: int,
           rng: random.Random) -> dict[str, dict[str, float]]:
    done = asyncio.run(run_round({name: _asker(url) for name, url in urls.items()}, tokens, c, rng,
                                 {name: {"cpu_s": pid} for name, pid in pids.items()}))
    return {name: {"calls_per_s": len(r["latencies"]) / r["wall"], "p50_ms": statistics.median(r["latencies"]) * 1000,
                   "cpu_ms": r["cpu_s"] / len(r["latencies"]) * 1000}
            for name, r in done.items()}


def _figures(rounds: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    def median(fn) -> float:
        return round(statistics.median(fn(r) for r in rounds), 3)

    out = {f"{name}_{k}": median(lambda r, n=name, k=k: r[n][k]) for name in TARGETS for k in ("calls_per_s", "p50_ms", "cpu_ms")}
    out["throughput_ratio"] = median(lambda r: r["on"]["calls_per_s"] / r["off"]["calls_per_s"])
    out["cpu_ratio"] = median(lambda r: r["on"]["cpu_ms"] / r["off"]["cpu_ms"])
    return out


def cost(concurrency: list[int], rounds: int, seed: int) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="mxb") as d:
        tmp = Path(d)
        engine, engine_url = start("engine", ["engine", "--kind", "scripted", "--port", "0"], tmp)
        gateway, children, urls, pids = Gateway(f"ipc://{tmp}/gw.ipc"), [engine], {}, {}
        results: dict = {}
        try:
            for proxy_id, every_s in TARGETS.items():
                child, url = start(proxy_id, proxy_args(proxy_id, tmp, engine_url, "tito", metrics_s=every_s), tmp)
                children.append(child)
                pids[proxy_id] = child.proc.pid
                urls[proxy_id] = url + "/v1/chat/completions"
            expected = 0
            for c in concurrency:
                n, measured = max(c, MIN_SESSIONS) + 1, []
                for round_ in range(rounds):
                    tokens = {name: [f"{name}-c{c}-{round_}-{i}" for i in range(n)] for name in urls}
                    for name in urls:
                        gateway.open(name, tokens[name])
                        expected += n
                    measured.append(_round(urls, pids, tokens, c, rng))
                results[f"c{c}"] = _figures(measured)
                print(f"c={c}: {json.dumps(results[f'c{c}'])}", file=sys.stderr, flush=True)
            gateway.wait_records(expected)
        finally:
            gateway.close()
            procs.stop(children[::-1])
    results["seed"] = seed
    results["load"] = [round(x, 2) for x in os.getloadavg()]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=positive, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=positive, default=9, help="Rounds per concurrency.")
    parser.add_argument("--seed", type=int, default=random.randrange(2**31), help="Seeds the order of the waves.")
    args = parser.parse_args()
    print(json.dumps(cost(args.concurrency, args.rounds, args.seed)))


if __name__ == "__main__":
    main()
