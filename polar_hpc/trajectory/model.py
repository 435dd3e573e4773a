"""The training data a session produces: a `Trajectory` of one or more token-exact `Trace`s.

A trace is one token sequence `prompt_ids + response_ids`; `loss_mask` and `logprobs` are aligned
1:1 with `response_ids` (mask 1 = sampled by the policy, 0 = inserted by the environment, whose
logprob is 0.0). `weight_versions` and `call_indices` hold one entry per model call merged into the
trace, in call order. Constructing either struct with misaligned lists, or a trajectory with an
unknown status, raises ValueError.
"""

from __future__ import annotations

from typing import Any

import msgspec

STATUSES = ("completed", "error", "timeout", "cancelled")


class Trace(msgspec.Struct):
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    finish_reason: str
    weight_versions: list[str]
    call_indices: list[int]

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trace misaligned: {n} response ids, {len(self.loss_mask)} mask entries, "
                f"{len(self.logprobs)} logprobs"
            )
        if len(self.weight_versions) != len(self.call_indices):
            raise ValueError("trace needs one weight version per call index")

    @property
    def n_tokens(self) -> int:
        """Length of the whole sequence, prompt and response."""
        return len(self.prompt_ids) + len(self.response_ids)


class Trajectory(msgspec.Struct):
    session_id: str
    task_id: str
    sample_index: int
    attempt: int
    status: str
    reward: float | None
    traces: list[Trace]
    metadata: dict[str, Any]
    t_start: float
    t_end: float

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"trajectory status {self.status!r} is not one of {', '.join(STATUSES)}")

    @property
    def n_tokens(self) -> int:
        """Tokens over all traces (a prefix shared by per-request traces counts once per trace)."""
        return sum(t.n_tokens for t in self.traces)
