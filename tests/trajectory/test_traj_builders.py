from __future__ import annotations

import pytest

from polar_hpc.trajectory.builders import build
from polar_hpc.trajectory.messages import UnsupportedApi, assistant_message, final_answer


def test_per_request_one_trace_per_call(record):
    tools = [{"type": "function", "function": {"name": "sh"}}]
    records = [record(1, [1, 2, 3, 9, 9], [7], "b"), record(0, [1, 2, 3], [9, 9], "a", tools=tools)]
    traces, meta = build(records, "per_request")
    assert [t.call_indices for t in traces] == [[0], [1]]
    first = traces[0]
    assert first.prompt_ids.tolist() == [1, 2, 3] and first.response_ids.tolist() == [9, 9]
    assert first.loss_mask.tolist() == [1, 1]
    assert first.logprobs.tolist() == [-0.5, -0.75]
    assert [first.response_ids.typecode, first.loss_mask.typecode, first.logprobs.typecode] == ["i", "i", "f"]
    assert first.messages == [
        {"role": "user", "content": "turn 0"},
        {"role": "assistant", "content": "a"},
    ]
    assert first.tools == tools and traces[1].tools == []
    assert first.weight_versions == ["v0"] and first.finish_reason == "stop"
    assert meta["builder"] == "per_request" and meta["calls"] == 2 and meta["chains"] == 2


def test_prefix_merge_three_call_chain(record):
    c0 = record(0, [1, 2, 3], [10, 11], version="v0")
    c1 = record(1, [1, 2, 3, 10, 11, 50, 51, 52], [12], version="v1")  # tool result 50..52
    c2 = record(2, [1, 2, 3, 10, 11, 50, 51, 52, 12, 60], [13, 14, 15], "done", version="v1")
    traces, meta = build([c2, c0, c1], "prefix_merge")
    assert len(traces) == 1 and meta["chains"] == 1 and meta["chain_breaks"] == []
    (t,) = traces
    assert t.prompt_ids.tolist() == [1, 2, 3]
    assert t.response_ids.tolist() == [10, 11, 50, 51, 52, 12, 60, 13, 14, 15]
    assert t.loss_mask.tolist() == [1, 1, 0, 0, 0, 1, 0, 1, 1, 1]
    lp = c0.output_logprobs + [0.0] * 3 + c1.output_logprobs + [0.0] + c2.output_logprobs
    assert t.logprobs.tolist() == lp
    assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)
    # every sampled position carries the engine's logprob, every inserted one 0.0
    assert all((m == 1) == (p != 0.0) for m, p in zip(t.loss_mask, t.logprobs))
    assert t.call_indices == [0, 1, 2] and t.weight_versions == ["v0", "v1", "v1"]
    assert t.messages[-1] == {"role": "assistant", "content": "done"}
    assert t.prompt_ids.tolist() + t.response_ids.tolist() == c2.prompt_ids + c2.output_ids


def test_prefix_merge_splits_on_divergence(record):
    c0 = record(0, [1, 2, 3], [10, 11])
    c1 = record(1, [1, 2, 3, 10, 11, 20], [12])
    c2 = record(2, [1, 2, 3, 10, 99, 20], [13])  # history rewritten at position 4
    c3 = record(3, [1, 2], [5])  # shorter than the chain it came after (context reset)
    traces, meta = build([c0, c1, c2, c3], "prefix_merge")
    assert [t.call_indices for t in traces] == [[0, 1], [2], [3]]
    assert meta["chains"] == 3
    assert meta["chain_breaks"] == [
        "call 2: prompt diverges from chain 0 at token 4",
        "call 3: prompt (2 tokens) ends inside chain 1 (7 tokens)",
    ]
    assert traces[1].loss_mask.tolist() == [1] and traces[1].prompt_ids.tolist() == c2.prompt_ids


def test_prefix_merge_interleaved_chains(record):
    main = [100, 101]
    sub = [200, 201, 202]
    records = [
        record(0, main, [1]),
        record(1, sub, [2, 2]),  # sub-agent starts
        record(2, main + [1, 30], [3]),  # main continues
        record(3, sub + [2, 2, 40, 41], [4]),  # sub continues
        record(4, main + [1, 30, 3, 31], [5]),
    ]
    traces, meta = build(records, "prefix_merge")
    assert [t.call_indices for t in traces] == [[0, 2, 4], [1, 3]]
    assert traces[0].response_ids.tolist() == [1, 30, 3, 31, 5]
    assert traces[0].loss_mask.tolist() == [1, 0, 1, 0, 1]
    assert traces[1].response_ids.tolist() == [2, 2, 40, 41, 4]
    assert traces[1].loss_mask.tolist() == [1, 1, 0, 0, 1]
    assert meta["chain_breaks"] == ["call 1: prompt diverges from chain 0 at token 0"]


def test_prefix_merge_prefers_longest_chain(record):
    records = [
        record(0, [1], [2]),
        record(1, [1, 2, 3], [4]),  # extends chain 0
        record(2, [1, 2], [9]),  # ends inside chain 0: new chain [1, 2, 9]
        record(3, [1, 2, 3, 4, 5], [6]),  # only chain 0 matches
        record(4, [1, 2, 9, 7], [8]),  # extends chain 1
    ]
    traces, _ = build(records, "prefix_merge")
    assert [t.call_indices for t in traces] == [[0, 1, 3], [2, 4]]


def test_prefix_merge_picks_longer_of_two_matching_chains(record):
    records = [
        record(0, [1], [2]),  # chain 0 = [1, 2]
        record(1, [1], [2, 3, 4]),  # regenerated: chain 1 = [1, 2, 3, 4]
        record(2, [1, 2, 3, 4, 5], [6]),  # extends both; the longer one wins
    ]
    traces, meta = build(records, "prefix_merge")
    assert [t.call_indices for t in traces] == [[0], [1, 2]]
    assert traces[1].response_ids.tolist() == [2, 3, 4, 5, 6] and traces[1].loss_mask.tolist() == [1, 1, 1, 0, 1]
    assert meta["chain_breaks"] == ["call 1: prompt (1 tokens) ends inside chain 0 (2 tokens)"]


def test_build_rejects_bad_input(record):
    with pytest.raises(ValueError, match="unknown trajectory builder"):
        build([], "magic")
    bad = record(0, [1], [2, 3])
    bad.output_logprobs = [-1.0]
    with pytest.raises(ValueError, match="call 0: 2 output ids but 1 logprobs"):
        build([bad], "prefix_merge")
    with pytest.raises(UnsupportedApi, match="call 0: api 'anthropic_messages' is not supported"):
        build([record(0, [1], [2], api="anthropic_messages")], "per_request")


def test_assistant_message_and_final_answer(record):
    a, b = record(0, [1], [2], "first"), record(1, [1, 2, 3], [4], "the answer is 42")
    assert assistant_message(a) == {"role": "assistant", "content": "first"}
    assert final_answer([b, a]) == "the answer is 42"
    assert final_answer([]) == ""
    b.response["choices"][0]["message"]["content"] = None
    assert final_answer([a, b]) == ""
    parts = [{"type": "text", "text": "x"}, {"type": "image_url"}, {"type": "text", "text": "y"}]
    b.response["choices"][0]["message"]["content"] = parts
    assert final_answer([a, b]) == "xy"
    b.response = {"error": "boom"}
    with pytest.raises(ValueError, match=r"call 1: openai_chat response has no choices\[0\].message"):
        assistant_message(b)


def test_each_calls_sampling_and_constraint_marks_reach_its_trace(record):
    c0 = record(0, [1, 2, 3], [10, 11])
    c1 = record(1, [1, 2, 3, 10, 11, 50], [12])
    c0.meta.update(sampling={"max_tokens": 9, "seed": 3}, constrained=None)
    c1.meta.update(sampling={"max_tokens": 4}, constrained={"reasons": ["tool_choice required"], "by": "structural_tag"})
    (t,), _ = build([c0, c1], "prefix_merge")
    assert t.sampling == [{"max_tokens": 9, "seed": 3}, {"max_tokens": 4}]
    assert t.constrained == [{}, {"reasons": ["tool_choice required"], "by": "structural_tag"}]
