"""Turn a session's call records into traces: `build(records, kind) -> (traces, metadata)`.

Records are taken in `call_index` order. Kinds:

- `per_request`: one trace per call; the prompt is the call's prompt, the response its sampled
  tokens (mask 1, the engine's logprobs).
- `prefix_merge`: one trace per chain. A call extends a chain when its prompt starts, token for
  token, with the chain's whole sequence so far; the rest of its prompt (tool results, user turns,
  template glue) is appended with mask 0 and logprob 0.0, then its sampled tokens with mask 1. Of
  several matching chains the longest wins (interleaved sub-agents each keep their own chain); a
  call matching none starts a new chain, and `metadata["chain_breaks"]` says why it did not extend
  the previous call's chain. Traces come in the order their chains started.

A trace's messages and tools are those of its last call (its request plus the assistant reply).
Metadata: {"builder", "calls", "chains", "chain_breaks", "apis", "streamed_calls"}, plus what the
proxy noted: "history_restarts" (calls whose re-sent history matched no earlier chain, and why),
"retried" (call index -> engines that failed it before another answered) and "aborted_attempts"
(call index -> {"count", "versions", "seconds"} of the attempts an engine aborted for a weight update before
it). A record whose logprobs are not aligned with its output ids, an unknown kind or an
unsupported api raises ValueError.
"""

from __future__ import annotations

from array import array
from typing import Any

from polar_hpc.trajectory.messages import assistant_message, request_messages, request_tools
from polar_hpc.trajectory.model import Trace
from polar_hpc.wire import CallRecord

BUILDERS = ("per_request", "prefix_merge")


def build(records: list[CallRecord], kind: str) -> tuple[list[Trace], dict[str, Any]]:
    if kind not in BUILDERS:
        raise ValueError(f"unknown trajectory builder {kind!r} (known: {', '.join(BUILDERS)})")
    ordered = sorted(records, key=lambda r: r.call_index)
    for record in ordered:
        if len(record.output_logprobs) != len(record.output_ids):
            raise ValueError(
                f"call {record.call_index}: {len(record.output_ids)} output ids but "
                f"{len(record.output_logprobs)} logprobs"
            )
    if kind == "per_request":
        chains = [_Chain(i, r) for i, r in enumerate(ordered)]
        breaks: list[str] = []
    else:
        chains, breaks = _merge(ordered)
    metadata = {"builder": kind, "calls": len(ordered), "chains": len(chains), "chain_breaks": breaks}
    metadata |= _proxy_notes(ordered)
    return [c.trace() for c in chains], metadata


def _proxy_notes(records: list[CallRecord]) -> dict[str, Any]:
    """What the proxy said of the calls: APIs used, why a call started a new chain of its
    history (tito mode), which calls were retried on another engine, which were aborted, and
    each call's milliseconds on engines and in the proxy."""
    notes: dict[str, Any] = {"apis": sorted({r.api for r in records}),
                             "streamed_calls": sum(r.stream for r in records)}
    starts = [f"call {r.call_index}: {r.meta['new_chain']}" for r in records[1:] if "new_chain" in r.meta]
    retried = {r.call_index: r.meta["retried"] for r in records if r.meta.get("retried")}
    if starts:
        notes["history_restarts"] = starts
    if retried:
        notes["retried"] = retried
    aborted = {r.call_index: r.meta["aborted_attempts"] for r in records if r.meta.get("aborted_attempts")}
    if aborted:
        notes["aborted_attempts"] = aborted
    if any("engine_ms" in r.meta for r in records):  # per call: [ms waiting on engines, ms the proxy added]
        notes["call_ms"] = [[r.meta.get("engine_ms"), r.meta.get("proxy_ms")] for r in records]
    return notes


def _merge(records: list[CallRecord]) -> tuple[list[_Chain], list[str]]:
    chains: list[_Chain] = []
    breaks: list[str] = []
    previous: _Chain | None = None
    for record in records:
        matching = [c for c in chains if c.extended_by(record)]
        if matching:
            chain = max(matching, key=lambda c: len(c.tokens))
            chain.extend(record)
        else:
            if previous is not None:
                breaks.append(f"call {record.call_index}: {previous.break_reason(record)}")
            chain = _Chain(len(chains), record)
            chains.append(chain)
        previous = chain
    return chains, breaks


class _Chain:
    """The growing token sequence of one chain of calls, with its mask and logprobs, as the
    arrays a Trace holds (filled from the engine's ids in C, no per-token Python work)."""

    def __init__(self, number: int, record: CallRecord) -> None:
        self.number = number
        self.n_prompt = len(record.prompt_ids)
        self.tokens = array("i", record.prompt_ids)
        self.tokens.extend(record.output_ids)
        self.mask = array("i", [1]) * len(record.output_ids)
        self.logprobs = array("f", record.output_logprobs)
        self.versions = _versions(record)
        self.records = [record]

    def extended_by(self, record: CallRecord) -> bool:
        n = len(self.tokens)
        return len(record.prompt_ids) >= n and array("i", record.prompt_ids[:n]) == self.tokens

    def extend(self, record: CallRecord) -> None:
        glue = record.prompt_ids[len(self.tokens) :]
        self.tokens.extend(glue)
        self.mask += array("i", [0]) * len(glue)
        self.logprobs += array("f", [0.0]) * len(glue)
        self.versions += [""] * len(glue)
        self.tokens.extend(record.output_ids)
        self.mask += array("i", [1]) * len(record.output_ids)
        self.logprobs.extend(record.output_logprobs)
        self.versions += _versions(record)
        self.records.append(record)

    def break_reason(self, record: CallRecord) -> str:
        """Why `record`'s prompt does not extend this chain."""
        prompt, tokens = record.prompt_ids, self.tokens
        common = min(len(prompt), len(tokens))
        at = next((i for i in range(common) if prompt[i] != tokens[i]), common)
        if at < common:
            return f"prompt diverges from chain {self.number} at token {at}"
        return f"prompt ({len(prompt)} tokens) ends inside chain {self.number} ({len(tokens)} tokens)"

    def trace(self) -> Trace:
        last = self.records[-1]
        return Trace(
            prompt_ids=self.tokens[: self.n_prompt],
            response_ids=self.tokens[self.n_prompt :],
            loss_mask=self.mask,
            logprobs=self.logprobs,
            messages=request_messages(last) + [assistant_message(last)],
            tools=request_tools(last),
            finish_reason=last.finish_reason,
            weight_versions=[r.weight_version for r in self.records],
            call_indices=[r.call_index for r in self.records],
            sampling=[r.meta.get("sampling") or {} for r in self.records],
            constrained=[r.meta.get("constrained") or {} for r in self.records],
            token_versions=self.versions,
        )


def _versions(record: CallRecord) -> list[str]:
    """Per output id, the version that sampled it."""
    return list(record.token_versions) or [record.weight_version] * len(record.output_ids)
