"""Shared test helpers: run the real `polar-hpc` command as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def polar(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run `polar-hpc ARGS` (this interpreter) and capture its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "polar_hpc", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, **kwargs,
    )


@pytest.fixture
def calculator_dir() -> Path:
    return ROOT / "examples" / "calculator"
