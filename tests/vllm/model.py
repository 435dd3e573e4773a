"""The model the vLLM tests serve (a stub until the trained tiny model lands: the dev model)."""

from __future__ import annotations

import os
from pathlib import Path


def model_dir() -> Path:
    return Path(os.environ.get("POLAR_VLLM_MODEL", "/work/vllm/model-dev"))
