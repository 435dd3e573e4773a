"""What the proxy adds to a call on a real vLLM, like for like, in one run.

A running vLLM (`--engine-url`; serve it as tests/vllm/conftest.py does: `SERVE_FLAGS`, the served
name `--model`); four targets reach it, each with the same conversations, greedy, the same
`--max-tokens` (so every target makes vLLM do the same work):
- `tito`: a polar-hpc proxy in tito mode (`--engine-kind vllm`): it renders with the model's
  template, calls vLLM's /inference/v1/generate with the token ids (served with
  `--enable-scale-out`) and ships a CallRecord per call to a stand-in gateway; `direct_tito`: this
  process renders with the same template (the proxy's `Renderer`) and sends the same request (the
  proxy's vLLM client builds it) to the same route.
- `passthrough`: a proxy in passthrough mode (vLLM's /v1/chat/completions with `return_token_ids`
  and `logprobs`); `direct_chat`: the same route with the same fields, called directly.
A session is two calls (the answer, then the history re-sent with one more user turn). At each
concurrency C, a round runs `--sessions` sessions per target, in waves of C sessions at a time;
the targets take turns wave by wave, in an order drawn afresh for each wave from the printed seed
(`bench/rounds.py`), so the host's load drifts hit all targets alike (at C=1 they take turns
session by session). Rounds are repeated `--rounds` times. Figures, each the median over rounds:
- `<target>_p50_ms`: the round's median per-call latency (request sent to answer read whole);
- `tito_ratio` = tito_p50 / direct_tito_p50 and `passthrough_ratio` = passthrough_p50 /
  direct_chat_p50, each taken within a round (goal: <= 1.10);
- `<proxy>_tokens_per_s`: sampled tokens the proxy captured (recorded ids) per second of the
  target's wall time in the round; `<proxy>_cpu_ms`: CPU time of the proxy process per call.
Each round's figures go to stderr as it ends (a stall shows there). Last line: one JSON object
{"c1": {...}, "c8": {...}, "load": [1, 5, 15 min load averages], "seed": N}.

    uv run python bench/engine.py --engine-url http://127.0.0.1:PORT [--concurrency 1 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

from polar_hpc import procs
from polar_hpc.engines.capture import Sampling
from polar_hpc.engines.vllm import client as vllm_client
from polar_hpc.proxy.tito import Renderer
from rounds import Gateway, positive, proxy_args, run_round, start  # bench/rounds.py

ASK = "What is 17 * 23 + 4?"
PROXIES = {"tito": "tito", "passthrough": "passthrough"}  # target name (the proxy's id): mode
PAIRS = {"tito": "direct_tito", "passthrough": "direct_chat"}


class Caller:
    """One target's way to ask one conversation turn; returns (latency s, reply text, sampled n)."""

    def __init__(self, kind: str, url: str, model: str, max_tokens: int, renderer: Renderer) -> None:
        self.kind, self.url, self.model, self.max_tokens, self.renderer = kind, url, model, max_tokens, renderer

    async def ask(self, http: aiohttp.ClientSession, token: str, messages: list[dict]) -> tuple[float, str, int]:
        headers = {"Authorization": f"Bearer {token}"}
        t0 = time.perf_counter()
        if self.kind == "direct_tito":  # the proxy's work, without the proxy: render, send ids
            ids = self.renderer.encode(self.renderer.text(messages, None, True))
            path, body = vllm_client.generate(ids, Sampling(self.max_tokens, temperature=0.0), False, f"d{time.time_ns()}")
        else:
            body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens, "temperature": 0}
            if self.kind == "direct_chat":
                body.update(logprobs=True, return_token_ids=True)
            path = "/v1/chat/completions"
        async with http.post(self.url + path, json=body, headers=headers) as resp:
            answer = await resp.json()
        latency = time.perf_counter() - t0
        if resp.status != 200:
            raise RuntimeError(f"{self.kind}: HTTP {resp.status}: {answer}")
        choice = answer["choices"][0]
        text = choice["text"] if self.kind == "direct_tito" else choice["message"]["content"] or ""
        return latency, text, answer["usage"]["completion_tokens"]


async def session(caller: Caller, http, token: str, out: dict) -> None:
    messages = [{"role": "user", "content": ASK}]
    for turn in range(2):
        latency, text, n = await caller.ask(http, token, messages)
        out["latencies"].append(latency)
        out["tokens"] += n
        messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": f"And {turn}?"}]


def figures(rounds: list[dict[str, dict]]) -> dict[str, float]:
    def median(fn) -> float:
        return round(statistics.median(fn(r) for r in rounds), 3)

    def p50(r, name) -> float:
        return statistics.median(r[name]["latencies"]) * 1000

    out = {f"{name}_p50_ms": median(lambda r, name=name: p50(r, name)) for name in rounds[0]}
    for name, direct in PAIRS.items():
        out[f"{name}_ratio"] = median(lambda r, name=name, direct=direct: p50(r, name) / p50(r, direct))
        out[f"{name}_tokens_per_s"] = median(lambda r, name=name: r[name]["tokens"] / r[name]["wall"])
        out[f"{name}_cpu_ms"] = median(lambda r, name=name: r[name]["cpu"] * 1000 / len(r[name]["latencies"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-url", required=True, help="A running vLLM, before /v1.")
    parser.add_argument("--model", default="polar-scripted", help="Its served model name.")
    parser.add_argument("--concurrency", type=positive, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=positive, default=3)
    parser.add_argument("--sessions", type=positive, default=16, help="Per target and round.")
    parser.add_argument("--max-tokens", type=positive, default=32)
    parser.add_argument("--seed", type=int, help="Of the order targets take turns in (default: drawn, printed).")
    args = parser.parse_args()
    url = args.engine_url.rstrip("/")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"seed {seed}", file=sys.stderr, flush=True)
    rng = random.Random(seed)
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        renderer = Renderer(json.loads(r.read())["data"][0]["root"])
    with tempfile.TemporaryDirectory(prefix="enb") as d:
        tmp = Path(d)
        gateway, children, pids = Gateway(f"ipc://{tmp}/gw.ipc"), [], {}
        callers = {"direct_tito": Caller("direct_tito", url, args.model, args.max_tokens, renderer),
                   "direct_chat": Caller("direct_chat", url, args.model, args.max_tokens, renderer)}
        try:
            gateway.wait_records(0)  # its process answers: it is bound before a proxy says hello
            for proxy_id, mode in PROXIES.items():
                child, proxy_url = start(proxy_id, proxy_args(
                    proxy_id, tmp, url, mode, engine_kind="vllm", model=args.model), tmp)
                children.append(child)
                pids[proxy_id] = {"cpu": child.proc.pid}
                callers[proxy_id] = Caller(proxy_id, proxy_url, args.model, args.max_tokens, renderer)
            results, expected = {}, 0
            for c in args.concurrency:
                rounds, names = [], list(callers)
                for round_ in range(args.rounds):
                    tokens = {name: [f"{name}-c{c}-{round_}-{i}" for i in range(args.sessions + 1)] for name in names}
                    for name in PROXIES:
                        gateway.open(name, tokens[name])
                        expected += 2 * (args.sessions + 1)
                    sessions = {name: functools.partial(session, callers[name]) for name in names}
                    rounds.append(asyncio.run(run_round(sessions, tokens, c, rng, pids)))
                    print(f"c={c} round {round_}: {json.dumps(figures(rounds[-1:]))}", file=sys.stderr, flush=True)
                results[f"c{c}"] = figures(rounds)
                print(f"c={c}: {json.dumps(results[f'c{c}'])}", file=sys.stderr, flush=True)
            gateway.wait_records(expected)
        finally:
            gateway.close()
            procs.stop(children[::-1])
    results["load"], results["seed"] = [round(x, 2) for x in os.getloadavg()], seed
    print(json.dumps(results))


if __name__ == "__main__":
    main()
