"""What metrics cost the proxy: throughput with metrics on and off, on the same scripted engine, in one run.

One scripted engine and two tito proxies in front of it, alike but for the environment variable
`polar_hpc.metrics.ENV`: `on` counts every call and sends a snapshot every second (as a run with
`metrics.enabled: true` does; a snapshot also goes at each session's close, which this bench's
stand-in gateway never asks for), `off` counts nothing (`metrics.enabled: false`). Both ship a
CallRecord per call (with its engine and proxy milliseconds) to the stand-in gateway of
bench/proxy.py. At each concurrency C, a round runs max(C, 64) one-call sessions per proxy, C at a
time, each proxy alone, the two in turn (which goes first alternates by round). Figures, each the
median over rounds: `on_calls_per_s`, `off_calls_per_s`, `throughput_ratio` (on / off within a
round; goal >= 0.98), `on_p50_ms`, `off_p50_ms`. Last line: one JSON object {"c1": {...},
"c64": {...}, "load": [1, 5, 15 min load averages]}. `cost(concurrency, rounds)` returns that
object (for bench/proxy.py to call).

    uv run python bench/metrics.py [--concurrency 1 64] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from polar_hpc import metrics, procs
from proxy import Gateway, gated, positive, start  # bench/proxy.py

TARGETS = {"on": "1", "off": "0"}  # proxy id: its snapshot interval (0: metrics off)
MIN_SESSIONS = 64


async def _ask(http: aiohttp.ClientSession, url: str, token: str, latencies: list[float]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 17 * 23 + 4?"}]}
    t0 = time.perf_counter()
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as resp:
        answer = await resp.json()
    latencies.append(time.perf_counter() - t0)
    if resp.status != 200:
        raise RuntimeError(f"{url}: HTTP {resp.status}: {answer}")


async def _round(urls: dict[str, str], tokens: dict[str, list[str]], c: int) -> dict[str, dict[str, float]]:
    out = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for name, url in urls.items():
            await _ask(http, url, tokens[name][0], [])  # warm the connection
            latencies: list[float] = []
            gate, t0 = asyncio.Semaphore(c), time.perf_counter()
            await asyncio.gather(*(gated(gate, _ask(http, url, t, latencies)) for t in tokens[name][1:]))
            wall = time.perf_counter() - t0
            out[name] = {"calls_per_s": len(latencies) / wall, "p50_ms": statistics.median(latencies) * 1000}
    return out


def _figures(rounds: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    def median(fn) -> float:
        return round(statistics.median(fn(r) for r in rounds), 3)

    out = {f"{name}_{k}": median(lambda r, n=name, k=k: r[n][k]) for name in TARGETS for k in ("calls_per_s", "p50_ms")}
    out["throughput_ratio"] = median(lambda r: r["on"]["calls_per_s"] / r["off"]["calls_per_s"])
    return out


def cost(concurrency: list[int], rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="mxb") as d:
        tmp = Path(d)
        engine, engine_url = start("engine", ["engine", "--kind", "scripted", "--port", "0"], tmp)
        gateway, children, urls = Gateway(f"ipc://{tmp}/gw.ipc"), [engine], {}
        results: dict = {}
        try:
            for proxy_id, every_s in TARGETS.items():
                os.environ[metrics.ENV] = every_s  # the proxy's environment: metrics on or off
                child, url = start(proxy_id, ["proxy", "--gateway", f"ipc://{tmp}/gw.ipc", "--engine-url",
                                              engine_url, "--mode", "tito", "--proxy-id", proxy_id], tmp)
                children.append(child)
                urls[proxy_id] = url + "/v1/chat/completions"
            expected = 0
            for c in concurrency:
                n, measured = max(c, MIN_SESSIONS) + 1, []
                for round_ in range(rounds):
                    order = list(urls) if round_ % 2 == 0 else list(urls)[::-1]
                    tokens = {name: [f"{name}-c{c}-{round_}-{i}" for i in range(n)] for name in order}
                    for name in order:
                        gateway.open(name, tokens[name])
                        expected += n
                    measured.append(asyncio.run(_round({name: urls[name] for name in order}, tokens, c)))
                results[f"c{c}"] = _figures(measured)
                print(f"c={c}: {json.dumps(results[f'c{c}'])}", file=sys.stderr, flush=True)
            gateway.wait_records(expected)
        finally:
            os.environ.pop(metrics.ENV, None)
            gateway.close()
            procs.stop(children[::-1])
    results["load"] = [round(x, 2) for x in os.getloadavg()]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=positive, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=positive, default=9, help="Rounds per concurrency, the order alternating.")
    args = parser.parse_args()
    print(json.dumps(cost(args.concurrency, args.rounds)))


if __name__ == "__main__":
    main()
