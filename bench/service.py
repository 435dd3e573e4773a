"""Service mode: how fast trainers can submit tasks, and what a weight update adds to generation's pause.

Starts a real orchestrator of a service run (over CURVE, as in a Slurm run) and a scripted engine
it updates (`--engine-url`) whose update takes a set load time L (`--load-ms`, the engine's
`--update-load-ms`: what loading the weights would take); no gateway, so submitted tasks stay queued.
- `submit_tasks_per_s`: N tasks submitted by one `Client` in batches of B, each answered
  (validated, journaled, queued).
- A pause is the orchestrator's `pause_ms`: the longest time an engine held generation during the
  update (pause, load, continue). Each figure is the median over U updates:
  - `abort_pause_ms`: C calls of T tokens (D ms a token) half way through, mode `abort` (they end
    at once, aborted; their harnesses would retry); `abort_added_ms` = that minus L: what
    polar-hpc and the engine's protocol add to the load itself.
  - `idle_pause_ms`, `idle_added_ms`: mode `wait` with no call in flight, and that minus L.
  - `wait_pause_ms`: mode `wait` with the same C calls in flight: the update waits for them, so it
    also holds their remaining decode time (about T x D / 2, set by the parameters, not by
    polar-hpc); `wait_added_ms` = that minus L minus T x D / 2 (approximate: the calls' progress
    at the update is not exact).
The last line is one JSON object.

    uv run python bench/service.py [--tasks 20000] [--batch 500] [--updates 5] [--calls 64] [--load-ms 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from polar_hpc import procs, security
from polar_hpc.client import Client


def task(i: int) -> dict:
    return {"id": f"t{i}", "instruction": "hi", "harness": {"command": "true"}}


async def pauses_under_load(client: Client, url: str, args: argparse.Namespace, loaded: bool,
                            mode: str = "wait") -> list[float]:
    result = []
    body = {"text": "What is 2 + 2?", "sampling_params": {"max_new_tokens": args.tokens}}
    key = {"Authorization": f"Bearer {security.engine_api_key(client.run_dir)}"}  # as the proxy sends it
    async with aiohttp.ClientSession(headers=key) as http:
        for u in range(args.updates):
            calls = [asyncio.create_task(http.post(f"{url}/generate", json=body)) for _ in range(args.calls if loaded else 0)]
            await asyncio.sleep(args.tokens * args.delay_ms / 2000)  # the calls are half way through
            update = await asyncio.to_thread(client.update_weights, "/tmp/weights", f"{mode}{u + 1}", mode)
            result.append(update.pause_ms)
            for response in await asyncio.gather(*calls):
                assert response.status == 200
                response.release()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--load-ms", type=float, default=200.0, help="the engine's set load time per update")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        security.create_keys(run_dir)
        (run_dir / "tasks.jsonl").write_text("")
        (run_dir / "topology.yaml").write_text(f"service:\n  enabled: true\n  max_queued: {args.tasks}\n")
        children = []
        try:
            ready = run_dir / ".engine.ready"
            children.append(procs.spawn("engine", ["engine", "--port", "0", "--ready-file", str(ready),
                                                   "--token-delay-ms", str(args.delay_ms),
                                                   "--update-load-ms", str(args.load_ms)], run_dir / "engine.log",
                                        security.engine_env(run_dir)))
            url = procs.wait_ready(children[-1], ready)["url"]
            children.append(procs.spawn("orchestrator", ["orchestrator", "--run-dir", str(run_dir), "--engine-url", url],
                                        run_dir / "orchestrator.log"))
            procs.wait_ready(children[-1], run_dir / "rendezvous.json")
            with Client(run_dir, timeout_s=60) as client:
                t0 = time.perf_counter()
                for start in range(0, args.tasks, args.batch):
                    client.submit([task(i) for i in range(start, min(args.tasks, start + args.batch))])
                submit_s = time.perf_counter() - t0
                assert client.run_status().total == args.tasks
                loaded = asyncio.run(pauses_under_load(client, url, args, True))
                aborting = asyncio.run(pauses_under_load(client, url, args, True, "abort"))
                idle = asyncio.run(pauses_under_load(client, url, args, False))
        finally:
            procs.stop(children, grace_s=5.0)
    load, decode_left = args.load_ms, args.tokens * args.delay_ms / 2
    print(f"{args.tasks} tasks submitted in {submit_s:.2f}s; load {load:g} ms; pauses (ms): wait {_ms(loaded)}, "
          f"abort {_ms(aborting)}, idle {_ms(idle)}")
    wait, abort, still = (statistics.median(p) for p in (loaded, aborting, idle))
    print(json.dumps({
        "submit_tasks_per_s": round(args.tasks / submit_s, 1),
        "load_ms": load,
        "abort_pause_ms": round(abort, 1),
        "abort_added_ms": round(abort - load, 1),
        "idle_pause_ms": round(still, 1),
        "idle_added_ms": round(still - load, 1),
        "wait_pause_ms": round(wait, 1),
        "wait_added_ms": round(wait - load - decode_left, 1),
        "abort_to_load_ratio": round(abort / load, 3) if load else None,
        "calls_in_flight": args.calls,
    }))


def _ms(pauses: list[float]) -> list[float]:
    return [round(p, 1) for p in pauses]


if __name__ == "__main__":
    main()
