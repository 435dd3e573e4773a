"""A GRPO-style trainer's input loop: follow a (running) job's shards, one group per task.

For each task whose samples have all been decided, prints the group-normalized advantages
((reward - group mean) / (group std + eps); samples without a reward get none) and, every
`--tasks-per-batch` groups, the padded batch a trainer would consume (numpy, or torch tensors
when torch is installed). The cursor file makes a restarted trainer continue where it stopped.
Stops when the run is complete.

    uv run python examples/trainer_grpo.py RUN_DIR [--cursor trainer.cursor] [--tasks-per-batch 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polar_hpc.shards import Filter, Follower, group_advantages, pad_batch, to_torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--cursor", type=Path, default=None, help="durable cursor file (default: none)")
    ap.add_argument("--tasks-per-batch", type=int, default=2)
    ap.add_argument("--idle-timeout", type=float, default=None, help="stop after this long with nothing new")
    args = ap.parse_args()

    follower = Follower(args.run_dir, cursor=args.cursor, group_by_task=True, autocommit=False,
                        filter=Filter(status="completed"), poll_s=0.5, idle_timeout_s=args.idle_timeout)
    pending, steps = [], 0
    for group in follower:
        adv = group_advantages([t.reward for t in group])
        print(f"task {group[0].task_id}: samples {[t.sample_index for t in group]}, "
              f"rewards {[t.reward for t in group]}, advantages {[None if a is None else round(a, 3) for a in adv]}")
        pending.append(group)
        if len(pending) == args.tasks_per_batch:
            steps += 1
            train_step(steps, pending)
            pending = []
            follower.commit()  # the step is done: a restart continues after these groups
    if pending:
        train_step(steps + 1, pending)
        follower.commit()
    print(f"run complete: {follower.stats['handed_out']} groups, {follower.stats['strays']} strays skipped")


def train_step(step: int, groups: list) -> None:
    trajs = [t for g in groups for t in g]
    batch = pad_batch(trajs)
    try:
        batch = to_torch(batch)
        kind = "torch"
    except ImportError:
        kind = "numpy"
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items())
    print(f"step {step}: {len(groups)} tasks, {len(trajs)} trajectories -> {kind} batch: {shapes}")


if __name__ == "__main__":
    main()
