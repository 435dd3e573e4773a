"""The training data a session produces: a `Trajectory` of one or more token-exact `Trace`s.

A trace is one token sequence `prompt_ids + response_ids`; `loss_mask` and `logprobs` are aligned
1:1 with `response_ids` (mask 1 = sampled by the policy, 0 = inserted by the environment, whose
logprob is 0.0). `weight_versions` and `call_indices` hold one entry per model call merged into the
trace, in call order, and so do `sampling` (the sampling parameters the engine was asked for) and
`constrained` (`{}`, or why and how decoding was constrained), which are empty for traces written
before they existed. `token_versions` is aligned 1:1 with `response_ids` too: the weight version that
sampled each token ("" for a token the environment inserted); a call that went on across a weight
update (`continue` mode) has tokens of two versions. Traces written before it existed have it
empty; `versions()` gives it for every trace (for those, each call's version over its run of
sampled tokens: a call's tokens were then all sampled by one version). Constructing either struct
with misaligned lists, or a trajectory with an unknown status, raises ValueError.

The token ids and loss mask are held as `array('i')` (int32), the logprobs as `array('f')`
(float32): a trace's tokens are one flat buffer each, which shard writing copies as is. A trace
given other sequences converts them (OverflowError for an id outside int32); compare with lists
through `.tolist()`. A Trace is frozen (assigning a field raises AttributeError; the arrays
themselves may still grow), so its packed fields are always these arrays.
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

STATUSES = ("completed", "error", "timeout", "cancelled")


assert array("i").itemsize == 4 and array("f").itemsize == 4, "array('i') / array('f') must be 4 bytes"

PACKED = {"prompt_ids": "i", "response_ids": "i", "loss_mask": "i", "logprobs": "f"}  # trace field -> array code


class Trace(msgspec.Struct, frozen=True):
    prompt_ids: array
    response_ids: array
    loss_mask: array
    logprobs: array
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    finish_reason: str
    weight_versions: list[str]
    call_indices: list[int]
    sampling: list[dict[str, Any]] = []  # per call: the sampling parameters the engine was asked for
    constrained: list[dict[str, Any]] = []  # per call: {} or {"reasons": [...], "by": ...} (constrained decoding)
    token_versions: list[str] = []  # per response token: the version that sampled it, "" if none did

    def __post_init__(self) -> None:
        for name, code in PACKED.items():
            values = getattr(self, name)
            if not (isinstance(values, array) and values.typecode == code):
                msgspec.structs.force_setattr(self, name, array(code, values))
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trace misaligned: {n} response ids, {len(self.loss_mask)} mask entries, "
                f"{len(self.logprobs)} logprobs"
            )
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(f"trace misaligned: {n} response ids, {len(self.token_versions)} token versions")
        if len(self.weight_versions) != len(self.call_indices):
            raise ValueError("trace needs one weight version per call index")
        for name in ("sampling", "constrained"):  # absent (older shards) or one per call
            if getattr(self, name) and len(getattr(self, name)) != len(self.call_indices):
                raise ValueError(f"trace needs one {name} entry per call index")

    def versions(self) -> list[str]:
        """Per response token, the weight version that sampled it ("" where none did)."""
        if self.token_versions or not self.response_ids:
            return self.token_versions
        out, mask, calls = [""] * len(self.response_ids), self.loss_mask, iter(self.weight_versions)
        version = ""
        for i, m in enumerate(mask):
            if m and (i == 0 or not mask[i - 1]):  # a run of sampled tokens: the next call's
                version = next(calls, version)
            if m:
                out[i] = version
        return out

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
