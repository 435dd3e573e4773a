"""Shared test helpers: run the real `polar-hpc` command as a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# Property tests draw the same examples on every run, each test its own (a landing is never blocked
# by an example found by chance; one that found a bug stays as an `@example`); `pytest
# --hypothesis-profile explore` draws new ones.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("ci")

# A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and so would every
# process a test starts (Python keeps an ignored SIGINT); the tests that press Ctrl-C need it as a
# terminal gives it. A handler here is reset to the default in each child at exec.
signal.signal(signal.SIGINT, signal.default_int_handler)


def polar(*args: str, timeout: float = 280, **kwargs) -> subprocess.CompletedProcess:
    """Run `polar-hpc ARGS` (this interpreter) and capture its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "polar_hpc", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, **kwargs,
    )


@contextmanager
def background(args: list, run_dir: Path, ready: Callable[[Path], bool], what: str, timeout: float = 180) -> Iterator[Path]:
    """`polar-hpc ARGS` running in its own session until `ready(run_dir)` (asserted, with `what`
    said otherwise); stopped with SIGINT (SIGKILL after 60 s) when the block ends."""
    proc = subprocess.Popen([sys.executable, "-m", "polar_hpc", *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ready(run_dir):
            time.sleep(0.5)
        assert ready(run_dir), what
        yield run_dir
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def calculator_dir() -> Path:
    return ROOT / "examples" / "calculator"
