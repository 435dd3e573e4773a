"""Trainer-side helpers: `Filter` trajectories, `group_by_task`, `group_advantages`, `pad_batch` into numpy arrays,
`to_torch` (torch is optional: imported only there).

`pad_batch(trajectories)` makes one row per trace, the sequence `prompt_ids + response_ids`
right-padded to the longest row (or `max_len`, which a longer row exceeds with ValueError):
`input_ids` int64 [B, L] (padding `pad_id`), `attention_mask` int64 [B, L] (1 on real tokens),
`loss_mask` float32 [B, L] (0 on the prompt and padding, the trace's mask on the response),
`logprobs` float32 [B, L] (sampling logprob of the token at that position, 0 elsewhere),
`rewards` float32 [B] (the trajectory's reward, NaN when it has none), `trajectory` int64 [B]
(which input trajectory the row came from), `lengths` int64 [B], `constrained` int64 [B] (how
many of the row's calls were decoded under a constraint: their logprobs are the constrained
distribution's; each call's own marks and sampling parameters are in `trace.constrained` and
`trace.sampling`), and `token_versions` int64 [B, L] (the number of the policy version that
sampled the token at that position, `Trace.versions()`; -1 on the prompt, padding, tokens the
environment inserted and versions without a number).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from polar_hpc.trajectory.model import Trajectory
from polar_hpc.wire import version_number


@dataclass(frozen=True)
class Filter:
    """Which trajectories to keep; a field left None keeps everything.

    `status`: the statuses kept. `reward`: inclusive (low, high), either end None for open; a
    trajectory without a reward fails it. `weight_versions`: inclusive (low, high) window of
    policy versions (a version string's trailing integer: "v12" and "12" are 12); every call of
    every trace, and every sampled token (`Trace.versions()`: the oldest token of a call that went
    on across an update bounds its staleness), must lie inside it; a version without a number
    fails it.
    """

    status: frozenset[str] | None = None
    reward: tuple[float | None, float | None] | None = None
    weight_versions: tuple[int | None, int | None] | None = None

    def __post_init__(self) -> None:
        if self.status is not None:
            object.__setattr__(self, "status", frozenset([self.status] if isinstance(self.status, str) else self.status))

    def passes(self, traj: Trajectory) -> bool:
        if self.status is not None and traj.status not in self.status:
            return False
        if self.reward is not None:
            if traj.reward is None or not _within(traj.reward, *self.reward):
                return False
        if self.weight_versions is not None:
            for trace in traj.traces:
                for version in set(trace.weight_versions).union(trace.versions()) - {""}:
                    number = version_number(version)
                    if number is None or not _within(number, *self.weight_versions):
                        return False
        return True


def _within(x: float, low: float | None, high: float | None) -> bool:
    return (low is None or x >= low) and (high is None or x <= high)


def group_advantages(rewards: list[float | None], eps: float = 1e-6) -> list[float | None]:
    """GRPO's group-normalized advantages, (reward - mean) / (std + eps); None where no reward."""
    scored = [r for r in rewards if r is not None]
    if not scored:
        return [None] * len(rewards)
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
    return [None if r is None else (r - mean) / (std + eps) for r in rewards]


def group_by_task(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories per task id (in first-seen order), each group sorted by sample index."""
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.task_id, []).append(traj)
    return {task: sorted(group, key=lambda t: t.sample_index) for task, group in groups.items()}


def pad_batch(trajectories: Iterable[Trajectory], pad_id: int = 0, max_len: int | None = None) -> dict[str, np.ndarray]:
    rows = [(i, traj, trace) for i, traj in enumerate(trajectories) for trace in traj.traces]
    lengths = np.array([trace.n_tokens for _, _, trace in rows], dtype=np.int64)
    width = int(lengths.max(initial=0)) if max_len is None else max_len
    if max_len is not None and len(rows) and lengths.max() > max_len:
        i, traj, trace = rows[int(lengths.argmax())]
        raise ValueError(f"task {traj.task_id!r} sample {traj.sample_index}: a trace of {trace.n_tokens} tokens "
                         f"is longer than max_len {max_len}")
    n = len(rows)
    batch: dict[str, np.ndarray] = {
        "input_ids": np.full((n, width), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((n, width), dtype=np.int64),
        "loss_mask": np.zeros((n, width), dtype=np.float32),
        "logprobs": np.zeros((n, width), dtype=np.float32),
        "rewards": np.array([math.nan if t.reward is None else t.reward for _, t, _ in rows], dtype=np.float32),
        "trajectory": np.array([i for i, _, _ in rows], dtype=np.int64),
        "constrained": np.array([sum(bool(c) for c in trace.constrained) for _, _, trace in rows], dtype=np.int64),
        "lengths": lengths,
        "token_versions": np.full((n, width), -1, dtype=np.int64),
    }
    for row, (_, _, trace) in enumerate(rows):
        p, total = len(trace.prompt_ids), trace.n_tokens
        batch["input_ids"][row, :p] = np.frombuffer(trace.prompt_ids, dtype=np.int32)
        batch["input_ids"][row, p:total] = np.frombuffer(trace.response_ids, dtype=np.int32)
        batch["attention_mask"][row, :total] = 1
        batch["loss_mask"][row, p:total] = np.frombuffer(trace.loss_mask, dtype=np.int32)
        batch["logprobs"][row, p:total] = np.frombuffer(trace.logprobs, dtype=np.float32)
        batch["token_versions"][row, p:total] = _numbers(trace.versions(), total - p)
    return batch


def _numbers(versions: list[str], n: int) -> np.ndarray:
    """Each version's number (-1: none, or no version), for a response of `n` tokens."""
    numbers = {v: version_number(v) for v in set(versions)}
    return np.array([-1 if numbers[v] is None else numbers[v] for v in versions] if versions else [-1] * n,
                    dtype=np.int64)


def to_torch(batch: dict[str, np.ndarray]) -> dict:
    """The same batch as torch tensors (sharing memory); needs torch installed."""
    try:
        import torch
    except ImportError:
        raise ImportError("to_torch needs PyTorch: pip install torch (or use the numpy batch)") from None
    return {k: torch.from_numpy(v) for k, v in batch.items()}
