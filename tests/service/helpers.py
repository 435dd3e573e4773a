"""Helpers for service-mode tests: a real `polar-hpc run --service` job and the engine's sample log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def service_job(tmp_path: Path, topology: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    """Start a service run with `topology` (YAML text); yield (job, run_dir) once its rendezvous
    file exists; kill the job on the way out if it is still running."""
    (tmp_path / "topology.yaml").write_text(topology)
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [sys.executable, "-m", "polar_hpc", "run", "--service", "-c", str(tmp_path / "topology.yaml"),
         "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "rendezvous.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.stdout.read()
            time.sleep(0.1)
        yield job, run_dir
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def samples_begun(run_dir: Path) -> list[dict]:
    """The scripted engine's sample log: a line for each generation as it begins."""
    log = run_dir / "logs" / "engine-samples.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
