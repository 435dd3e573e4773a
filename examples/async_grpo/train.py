"""Asynchronous GRPO against a running service job, in plain Python (no GPU, no real training).

Each step: submit a batch of calculator tasks (several samples each) with `polar_hpc.client`,
wait for it, follow the shards for its groups (within the staleness window), compute
group-normalized advantages and off-policy importance weights (`tis_weights`, `icepop_weights`),
"train" (a stand-in step that writes a new weights folder), and publish the folder as the next
policy version with `update_weights`. Every group of step N must arrive, from version vN only: the
script checks it and exits 1 otherwise. At the end it drains the job, which then finishes.

    polar-hpc run --service -c examples/async_grpo/topology.yaml --run-dir RUN &
    python examples/async_grpo/train.py RUN --steps 3 --work WORK
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from polar_hpc.client import Client
from polar_hpc.shards import Filter, Follower, correction_summary, group_advantages, icepop_weights, pad_batch, tis_weights

HERE = Path(__file__).resolve().parent
AGENT = HERE.parent / "calculator" / "agent.py"


def tasks_for(step: int, n_tasks: int, samples: int) -> list[dict]:
    tasks = []
    for k in range(n_tasks):
        a, b = 11 + step, 7 + k
        tasks.append({
            "id": f"calc-s{step}-{k}", "instruction": f"What is {a} * {b}?", "num_samples": samples,
            "timeout_s": 60, "harness": {"kind": "shell", "command": "python agent.py"},
            "sandbox": {"files": {"agent.py": str(AGENT)}, "network": "host"},
            "evaluator": {"kind": "regex", "pattern": rf"\b{a * b}\b"},
        })
    return tasks


def stand_in_correction(groups: list) -> dict[str, float]:
    """The off-policy correction a trainer would apply and log. With no model here, the trainer's logprobs
    are the sampler's moved by a fixed wave (ratios within e^±1); a real trainer recomputes them, and
    multiplies its per-token loss by the weights."""
    batch = pad_batch([t for group in groups for t in group])
    behaviour, mask = batch["logprobs"], batch["loss_mask"]
    trainer = behaviour + np.sin(0.7 * np.arange(behaviour.shape[1]))
    summary = correction_summary(trainer, behaviour, mask, weights=tis_weights(trainer, behaviour, mask, cap=2.0))
    icepop = correction_summary(trainer, behaviour, mask, weights=icepop_weights(trainer, behaviour, mask, low=0.5, high=5.0))
    return {**summary, "icepop_masked_fraction": icepop["masked_fraction"]}


def train_step(work: Path, step: int, groups: list, correction: dict[str, float]) -> Path:
    """Stand-in for an optimizer step: a new weights folder holding what it was trained on."""
    folder = work / "weights" / f"step-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"step": step, "trajectories": sum(len(g) for g in groups), "correction": correction, "written": time.time()}
    (folder / "weights.json").write_text(json.dumps(record))
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--work", type=Path, required=True, help="the trainer's folder (cursor, weights)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=2, help="tasks per batch")
    ap.add_argument("--samples", type=int, default=4, help="samples per task (the GRPO group)")
    ap.add_argument("--max-staleness", type=int, default=1, help="policy versions a trajectory may lag")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    wrong = 0
    with Client(args.run_dir) as client:
        for step in range(args.steps):
            version = f"v{step}"
            tasks = tasks_for(step, args.tasks, args.samples)
            batch = client.submit(tasks, max_staleness=args.max_staleness)
            print(f"step {step}: batch {batch} submitted ({args.tasks} tasks x {args.samples})", flush=True)
            client.wait(batch, timeout_s=300)
            follower = Follower(args.run_dir, cursor=args.work / "trainer.cursor", group_by_task=True,
                                filter=Filter(status="completed", weight_versions=(step - args.max_staleness, None)),
                                poll_s=0.2, idle_timeout_s=60)
            ours = {t["id"] for t in tasks}
            groups = [g for g in follower if g[0].task_id in ours]  # others' batches are not this step's
            wrong += len(ours) - len(groups)  # a group that never arrived
            for group in groups:
                versions = {v for t in group for trace in t.traces for v in trace.weight_versions}
                wrong += versions != {version}
                adv = [None if a is None else round(a, 3) for a in group_advantages([t.reward for t in group])]
                print(f"  {group[0].task_id}: rewards {[t.reward for t in group]} advantages {adv} "
                      f"versions {sorted(versions)}", flush=True)
            c = stand_in_correction(groups)
            print(f"  off-policy correction (stand-in trainer logprobs): {c['tokens']} tokens, ratio mean "
                  f"{c['mean_ratio']:.3f} max {c['max_ratio']:.3f}, k3 {c['k3']:.4f}; TIS (cap 2) truncated "
                  f"{c['truncated_fraction']:.1%}; IcePop [0.5, 5] masked {c['icepop_masked_fraction']:.1%}", flush=True)
            folder = train_step(args.work, step, groups, c)
            update = client.update_weights(folder, f"v{step + 1}")
            print(f"  weights {update.weight_version} on {len(update.engines)} engine(s), "
                  f"generation paused {update.pause_ms:.1f} ms", flush=True)
        client.drain()
    print(f"done: {args.steps} steps; {wrong} group(s) missing or with the wrong policy version", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
