"""Off-policy correction helpers on hand-computed [B, L] batches, and their properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from polar_hpc.shards import (
    correction_summary, icepop_weights, importance_ratio, log_ratio, pad_batch, sequence_mask, sequence_ratio,
    sequence_tis_weights, tis_weights,
)

from shards.helpers import make_trajectory

LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)
# Row 0: a prompt token, then three sampled tokens with ratios 2, 1/4 and 3.
# Row 1: a prompt token, one sampled token with ratio 1, then padding holding junk (NaN, ±inf).
BEHAVIOUR = np.array([[0.0, -1.0, -2.0, -0.5], [-3.0, -0.25, 0.0, -np.inf]], dtype=np.float32)
TRAINER = np.array([[np.inf, -1.0 + LN2, -2.0 - LN4, -0.5 + LN3], [np.nan, -0.25, np.nan, -np.inf]])
MASK = np.array([[0, 1, 1, 1], [0, 1, 0, 0]], dtype=np.float32)
ARGS = (TRAINER, BEHAVIOUR, MASK)


def test_token_ratios_and_padding():
    # float32 behaviour logprobs: the ratio of row 0 is 2, 1/4, 3 to float32 precision.
    np.testing.assert_allclose(log_ratio(*ARGS), [[0, LN2, -LN4, LN3], [0, 0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(importance_ratio(*ARGS), [[1, 2, 0.25, 3], [1, 1, 1, 1]], rtol=1e-6)
    assert log_ratio(*ARGS).dtype == np.float64


def test_tis_caps_from_above_and_below():
    # min(ratio, 2): 2 -> 2, 1/4 -> 1/4, 3 -> 2; row 1's token has ratio 1; off the mask 0.
    np.testing.assert_allclose(tis_weights(*ARGS), [[0, 2, 0.25, 2], [0, 1, 0, 0]], rtol=1e-6)
    # with low 0.5 the 1/4 is raised to 0.5
    np.testing.assert_allclose(tis_weights(*ARGS, cap=2.0, low=0.5), [[0, 2, 0.5, 2], [0, 1, 0, 0]], rtol=1e-6)
    # cap 1: every weight is at most 1
    np.testing.assert_allclose(tis_weights(*ARGS, cap=1.0), [[0, 1, 0.25, 1], [0, 1, 0, 0]], rtol=1e-6)


def test_icepop_keeps_the_ratio_inside_the_band():
    # [0.5, 5]: 2 and 3 kept as themselves, 1/4 masked; [0.5, 2.5]: 3 masked too.
    np.testing.assert_allclose(icepop_weights(*ARGS), [[0, 2, 0, 3], [0, 1, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(icepop_weights(*ARGS, low=0.5, high=2.5), [[0, 2, 0, 0], [0, 1, 0, 0]], rtol=1e-6)
    assert ((icepop_weights(*ARGS) > 0) == np.array([[0, 1, 0, 1], [0, 1, 0, 0]], dtype=bool)).all()


def test_sequence_ratio_geometric_and_product():
    # row 0: product 2 * 1/4 * 3 = 1.5, geometric mean 1.5 ** (1/3) = 1.1447; row 1: 1 both ways
    np.testing.assert_allclose(sequence_ratio(*ARGS, geometric=False), [1.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(sequence_ratio(*ARGS), [1.5 ** (1 / 3), 1.0], rtol=1e-6)


def test_sequence_tis_weights_every_token_of_a_row_alike():
    # product form, cap 2: row 0 weighs 1.5 on its three tokens; cap 1.2: 1.2
    np.testing.assert_allclose(sequence_tis_weights(*ARGS), [[0, 1.5, 1.5, 1.5], [0, 1, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(sequence_tis_weights(*ARGS, cap=1.2), [[0, 1.2, 1.2, 1.2], [0, 1, 0, 0]], rtol=1e-6)
    # geometric, low 1.2: row 0's 1.1447 is raised to 1.2, row 1's 1 too
    np.testing.assert_allclose(sequence_tis_weights(*ARGS, low=1.2, geometric=True), [[0, 1.2, 1.2, 1.2], [0, 1.2, 0, 0]])


def test_sequence_mask_rejects_whole_rows():
    # geometric 1.1447 is outside [0.9, 1.1]: row 0 rejected, row 1 (ratio 1) kept; [0.9, 1.2] keeps both
    np.testing.assert_array_equal(sequence_mask(*ARGS, low=0.9, high=1.1), [[0, 0, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(sequence_mask(*ARGS, low=0.9, high=1.2), [[0, 1, 1, 1], [0, 1, 0, 0]])
    # product 1.5 is outside [0.9, 1.2]
    np.testing.assert_array_equal(sequence_mask(*ARGS, low=0.9, high=1.2, geometric=False), [[0, 0, 0, 0], [0, 1, 0, 0]])


def test_summary():
    # masked ratios 2, 1/4, 3, 1: mean 6.25 / 4; k3 = mean of r - 1 - ln r
    k3 = ((2 - 1 - LN2) + (0.25 - 1 + LN4) + (3 - 1 - LN3) + 0) / 4  # 0.4611
    s = correction_summary(*ARGS)
    assert s["tokens"] == 4 and s["min_ratio"] == pytest.approx(0.25) and s["max_ratio"] == pytest.approx(3)
    assert s["mean_ratio"] == pytest.approx(1.5625) and s["k3"] == pytest.approx(k3, rel=1e-6)
    assert "masked_fraction" not in s
    # TIS cap 2: weights 2, 1/4, 2, 1: the 3 truncated (1 of 4), none masked, mean 5.25 / 4
    s = correction_summary(*ARGS, weights=tis_weights(*ARGS))
    assert (s["truncated_fraction"], s["masked_fraction"]) == (0.25, 0.0) and s["mean_weight"] == pytest.approx(1.3125)
    # IcePop [0.5, 5]: weights 2, 0, 3, 1: the 1/4 masked, none truncated, mean 6 / 4
    s = correction_summary(*ARGS, weights=icepop_weights(*ARGS))
    assert (s["truncated_fraction"], s["masked_fraction"]) == (0.0, 0.25) and s["mean_weight"] == pytest.approx(1.5)


def test_rows_without_masked_tokens():
    mask = np.array([[0, 0, 0, 0], [0, 1, 0, 0]])
    assert sequence_ratio(TRAINER, BEHAVIOUR, mask).tolist() == [1.0, 1.0]
    assert not sequence_tis_weights(TRAINER, BEHAVIOUR, mask)[0].any()
    assert not sequence_mask(TRAINER, BEHAVIOUR, mask, low=0, high=10)[0].any()
    empty = np.zeros((2, 4))
    s = correction_summary(TRAINER, BEHAVIOUR, empty, weights=tis_weights(TRAINER, BEHAVIOUR, empty))
    assert s == {"tokens": 0, "mean_ratio": 1.0, "min_ratio": 1.0, "max_ratio": 1.0, "k3": 0.0,
                 "mean_weight": 0.0, "masked_fraction": 0.0, "truncated_fraction": 0.0}
    none = np.zeros((0, 0))
    assert tis_weights(none, none, none).shape == (0, 0) and sequence_ratio(none, none, none).shape == (0,)
    assert correction_summary(none, none, none)["tokens"] == 0


def test_clipping_before_exp():
    # -inf behaviour: log-ratio clipped to +20; -inf trainer: -20; a product of three e^10 is clipped to e^20
    behaviour = np.array([[-np.inf, -1.0, -1.0, -1.0]])
    trainer = np.array([[0.0, -np.inf, 9.0, 9.0]])
    mask = np.ones((1, 4))
    assert log_ratio(trainer, behaviour, mask).tolist() == [[20.0, -20.0, 10.0, 10.0]]
    assert tis_weights(trainer, behaviour, mask).tolist() == [[2.0, math.exp(-20), 2.0, 2.0]]
    assert sequence_ratio(np.full((1, 3), 9.0), np.full((1, 3), -1.0), np.ones((1, 3)), geometric=False)[0] == math.exp(20)
    with pytest.raises(ValueError, match=r"NaN at masked position \[0, 0\]"):
        log_ratio(np.array([[-np.inf]]), np.array([[-np.inf]]), np.ones((1, 1)))


def test_shape_and_bound_errors():
    with pytest.raises(ValueError, match=r"trainer_logprobs has shape \(2, 3\), loss_mask \(2, 4\)"):
        tis_weights(TRAINER[:, :3], BEHAVIOUR, MASK)
    with pytest.raises(ValueError, match=r"behaviour_logprobs must be \[B, L\], got shape \(4,\)"):
        icepop_weights(TRAINER, BEHAVIOUR[0], MASK)
    with pytest.raises(ValueError, match=r"loss_mask must be \[B, L\]"):
        sequence_ratio(TRAINER, BEHAVIOUR, MASK[0])
    with pytest.raises(ValueError, match=r"weights has shape \(4,\)"):
        correction_summary(*ARGS, weights=MASK[0])
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(*ARGS, cap=0)
    with pytest.raises(ValueError, match="low must lie in"):
        sequence_tis_weights(*ARGS, cap=2.0, low=3.0)
    with pytest.raises(ValueError, match="low must lie in"):
        sequence_mask(*ARGS, low=1.2, high=1.1)


def test_on_a_padded_batch():
    batch = pad_batch([make_trajectory("a", 0, n=6), make_trajectory("b", 1, n=3)])
    same = tis_weights(batch["logprobs"], batch["logprobs"], batch["loss_mask"])
    np.testing.assert_array_equal(same, batch["loss_mask"])  # the trainer agrees: weight 1 on every loss token


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw):
    shape = draw(st.tuples(st.integers(0, 4), st.integers(0, 6)))
    logprobs = hnp.arrays(np.float64, shape, elements=st.floats(-40, 0))
    mask = draw(hnp.arrays(np.bool_, shape))
    trainer, behaviour = draw(logprobs), draw(logprobs)
    junk = draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))
    trainer[~mask], behaviour[~mask] = junk, junk  # padding may hold anything
    return trainer, behaviour, mask


@SETTINGS
@given(batches())
def test_equal_logprobs_give_ratio_one(batch):
    _, behaviour, mask = batch
    assert (importance_ratio(behaviour, behaviour, mask) == 1).all()
    for weights in (tis_weights(behaviour, behaviour, mask), icepop_weights(behaviour, behaviour, mask),
                    sequence_tis_weights(behaviour, behaviour, mask)):
        np.testing.assert_array_equal(weights, mask)
    assert correction_summary(behaviour, behaviour, mask)["k3"] == 0


@SETTINGS
@given(batches(), st.floats(0.01, 10))
@example((np.array([[0.0]]), np.array([[-2.82180451e-248]]), np.array([[True]])), 1.0)  # exp(lr) rounds to 1: k3 was < 0
def test_weights_within_caps_and_zero_off_the_mask(batch, cap):
    trainer, behaviour, mask = batch
    ratio = importance_ratio(trainer, behaviour, mask)
    assert np.isfinite(ratio).all() and (ratio > 0).all() and (ratio[~mask] == 1).all()
    for weights in (tis_weights(trainer, behaviour, mask, cap=cap), sequence_tis_weights(trainer, behaviour, mask, cap=cap),
                    sequence_tis_weights(trainer, behaviour, mask, cap=cap, geometric=True)):
        assert ((weights >= 0) & (weights <= cap)).all() and (weights[~mask] == 0).all()
    ice = icepop_weights(trainer, behaviour, mask, low=cap / 4, high=cap)
    kept = ice > 0
    assert ((ice[kept] >= cap / 4) & (ice[kept] <= cap)).all() and not kept[~mask].any()
    summary = correction_summary(trainer, behaviour, mask, weights=ice)
    assert all(math.isfinite(v) for v in summary.values()) and summary["k3"] >= 0
