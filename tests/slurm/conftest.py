"""Fixtures for the tests that run on a real Slurm (tests/slurm/cluster.sh start): marked `slurm`.

They are skipped where no Slurm answers, unless POLAR_REQUIRE_SLURM=1 (CI), where that fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

CONF = os.environ.get("SLURM_CONF", "/tmp/polar-slurm/etc/slurm.conf")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if "tests/slurm/" in str(item.fspath):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> dict[str, str]:
    """The environment for Slurm clients (SLURM_CONF set)."""
    env = dict(os.environ, SLURM_CONF=CONF, POLAR_HPC_HOME=str(tmp_path_factory.mktemp("home")))
    ok = Path(CONF).exists() and subprocess.run(["sinfo", "-h"], env=env, capture_output=True).returncode == 0
    if not ok:
        if os.environ.get("POLAR_REQUIRE_SLURM") == "1":
            pytest.fail(f"no Slurm answers with SLURM_CONF={CONF} (start it: tests/slurm/cluster.sh start)")
        pytest.skip("no Slurm here (tests/slurm/cluster.sh install && tests/slurm/cluster.sh start)")
    return env


@pytest.fixture
def tmp_path() -> Path:
    """A folder of its own (pytest's numbered temp folders are pruned by other concurrent runs);
    the jobs of its runs (grow jobs too) are cancelled at the end, so a failed test leaves none to block the next."""
    path = Path(tempfile.mkdtemp(prefix="polar-slurm-test-"))
    yield path
    jobs = [json.loads(p.read_text())["job_id"] for p in path.glob("*/job.json")]
    jobs += [json.loads(x)["job"] for p in path.glob("*/journal/grow.jsonl") for x in p.read_text().splitlines()]
    if jobs:
        subprocess.run(["scancel", *jobs], env=dict(os.environ, SLURM_CONF=CONF), capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def journal(run_dir: Path) -> list[dict]:
    path = run_dir / "journal" / "orchestrator.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def results(run_dir: Path) -> list[dict]:
    return [e for e in journal(run_dir) if e["event"] == "result"]


def wait_for(what: str, cond, timeout_s: float, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def job_gone(env: dict, job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True)
    return out.returncode == 0 and not out.stdout.strip()


def write_topology(path: Path, gpus: int = 2, extra: tuple[str, ...] = (), **engine) -> Path:
    """A scripted-engine topology for the test cluster (`engine` keys under `engine:`, `extra` lines last)."""
    lines = ["engine:", "  kind: scripted"] + [f"  {k}: {v}" for k, v in engine.items()]
    lines += ["gateway:", "  heartbeat_s: 0.5", "  peer_timeout_s: 3", "slurm:", '  time: "10:00"',
              f"  gpu: {{nodes: 1, gpus: {gpus}, cpus: 1}}", "  cpu: {nodes: 1, cpus: 2}", "  signal_s: 30", *extra]
    path.write_text("\n".join(lines) + "\n")
    return path
