"""Off-policy correction for trainers: importance weights between the behaviour policy (the sampler's
logprobs that `pad_batch` puts in `logprobs`) and the trainer's current logprobs of the same tokens.

Every function takes `trainer_logprobs`, `behaviour_logprobs` and `loss_mask`, all [B, L] (`pad_batch`'s
layout; a position counts where `loss_mask != 0`), checks the shapes (ValueError naming the argument)
and returns float64 numpy arrays. Per token, `log_ratio = trainer - behaviour` is clipped to
±`LOG_RATIO_CLIP` (20: ratios within e^±20) before any `exp`, so a -inf logprob or a long product
never overflows; a NaN on a masked position raises ValueError. Off the mask (prompt, tool output,
padding) the inputs are never read into a result: log-ratios are 0, ratios 1, weights 0 — a weight
array is the loss mask already multiplied in. A row with no masked token has sequence ratio 1 and
weight 0 everywhere.

Plain numpy: the weights are constants of the loss (stop-gradient), so a torch trainer passes
`t.detach().cpu().numpy()` and multiplies its per-token loss by `torch.from_numpy(w).to(t)`.
Formulas and when to use which: docs/shards.md, "Off-policy correction".
"""

from __future__ import annotations

from typing import Any

import numpy as np

LOG_RATIO_CLIP = 20.0


def _inputs(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = {"trainer_logprobs": trainer_logprobs, "behaviour_logprobs": behaviour_logprobs, "loss_mask": loss_mask}
    out = {name: np.asarray(a) for name, a in arrays.items()}
    for name, a in out.items():
        if a.ndim != 2:
            raise ValueError(f"{name} must be [B, L], got shape {a.shape}")
    for name in ("trainer_logprobs", "behaviour_logprobs"):
        if out[name].shape != out["loss_mask"].shape:
            raise ValueError(f"{name} has shape {out[name].shape}, loss_mask {out['loss_mask'].shape}")
    return out["trainer_logprobs"].astype(np.float64), out["behaviour_logprobs"].astype(np.float64), out["loss_mask"] != 0


def _check_bounds(low: float | None, high: float, low_name: str, high_name: str) -> None:
    if not high > 0:
        raise ValueError(f"{high_name} must be > 0, got {high}")
    if low is not None and not 0 <= low <= high:
        raise ValueError(f"{low_name} must lie in [0, {high_name}={high}], got {low}")


def _log_ratio(trainer: np.ndarray, behaviour: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # inf - inf off the mask is discarded by the where
        diff = np.where(mask, trainer - behaviour, 0.0)
    if np.isnan(diff).any():
        b, t = np.argwhere(np.isnan(diff))[0]
        raise ValueError(f"log-ratio is NaN at masked position [{b}, {t}] (a NaN logprob, or -inf in both)")
    return np.clip(diff, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)


def log_ratio(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any) -> np.ndarray:
    """Per token `clip(trainer - behaviour, ±LOG_RATIO_CLIP)` on masked positions, 0 elsewhere; [B, L]."""
    return _log_ratio(*_inputs(trainer_logprobs, behaviour_logprobs, loss_mask))


def importance_ratio(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any) -> np.ndarray:
    """Per token `exp(log_ratio)` = pi_trainer / pi_behaviour on masked positions, 1 elsewhere; [B, L]."""
    return np.exp(log_ratio(trainer_logprobs, behaviour_logprobs, loss_mask))


def tis_weights(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any, cap: float = 2.0,
                low: float | None = None) -> np.ndarray:
    """Truncated importance sampling: `min(ratio, cap)` (and `max(., low)` if `low`) per masked token, 0 elsewhere."""
    _check_bounds(low, cap, "low", "cap")
    trainer, behaviour, mask = _inputs(trainer_logprobs, behaviour_logprobs, loss_mask)
    return np.where(mask, np.clip(np.exp(_log_ratio(trainer, behaviour, mask)), low, cap), 0.0)


def icepop_weights(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any, low: float = 0.5,
                   high: float = 5.0) -> np.ndarray:
    """IcePop masking: the token's ratio where it lies in [low, high], 0 outside the band and off the mask.

    `icepop_weights(...) > 0` is the kept-token mask, for a trainer that rejects without reweighting."""
    _check_bounds(low, high, "low", "high")
    trainer, behaviour, mask = _inputs(trainer_logprobs, behaviour_logprobs, loss_mask)
    ratio = np.exp(_log_ratio(trainer, behaviour, mask))
    return np.where(mask & (ratio >= low) & (ratio <= high), ratio, 0.0)


def _sequence_ratio(trainer: np.ndarray, behaviour: np.ndarray, mask: np.ndarray, geometric: bool) -> np.ndarray:
    total = _log_ratio(trainer, behaviour, mask).sum(axis=1)
    if geometric:
        total = total / np.maximum(mask.sum(axis=1), 1)
    return np.exp(np.clip(total, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))


def sequence_ratio(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any, geometric: bool = True) -> np.ndarray:
    """Per row [B]: the geometric mean of its masked tokens' ratios, `exp(mean(log_ratio))`, or with
    `geometric=False` their product `exp(sum(log_ratio))` (the sum clipped to ±LOG_RATIO_CLIP); 1 for an empty row."""
    return _sequence_ratio(*_inputs(trainer_logprobs, behaviour_logprobs, loss_mask), geometric)


def sequence_tis_weights(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any, cap: float = 2.0,
                         low: float | None = None, geometric: bool = False) -> np.ndarray:
    """Sequence-level TIS: every masked token of a row weighs `min(sequence_ratio, cap)` (and `max(., low)`);
    the product form by default (`geometric=False`), 0 off the mask; [B, L]."""
    _check_bounds(low, cap, "low", "cap")
    trainer, behaviour, mask = _inputs(trainer_logprobs, behaviour_logprobs, loss_mask)
    weight = np.clip(_sequence_ratio(trainer, behaviour, mask, geometric), low, cap)
    return np.where(mask, weight[:, None], 0.0)


def sequence_mask(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any, *, low: float, high: float,
                  geometric: bool = True) -> np.ndarray:
    """Sequence-level masking: 1 on the masked tokens of rows whose `sequence_ratio` lies in [low, high],
    0 elsewhere (a whole row is rejected); [B, L]. Multiply by `tis_weights` to reweight the rows kept."""
    _check_bounds(low, high, "low", "high")
    trainer, behaviour, mask = _inputs(trainer_logprobs, behaviour_logprobs, loss_mask)
    ratio = _sequence_ratio(trainer, behaviour, mask, geometric)
    return np.where(mask & ((ratio >= low) & (ratio <= high))[:, None], 1.0, 0.0)


def correction_summary(trainer_logprobs: Any, behaviour_logprobs: Any, loss_mask: Any,
                       weights: Any = None) -> dict[str, float]:
    """What a trainer logs, over the masked tokens: `tokens`, `mean_ratio`, `min_ratio`, `max_ratio`, and
    `k3`, the mean of `ratio - 1 - log_ratio` (an estimate of KL(behaviour || trainer), >= 0). With the
    `weights` a helper returned: `mean_weight`, `masked_fraction` (tokens weighted 0) and
    `truncated_fraction` (tokens kept with a weight other than their own ratio: the ones a cap changed,
    for token-level weights). With no masked token: 0 tokens, ratios 1, everything else 0."""
    trainer, behaviour, mask = _inputs(trainer_logprobs, behaviour_logprobs, loss_mask)
    lr = _log_ratio(trainer, behaviour, mask)[mask]
    ratio = np.exp(lr)
    n = int(mask.sum())
    summary = {
        "tokens": n,
        "mean_ratio": float(ratio.mean()) if n else 1.0,
        "min_ratio": float(ratio.min()) if n else 1.0,
        "max_ratio": float(ratio.max()) if n else 1.0,
        "k3": float(np.maximum(np.expm1(lr) - lr, 0.0).mean()) if n else 0.0,  # expm1: exact for tiny lr
    }
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != mask.shape:
            raise ValueError(f"weights has shape {w.shape}, loss_mask {mask.shape}")
        w = w[mask]
        summary["mean_weight"] = float(w.mean()) if n else 0.0
        summary["masked_fraction"] = float((w == 0).mean()) if n else 0.0
        summary["truncated_fraction"] = float(((w != 0) & (w != ratio)).mean()) if n else 0.0
    return summary
