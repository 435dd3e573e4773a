"""A trajectory as the dashboard shows it: its traces' tokens (text, loss mask, logprob) and chat.

The token text comes from the run's tokenizer when its `topology.yaml` names one that is on this
machine (`proxy.tokenizer`, else `engine.model_path`: a folder with `tokenizer.json`; the scripted
engine's own, found by `scripted_tokenizer()`); otherwise tokens are shown as ids. A trace shows
at most `max_tokens` tokens (the first ones; the rest are counted in `hidden`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from tokenizers import Tokenizer

from polar_hpc import nofollow
from polar_hpc.trajectory.model import Trajectory

_SCRIPTED = Path(__file__).resolve().parents[1] / "engines" / "scripted" / "assets"


def scripted_tokenizer() -> Path | None:
    """The scripted engine's tokenizer folder (None in an install without it)."""
    return _SCRIPTED if (_SCRIPTED / "tokenizer.json").is_file() else None


def run_tokenizer(run_dir: Path) -> Path | None:
    """The tokenizer folder the run's topology names, when it is on this machine."""
    try:
        topology = yaml.safe_load(nofollow.read_text(Path(run_dir) / "topology.yaml")) or {}
    except (OSError, yaml.YAMLError):
        return None
    engine, proxy = topology.get("engine") or {}, topology.get("proxy") or {}
    if engine.get("kind") == "scripted" and not proxy.get("tokenizer"):
        return scripted_tokenizer()
    for name in (proxy.get("tokenizer"), engine.get("model_path")):
        if isinstance(name, str) and (Path(name) / "tokenizer.json").is_file():
            return Path(name)
    return None


@lru_cache(maxsize=4)
def _load(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def view(traj: Trajectory, tokenizer: Path | None, max_tokens: int = 20_000) -> dict[str, Any]:
    tok = _load(tokenizer) if tokenizer is not None else None
    traces = []
    for tr in traj.traces:
        ids = (tr.prompt_ids.tolist() + tr.response_ids.tolist())[:max_tokens]
        n_prompt = len(tr.prompt_ids)
        mask, logprobs = tr.loss_mask.tolist(), tr.logprobs.tolist()
        tokens = []
        for i, token in enumerate(ids):
            j = i - n_prompt
            text = tok.decode([token], skip_special_tokens=False) if tok is not None else None
            tokens.append([token, text, mask[j] if j >= 0 else 0, round(logprobs[j], 5) if j >= 0 else None])
        traces.append({
            "prompt_tokens": n_prompt, "response_tokens": len(tr.response_ids), "tokens": tokens,
            "hidden": n_prompt + len(tr.response_ids) - len(ids), "trainable": sum(mask),
            "messages": tr.messages[:500], "finish_reason": tr.finish_reason,
            "weight_versions": tr.weight_versions, "call_indices": tr.call_indices,
        })
    return {
        "session_id": traj.session_id, "task_id": traj.task_id, "sample_index": traj.sample_index,
        "attempt": traj.attempt, "status": traj.status, "reward": traj.reward, "t_start": traj.t_start,
        "t_end": traj.t_end, "metadata": traj.metadata, "traces": traces, "decoded": tok is not None,
    }
