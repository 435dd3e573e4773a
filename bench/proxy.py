"""What the proxy adds to a call, like for like, next to sglang-router, on one scripted engine, in one run.

Five targets reach one scripted engine, each with the same conversations:
- `direct_chat`: the engine's own /v1/chat/completions (it renders, tokenizes, samples, parses).
- `passthrough`: a polar-hpc proxy in passthrough mode, and `router`: sglang-router
  (`python -m sglang_router.launch_router`, cache_aware), each forwarding to that same route: a
  hop in front of the same engine work, so `<hop>_added_*` (minus direct_chat) is the pure cost of
  the hop. The same engine work: passthrough asks the engine for the prompt's and the reply's
  token ids and the reply's logprobs (it records them), so the calls to all three targets ask for
  them (`logprobs`, `return_token_ids`); without, the engine did 5-15 % more CPU a call behind the
  proxy than behind the router or directly, which at 256 sessions queued in the engine and showed
  as the proxy's.
- `direct_tito`: this process does what a tito proxy does, without a proxy, with the proxy's own
  parts: it renders and tokenizes (`Renderer`, each session's history extended as a chain,
  `Chains`), calls the engine's /generate with the ids (the proxy's request), and parses the tool
  calls; `tito`: a proxy in
  tito mode (render, /generate, parse, and a CallRecord per call to a stand-in gateway). So
  `tito_added_*` (minus direct_tito) is the pure cost of capture through a proxy.
A session is a calculator conversation of `--questions` questions, two calls each (a tool call,
then the answer with the tool's result), the whole history re-sent each call, so prompts grow over
turns. Every session's conversation differs (its numbers and a system prompt of
`--context-words` words, drawn from the seed), so render and tokenize caches miss as in real runs;
the same session index gets the same conversation on every target. The seed (`--seed`, else drawn)
is printed first.

The engine decodes as a GPU engine does, in time rather than CPU: each token is due
`--token-delay-ms` (default 40) after the last, waited for, so a call takes about 0.5-1 s and at
256 sessions the engine's CPU (about 1 ms a call) is not the bottleneck (one session at a time
never makes it one: run C=1 with `--concurrency 1 --token-delay-ms 0`). (With no delay the engine
was: in a closed loop around a saturated engine, a hop's own delay is absorbed by the engine's
queue and what showed as "added" was the CPU the hop took from the engine, or noise, as the
negative figures of earlier runs were.)
Processes and CPUs (on at least 2 CPUs, unless `--no-pin`), as on a cluster where the proxy runs on
CPU nodes and the engine on GPU nodes: the hop under test (the passthrough proxy, sglang-router:
every thread of each) runs on the last CPU, `direct_chat`'s calls leaving it idle; the engine, this
process (the load generator, and direct_tito's rendering), the tito proxy (so that tito and
direct_tito do their work on the same CPUs) and the stand-in gateway (which takes the proxies'
records; on a cluster, a process of its own beside the proxy's) on the others. The hops never run
at the same time (below), so each has that CPU to itself.

At each concurrency C, a round runs max(C, `--sessions`) sessions per target in waves of C sessions at a
time, the targets taking turns wave by wave in an order drawn afresh for each wave
(`bench/rounds.py`: the host's load drifts hit all alike; the targets never share the engine).
Figures (per round, then the median over `--rounds` rounds):
- `<target>_p50_ms`, `<target>_p99_ms`: per-call latency (request sent to answer read whole),
  the whole path through that target;
- `<hop>_added_p50_ms`, `<hop>_added_p99_ms`: percentiles over calls of the hop's latency minus
  the direct pair's latency of the same call (same session index, same place in its conversation:
  the same work), and `<hop>_ratio`: its p50 over its pair's (hops: passthrough and router over
  direct_chat, tito over direct_tito); `passthrough_vs_router`: passthrough_added_p50_ms /
  router_added_p50_ms (goal: <= 1.5 at 64 and 256 sessions), null when the router's is not
  positive (then it is noise, and so is the ratio); `passthrough_over_router_p50_ms`: the median
  over calls of passthrough's latency minus the router's for the same call, defined whatever the
  sign (what passthrough adds beyond what the router adds);
- `<hop>_cpu_ms`: CPU time of the proxy's or router's process per call (steadier than wall time
  on a shared machine), beside `<target>_engine_cpu_ms`, the engine's, per call;
  `passthrough_vs_router_cpu`: passthrough_cpu_ms / router_cpu_ms, what each hop costs its CPU;
- `<target>_calls_per_s`: calls answered per second of the target's waves.
Also, once: `tito_first_call_ms`: a tito proxy spawned (tokenizer from the engine's folder) to its
first call answered, through ProxyHello and the session opened by the stand-in gateway, on an
engine of its own that decodes at once.
The load generator (this process, msgspec for JSON) also does direct_tito's rendering, so at high
concurrency direct_tito also pays for sharing its CPU with the load. Run it on a quiet machine.
Each round's figures go to stderr; last line: one JSON object {"seed": N, "pinned": bool,
"token_delay_ms": X, "tito_first_call_ms": X, "c64": {...}, "c256": {...}} (a key per C).

    uv run python bench/proxy.py [--concurrency 64 256] [--rounds 5] [--token-delay-ms 40] [--no-pin] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import msgspec

from polar_hpc import procs
from polar_hpc.engines import kinds
from polar_hpc.engines.capture import Sampling
from polar_hpc.engines.scripted.chat_format import ASSET_DIR
from polar_hpc.proxy.calls import Call, Outcome, ToolCall, assistant_message, new_id
from polar_hpc.proxy.tito import Chains, Renderer
from polar_hpc.proxy.tool_parsers import parser_for
from rounds import Gateway, free_port, pin, positive, proxy_args, run_round, start  # bench/rounds.py

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
PROXIES = {"tito": "tito", "passthrough": "passthrough"}  # target name (the proxy's id): mode
PAIRS = {"passthrough": "direct_chat", "router": "direct_chat", "tito": "direct_tito"}  # hop: direct
CAPTURE = {"logprobs": True, "return_token_ids": True}  # what passthrough asks the engine for (see the docstring)
HOPS = ("passthrough", "router")  # each alone on the hop's CPU when pinned
WORDS = "agent tool file line error test build patch diff commit branch module value result".split()
TOKEN_DELAY_MS = 40.0  # the engine's decoding time per token (see the docstring)
SCRIPTED = kinds.get("scripted").client  # the proxy's own client contract for the scripted engine


class Conversations:
    """The same conversation for the same session index on every target, a different one per index."""

    def __init__(self, seed: int, questions: int, words: int) -> None:
        self.seed, self.questions, self.words = seed, questions, words

    def plan(self, token: str) -> tuple[list[dict], list[tuple[int, int]]]:
        """The opening messages and, per question, (subtrahend, addend) for `token`'s session."""
        rng = random.Random(f"{self.seed}-{token.split('-', 1)[1]}")  # name-c-round-i: one per index
        system = " ".join(rng.choice(WORDS) for _ in range(self.words))
        return ([{"role": "system", "content": f"Session {rng.randrange(1 << 30)}. {system}"}],
                [(rng.randrange(1, 99), rng.randrange(1, 99)) for _ in range(self.questions)])


async def session(ask, conversations: Conversations, http: aiohttp.ClientSession, token: str, out: dict) -> None:
    """One conversation through `ask(http, token, messages) -> assistant message`; each call's
    latency goes to out["latencies"] and, keyed by (session index, call), to out["calls"]."""
    messages, steps = conversations.plan(token)
    value, index, calls = 17, token.split("-", 1)[1], out.setdefault("calls", {})
    for times, plus in steps:
        messages = [*messages, {"role": "user", "content": f"What is {value} * {times} + {plus}?"}]
        value = value * times + plus
        for _ in range(2):
            t0 = time.perf_counter()
            message = await ask(http, token, messages)
            latency = time.perf_counter() - t0
            out["latencies"].append(latency)
            calls[index, len(messages)] = latency  # the history's length numbers the session's calls
            messages = [*messages, message]
            for call in message.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(value)})


async def chat(url: str, fields: dict, http: aiohttp.ClientSession, token: str, messages: list[dict]) -> dict:
    body = msgspec.json.encode({"model": "m", "messages": messages, "tools": TOOLS, **fields})
    async with http.post(url + "/v1/chat/completions", data=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as resp:
        answer = msgspec.json.decode(await resp.read())
    if resp.status != 200:
        raise RuntimeError(f"{url}: HTTP {resp.status}: {answer}")
    return {k: v for k, v in answer["choices"][0]["message"].items() if v is not None}


class DirectTito:
    """A tito proxy's work in this process, with its own parts: render and tokenize (`Renderer`,
    extending each session's chain as the proxy does, `Chains`), /generate, parse the tool calls."""

    def __init__(self, engine_url: str) -> None:
        self.url, self.renderer = engine_url, Renderer(ASSET_DIR)
        self.parser = parser_for("auto", self.renderer.chat_template)
        self.chains: dict[str, Chains] = {}

    async def ask(self, http: aiohttp.ClientSession, token: str, messages: list[dict]) -> dict:
        call, chains = Call(messages=messages, tools=TOOLS), self.chains.setdefault(token, Chains())
        prompt = chains.prompt(self.renderer, call)
        path, body = SCRIPTED.generate(prompt.ids, Sampling(4096), False, call.id)
        async with http.post(self.url + path, data=msgspec.json.encode(body),
                             headers={"Content-Type": "application/json"}) as resp:
            answer = msgspec.json.decode(await resp.read())
        if resp.status != 200:
            raise RuntimeError(f"{self.url}{path}: HTTP {resp.status}: {answer}")
        generation = SCRIPTED.Generation()
        content, calls = self.parser.parse(generation.feed(answer), TOOLS)
        sampled = generation.result()
        outcome = Outcome(call.id, content, [ToolCall(f"call_{new_id()[8:]}", *c) for c in calls],
                          "tool_calls" if calls else "stop", prompt.ids, sampled.ids, sampled.logprobs,
                          "", self.url)
        chains.record(prompt, call, outcome)
        return assistant_message(outcome)


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


def first_call(tmp: Path, gateway: Gateway) -> float:
    """Milliseconds from a tito proxy spawned to its first call answered, by an engine of its own
    that decodes at once (both stopped after)."""
    engine, engine_url = start("engine-first", ["engine", "--kind", "scripted", "--port", "0"], tmp)
    t0 = time.perf_counter()
    child, url = start("tito-first", proxy_args("tito-first", tmp, engine_url, "tito"), tmp)
    gateway.open("tito-first", ["tito-first-0-0"])

    async def one() -> None:
        async with aiohttp.ClientSession() as http:
            messages = [{"role": "user", "content": "What is 2 * 3 + 4?"}]
            await chat(url, {}, http, "tito-first-0-0", messages)

    try:
        asyncio.run(one())
        return round((time.perf_counter() - t0) * 1000, 1)
    finally:
        procs.stop([child, engine])


def figures(rounds: list[dict[str, dict]]) -> dict[str, float]:
    """Medians over rounds of each round's figures."""
    def median(fn) -> float:
        return round(statistics.median(fn(r) for r in rounds), 3)

    def pct(r: dict, name: str, q: int) -> float:
        return statistics.quantiles(r[name]["latencies"], n=100, method="inclusive")[q - 1] * 1000

    def added(r: dict, hop: str, direct: str, q: int) -> float:
        """The q-th percentile over calls of the hop's latency minus the same call's direct."""
        pairs = r[hop]["calls"].keys() & r[direct]["calls"].keys()
        gaps = [r[hop]["calls"][k] - r[direct]["calls"][k] for k in pairs]
        return statistics.quantiles(gaps, n=100, method="inclusive")[q - 1] * 1000

    def per_call(r: dict, name: str, figure: str) -> float:
        return r[name][figure] * 1000 / len(r[name]["latencies"])

    out = {}
    for name in rounds[0]:
        out[f"{name}_p50_ms"] = median(lambda r, n=name: pct(r, n, 50))
        out[f"{name}_p99_ms"] = median(lambda r, n=name: pct(r, n, 99))
        out[f"{name}_calls_per_s"] = median(lambda r, n=name: len(r[n]["latencies"]) / r[n]["wall"])
        out[f"{name}_engine_cpu_ms"] = median(lambda r, n=name: per_call(r, n, "engine_cpu"))
    for hop, direct in PAIRS.items():
        for q in (50, 99):
            out[f"{hop}_added_p{q}_ms"] = median(lambda r, h=hop, d=direct, q=q: added(r, h, d, q))
        out[f"{hop}_ratio"] = median(lambda r, h=hop, d=direct: pct(r, h, 50) / pct(r, d, 50))
        out[f"{hop}_cpu_ms"] = median(lambda r, h=hop: per_call(r, h, "cpu"))
    router = out["router_added_p50_ms"]
    out["passthrough_vs_router"] = round(out["passthrough_added_p50_ms"] / router, 3) if router > 0 else None
    out["passthrough_over_router_p50_ms"] = median(lambda r: added(r, "passthrough", "router", 50))
    out["passthrough_vs_router_cpu"] = round(out["passthrough_cpu_ms"] / out["router_cpu_ms"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=positive, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=positive, default=5, help="Rounds per concurrency.")
    parser.add_argument("--sessions", type=positive, default=64,
                        help="At least this many per target and round (C if more), for percentiles.")
    parser.add_argument("--questions", type=positive, default=2, help="Per session (two calls each).")
    parser.add_argument("--context-words", type=int, default=300, help="In each session's system prompt.")
    parser.add_argument("--token-delay-ms", type=float, default=TOKEN_DELAY_MS,
                        help="The engine's decoding time per token (waited, not computed).")
    parser.add_argument("--no-pin", action="store_true", help="Leave every process on every CPU.")
    parser.add_argument("--seed", type=int, help="Of the conversations and turn order (default: drawn).")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"seed {seed}", file=sys.stderr, flush=True)
    rng, conversations = random.Random(seed), Conversations(seed, args.questions, args.context_words)
    cpus = sorted(os.sched_getaffinity(0))
    hop_cpus = None if args.no_pin or len(cpus) < 2 else {cpus[-1]}
    if hop_cpus is not None:
        os.sched_setaffinity(0, set(cpus[:-1]))  # this process and the engines it starts
    with tempfile.TemporaryDirectory(prefix="pxb") as d:
        tmp = Path(d)
        engine, engine_url = start("engine", ["engine", "--kind", "scripted", "--port", "0",
                                              "--token-delay-ms", str(args.token_delay_ms)], tmp)
        gateway = Gateway(f"ipc://{tmp}/gw.ipc")
        children, router, results = [engine], None, {"seed": seed, "pinned": hop_cpus is not None,
                                                     "token_delay_ms": args.token_delay_ms}
        try:
            gateway.wait_records(0)  # its process answers: it is bound before a proxy says hello
            results["tito_first_call_ms"] = first_call(tmp, gateway)
            print(f"tito_first_call_ms {results['tito_first_call_ms']:.1f}", file=sys.stderr, flush=True)
            urls, procs_of = {"direct_chat": engine_url}, {}
            for name, mode in PROXIES.items():
                child, urls[name] = start(name, proxy_args(name, tmp, engine_url, mode), tmp)
                children.append(child)
                procs_of[name] = child.proc.pid
            router, urls["router"] = start_router(engine_url, tmp)
            procs_of["router"] = router.pid
            for hop in HOPS:
                pin(procs_of[hop], hop_cpus)
            asks = {name: functools.partial(chat, url, {} if name == "tito" else CAPTURE) for name, url in urls.items()}
            asks["direct_tito"] = DirectTito(engine_url).ask
            pids = {name: {"engine_cpu": engine.proc.pid} for name in asks}
            for name, pid in procs_of.items():
                pids[name]["cpu"] = pid
            sessions = {name: functools.partial(session, ask, conversations) for name, ask in asks.items()}
            expected = 1  # the first call
            for c in args.concurrency:
                n, rounds = max(c, args.sessions) + 1, []  # the first session warms up
                for round_ in range(args.rounds):
                    tokens = {name: [f"{name}-c{c}-{round_}-{i}" for i in range(n)] for name in sessions}
                    for name in PROXIES:
                        gateway.open(name, tokens[name])
                        expected += 2 * args.questions * n
                    rounds.append(asyncio.run(run_round(sessions, tokens, c, rng, pids)))
                    print(f"c={c} round {round_}: {json.dumps(figures(rounds[-1:]))}", file=sys.stderr, flush=True)
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
