"""Asynchronous RL against the long tail: one simulated training loop run three ways, on one service run.

A real `polar-hpc run --service` job (orchestrator, gateway, proxy, scripted engine decoding in
time: one token every `--token-ms`) serves a trainer in this process that, each step, needs G
groups of N samples (`--groups`, `--samples`), "trains" on them (a sleep of `--train-s`, standing
for the GPU step) and publishes the next policy version through the service API
(`Client.update_weights`, mode `wait`: calls in flight finish first). It reads its groups from the shards with
`Follower(group_by_task=True)`, as a trainer does. Each session is a harness that decodes a set
number of tokens in calls of at most `--call-tokens`; the totals are drawn from a lognormal
(median `--median-s` of decoding, sigma `--sigma`: p99/p50 = e^(2.33 sigma), >= 10 from sigma 1;
`--seed`, printed). Every variant gets the same tasks with the same drawn lengths per (step,
group, sample); the variants run one after the other on the same job:

- `sync`: the trainer submits step s's batch, waits for its whole groups, trains, updates, and
  only then submits step s+1's batch. Samples are on-policy; the trainer waits for the slowest
  session of every step and the engine idles while it trains.
- `async`: staleness bound 1 (`max_staleness=1`): step s+1's batch is submitted when step s
  begins (after the update to v_s), so it decodes while the trainer waits for and trains on step
  s; its samples are sampled by v_s (or v_{s+1}, for calls after the update) and trained at
  v_{s+1}. Whole groups: each step still waits for its slowest session.
- `overprovisioned`: as `async`, and each task starts N + k samples (`--extra`) with `accept: N`:
  its group is the first N that finish; the orchestrator cancels the other k (docs/tasks.md).
(A fourth variant, partial rollouts across weight updates, is one more `Variant` in VARIANTS, with
its own `update_mode`.)

Figures per variant (the last line is one JSON object):
- `accepted_per_s`: samples trained on / the loop's wall time (first submit to the last update's
  answer).
- `trainer_idle_fraction`: 1 - (time in train steps) / wall time: waiting for groups and for
  weight updates.
- `staleness`: {versions behind: samples} over the samples trained on, a sample's staleness being
  the trainer's policy version at its step minus the oldest version among its calls' records
  (`Trace.weight_versions`); and `max_staleness`. A sample over the bound would be dropped (and
  counted wasted); with these pipelines none is.
- `wasted_engine_s`: the engine's decode time spent on sessions never trained on (the cancelled
  tails, stale drops): their recorded calls' sampled tokens x `--token-ms`. The call a cancel cuts
  is aborted at the engine and not recorded, so this is a lower bound. `wasted_session_s`: the
  same sessions' harness run time (the gateway's RUN stage: decoding, plus waiting for CPU on a
  loaded machine).
- `wall_s`, `accepted` (samples trained on), `sessions` (started).
At top level: the seed; the distribution's p99/p50 (`lognormal_p99_over_p50`: e^(2.326 sigma)); the
drawn decode lengths' p50, p99 and p99/p50 (`drawn_decode_*`: a sample of G x (N + k) x steps), and
the harness run times of every completed session (`session_run_*`: the drawn lengths plus the
machine's overhead, which narrows the tail's ratio); `async_vs_sync` and `overprovisioned_vs_sync`
(accepted_per_s ratios); the 1-minute load average at the end (`--only NAME` runs one variant).

    uv run python bench/async.py [--steps 5] [--groups 2] [--samples 4] [--extra 4] [--train-s 2.5] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from polar_hpc.client import Client
from polar_hpc.shards import Follower
from polar_hpc.shards.reader import iter_trajectories
from polar_hpc.wire import version_number

# The harness: sample i of a task decodes the i-th number of its instruction in tokens, in calls of at
# most $CALL tokens (sh and curl: a few ms of CPU per session, so the engine's pacing sets its length).
HARNESS = """\
i=${POLAR_SESSION_ID##*#}; i=${i%%.*}
set -- $POLAR_INSTRUCTION; shift "$i"; left=$1
while [ "$left" -gt 0 ]; do
  n=$(( left < CALL ? left : CALL ))
  curl -sf -o /dev/null -H "Authorization: Bearer $OPENAI_API_KEY" -H 'Content-Type: application/json' \\
    -d "{\\"model\\": \\"m\\", \\"max_tokens\\": $n, \\"messages\\": [{\\"role\\": \\"user\\", \\"content\\": \\"go\\"}]}" \\
    "$OPENAI_BASE_URL/chat/completions" || exit 1
  left=$(( left - n ))
done
"""


@dataclass(frozen=True)
class Variant:
    name: str
    ahead: int  # batches submitted before the trainer waits for the current one (= the staleness bound)
    extra: bool  # start N + k samples per task, accept N
    update_mode: str = "wait"  # Client.update_weights' mode: what happens to the calls in flight


VARIANTS = (
    Variant("sync", ahead=0, extra=False),
    Variant("async", ahead=1, extra=False),
    Variant("overprovisioned", ahead=1, extra=True),
    # the fourth: partial rollouts across weight updates, Variant("partial", ahead=1, extra=True,
    # update_mode=<the mode in which calls in flight continue on the new weights>)
)


def draw_tokens(args: argparse.Namespace) -> dict[tuple[int, int], list[int]]:
    """(step, group) -> decode tokens of each of its N + k samples, the same for every variant."""
    rng = random.Random(args.seed)
    median = args.median_s * 1000 / args.token_ms
    return {(s, g): [max(1, round(median * rng.lognormvariate(0, args.sigma))) for _ in range(args.samples + args.extra)]
            for s in range(args.steps) for g in range(args.groups)}


def tasks_for(variant: Variant, step: int, plan: dict, args: argparse.Namespace, harness: Path) -> list[dict]:
    tasks = []
    for g in range(args.groups):
        task = {"id": f"{variant.name}-s{step}-g{g}", "num_samples": args.samples, "timeout_s": 600,
                "instruction": " ".join(map(str, plan[step, g])),
                "harness": {"command": "sh harness.sh", "env": {"CALL": str(args.call_tokens)}},
                "sandbox": {"files": {"harness.sh": str(harness)}},
                "builder": "per_request"}
        if variant.extra:
            task |= {"num_samples": args.samples + args.extra, "accept": args.samples}
        tasks.append(task)
    return tasks


class Trainer:
    """The simulated training loop: groups from the shards, a set-length step, weights through the API."""

    def __init__(self, run_dir: Path, client: Client, work: Path, args: argparse.Namespace) -> None:
        self.client, self.work, self.args = client, work, args
        self.follower = Follower(run_dir, cursor=work / "cursor", group_by_task=True, poll_s=0.05)
        self.groups: dict[str, list] = {}  # task id -> its group, as handed out
        self.version = 0

    def wait_groups(self, task_ids: list[str]) -> list[list]:
        while not all(t in self.groups for t in task_ids):
            for group in self.follower:  # ends whenever the run has nothing left in flight
                self.groups[group[0].task_id] = group
                if all(t in self.groups for t in task_ids):
                    break
            else:
                time.sleep(self.follower.poll_s)
        return [self.groups.pop(t) for t in task_ids]

    def run(self, variant: Variant, plan: dict, harness: Path) -> tuple[dict, set[tuple[str, int]]]:
        """The variant's figures (all but the wasted engine time), and the (task, sample) trained on."""
        args, batches = self.args, {}
        staleness: Counter[int] = Counter()
        trained: set[tuple[str, int]] = set()
        busy = 0.0

        def submit(step: int) -> None:
            batches[step] = tasks_for(variant, step, plan, args, harness)
            self.client.submit(batches[step], batch_id=f"{variant.name}-{step}", max_staleness=variant.ahead)

        t0 = time.perf_counter()
        for step in range(variant.ahead):
            submit(step)
        for step in range(args.steps):
            if step + variant.ahead < args.steps:
                submit(step + variant.ahead)
            for group in self.wait_groups([t["id"] for t in batches[step]]):
                for traj in group:
                    oldest = min(version_number(v) or 0 for trace in traj.traces for v in trace.weight_versions)
                    behind = self.version - oldest
                    if behind <= variant.ahead:
                        staleness[behind] += 1
                        trained.add((traj.task_id, traj.sample_index))
            t = time.perf_counter()
            time.sleep(args.train_s)  # the GPU step
            busy += time.perf_counter() - t
            folder = self.work / "weights" / f"v{self.version + 1}"
            folder.mkdir(parents=True)
            self.client.update_weights(folder, f"v{self.version + 1}", variant.update_mode)
            self.version += 1
        wall = time.perf_counter() - t0
        started = sum(t["num_samples"] for tasks in batches.values() for t in tasks)
        return {
            "accepted_per_s": round(len(trained) / wall, 3),
            "trainer_idle_fraction": round(1 - busy / wall, 3),
            "staleness": {str(k): staleness[k] for k in sorted(staleness)},
            "max_staleness": max(staleness),
            "wall_s": round(wall, 2),
            "accepted": len(trained),
            "sessions": started,
        }, trained


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--groups", type=int, default=2, help="G: groups per train step")
    ap.add_argument("--samples", type=int, default=4, help="N: samples per group")
    ap.add_argument("--extra", type=int, default=4, help="k: extra samples started per group (overprovisioned)")
    ap.add_argument("--train-s", type=float, default=2.5, help="the train step's length")
    ap.add_argument("--median-s", type=float, default=1.5, help="median decode time of a session")
    ap.add_argument("--sigma", type=float, default=1.1, help="lognormal sigma of session lengths")
    ap.add_argument("--token-ms", type=float, default=25.0, help="the engine's time per token")
    ap.add_argument("--call-tokens", type=int, default=60, help="tokens per model call at most")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=[v.name for v in VARIANTS], help="run this variant alone")
    ap.add_argument("--keep", type=Path, help="work in this folder (kept) instead of a temporary one")
    args = ap.parse_args()
    print(f"seed {args.seed}", flush=True)
    plan = draw_tokens(args)
    drawn = sorted(n * args.token_ms / 1000 for lengths in plan.values() for n in lengths)
    print(f"drawn decode lengths: p50 {_quantile(drawn, 0.5):.2f}s p99 {_quantile(drawn, 0.99):.2f}s, "
          f"max {drawn[-1]:.1f}s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        figures, ran = run_all(root, plan, args)
    out: dict = {"seed": args.seed, "lognormal_p99_over_p50": round(math.exp(2.326 * args.sigma), 1),
                 **_spread("drawn_decode", drawn), **_spread("session_run", ran), **figures}
    for name in ("async", "overprovisioned"):
        if "sync" in figures and name in figures:
            out[f"{name}_vs_sync"] = round(figures[name]["accepted_per_s"] / figures["sync"]["accepted_per_s"], 2)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


def run_all(root: Path, plan: dict, args: argparse.Namespace) -> tuple[dict[str, dict], list[float]]:
    """Every variant on one service job: {variant: figures}, and the harness run times (s) of the
    sessions that completed."""
    harness, rules, run_dir = root / "harness.sh", root / "rules.yaml", root / "run"
    harness.write_text(HARNESS)
    rules.write_text(json.dumps([{"when": "", "reply": "go " * 4 * args.call_tokens}]))
    most = 2 * args.groups * (args.samples + args.extra)  # sessions in flight at most (two batches)
    (root / "topology.yaml").write_text(json.dumps({
        "service": {"enabled": True},
        "engine": {"script": str(rules), "token_delay_ms": args.token_ms},
        "gateway": {"pools": {"init": 4, "ready": 4, "run": most, "postrun": 4}, "shard_max_age_s": 0.2},
    }))
    with open(root / "job.log", "w") as log:
        job = subprocess.Popen([sys.executable, "-m", "polar_hpc", "run", "--service", "-c", str(root / "topology.yaml"),
                                "--run-dir", str(run_dir)], stdout=log, stderr=subprocess.STDOUT)
    figures, trained = {}, {}
    try:
        while not (run_dir / "rendezvous.json").exists():
            if job.poll() is not None:
                sys.exit(f"polar-hpc run ended ({job.returncode}): {(root / 'job.log').read_text()[-2000:]}")
            time.sleep(0.1)
        with Client(run_dir, timeout_s=120) as client:
            trainer = Trainer(run_dir, client, root / "trainer", args)
            for variant in VARIANTS:
                if args.only in (None, variant.name):
                    figures[variant.name], trained[variant.name] = trainer.run(variant, plan, harness)
                    print(f"{variant.name}: {json.dumps(figures[variant.name])}", flush=True)
            client.drain()
        if job.wait(timeout=120) != 0:
            sys.exit(f"polar-hpc run ended {job.returncode}: {(root / 'job.log').read_text()[-2000:]}")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    ran: list[float] = []
    wasted = {variant: [0.0, 0.0] for variant in figures}
    for traj in iter_trajectories(run_dir, unique=False):  # the tails' records too (not handed out)
        variant, run_s = traj.task_id.split("-s")[0], traj.metadata["timings"].get("run_s", 0.0)
        if traj.status == "completed":
            ran.append(run_s)
        if (traj.task_id, traj.sample_index) not in trained[variant]:
            decoded = sum(len(trace.response_ids) for trace in traj.traces) * args.token_ms / 1000
            wasted[variant] = [wasted[variant][0] + decoded, wasted[variant][1] + run_s]
    for variant, (decoded, run_s) in wasted.items():
        figures[variant] |= {"wasted_engine_s": round(decoded, 2), "wasted_session_s": round(run_s, 2)}
    return figures, sorted(ran)


def _spread(name: str, sorted_values: list[float]) -> dict[str, float]:
    p50, p99 = _quantile(sorted_values, 0.5), _quantile(sorted_values, 0.99)
    return {f"{name}_p50_s": round(p50, 3), f"{name}_p99_s": round(p99, 3), f"{name}_p99_over_p50": round(p99 / p50, 1)}


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


if __name__ == "__main__":
    main()
