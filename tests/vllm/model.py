"""The model the vLLM tests serve (a stub until the trained tiny model is merged)."""

from __future__ import annotations

from pathlib import Path


def model_dir() -> Path:
    return Path("/work/vllm/model-dev")
