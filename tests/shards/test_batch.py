"""Filters, groups and padded batches as a trainer consumes them."""

from __future__ import annotations

import importlib.util
import math

import msgspec
import numpy as np
import pytest

from polar_hpc.shards import Filter, group_by_task, pad_batch, to_torch
from polar_hpc.trajectory.model import Trace

from shards.helpers import make_trajectory


def test_pad_batch_aligns_masks_and_logprobs_with_tokens():
    a = make_trajectory("a", 0, n=6)
    a.traces.append(Trace([9, 8], [7], [1], [-0.5], [], [], "stop", ["v3"], [2], [{"seed": 1}],
                          [{"reasons": ["tool_choice required"], "by": "structural_tag"}]))
    b = make_trajectory("b", 1, reward=None, n=2)
    batch = pad_batch([a, b], pad_id=-1)
    assert batch["input_ids"].shape == (3, 10) and batch["input_ids"].dtype == np.int64
    assert batch["trajectory"].tolist() == [0, 0, 1] and batch["lengths"].tolist() == [10, 3, 6]
    first = a.traces[0]
    assert batch["input_ids"][0].tolist() == (first.prompt_ids + first.response_ids).tolist()
    assert batch["input_ids"][1].tolist() == [9, 8, 7] + [-1] * 7
    assert batch["attention_mask"][1].tolist() == [1, 1, 1] + [0] * 7
    assert batch["loss_mask"][0].tolist() == [0] * 4 + first.loss_mask.tolist()
    assert batch["logprobs"][0, 4:].tolist() == first.logprobs.tolist() and batch["logprobs"][0, :4].tolist() == [0] * 4
    assert batch["loss_mask"][1].tolist() == [0, 0, 1] + [0] * 7
    assert batch["rewards"][:2].tolist() == [1.0, 1.0] and math.isnan(batch["rewards"][2])
    assert batch["constrained"].tolist() == [0, 1, 0]  # rows whose calls decoded under a constraint
    # per token, the number of the version that sampled it (-1: prompt, padding, environment tokens);
    # make_trajectory's traces have no token_versions (as older shards): each call's over its run
    assert batch["token_versions"].tolist() == [[-1] * 4 + [-1, 0, 0, -1, 1, 1], [-1, -1, 3] + [-1] * 7,
                                                [-1] * 4 + [-1, 0] + [-1] * 4]
    with pytest.raises(ValueError, match="task 'a' sample 0: a trace of 10 tokens is longer than max_len 8"):
        pad_batch([a], max_len=8)
    assert pad_batch([])["input_ids"].shape == (0, 0)


def test_filter_and_group():
    trajs = [make_trajectory("a", 1, reward=0.5), make_trajectory("b", 0, status="timeout", reward=None),
             make_trajectory("a", 0, reward=2.0)]
    assert [t.sample_index for t in group_by_task(trajs)["a"]] == [0, 1]
    assert [t.task_id for t in trajs if Filter(status="timeout").passes(t)] == ["b"]
    assert [t.reward for t in trajs if Filter(reward=(None, 1.0)).passes(t)] == [0.5]
    assert [t.reward for t in trajs if Filter(reward=(1.0, None)).passes(t)] == [2.0]
    # make_trajectory's calls used versions "v0" and "v1"
    assert all(Filter(weight_versions=(0, 1)).passes(t) for t in trajs)
    assert not any(Filter(weight_versions=(1, None)).passes(t) for t in trajs)
    # a call that went on across updates is as old as its oldest token
    spanning = msgspec.structs.replace(trajs[0].traces[0], weight_versions=["v1", "v1"],
                                       token_versions=["", "v0", "v1", "", "v1", "v1"])
    trajs[0].traces[0] = spanning
    assert Filter(weight_versions=(0, None)).passes(trajs[0]) and not Filter(weight_versions=(1, None)).passes(trajs[0])
    trajs[0].traces[0] = msgspec.structs.replace(spanning, weight_versions=["main", "v1"])
    assert not Filter(weight_versions=(0, None)).passes(trajs[0])


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_to_torch_without_torch_says_what_to_install():
    with pytest.raises(ImportError, match="pip install torch"):
        to_torch(pad_batch([make_trajectory()]))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_to_torch_shares_the_arrays():
    batch = pad_batch([make_trajectory()])
    tensors = to_torch(batch)
    assert tensors["input_ids"].tolist() == batch["input_ids"].tolist()
    assert str(tensors["loss_mask"].dtype) == "torch.float32"
