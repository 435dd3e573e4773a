"""`polar-hpc grow --dry-run` renders a plain one-component job with the one renderer; bad grow and
shrink requests are one-line errors with exit code 2 (the grow itself: tests/slurm/test_grow.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import polar

HERE = Path(__file__).resolve().parent


def _prepared(calculator_dir: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    out = polar("sbatch", "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml", "--run-dir", run_dir)
    assert out.returncode == 0, out.stderr
    return run_dir


def test_grow_dry_run_is_one_plain_job_running_the_member_driver(calculator_dir: Path, tmp_path: Path) -> None:
    run_dir = _prepared(calculator_dir, tmp_path)
    out = polar("grow", run_dir, "--nodes", "3", "--partition", "scavenger", "--time", "30:00",
                "--sbatch=--qos=low", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.replace(sys.executable, "PYTHON").splitlines()
    assert "#SBATCH hetjob" not in lines  # one component
    for line in ("#SBATCH --nodes=3", "#SBATCH --partition=scavenger", "#SBATCH --time=30:00", "#SBATCH --qos=low",
                 "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={run_dir}/logs/grow-%j.out", "#SBATCH --requeue"):
        assert line in lines, out.stdout
    assert lines[-1] == f"exec PYTHON -m polar_hpc member --run-dir {run_dir} --roles gateway"
    assert not (run_dir / "journal" / "grow.jsonl").exists()  # nothing submitted


def test_grow_dry_run_with_engines_is_a_hetjob_engines_first(calculator_dir: Path, tmp_path: Path) -> None:
    run_dir = _prepared(calculator_dir, tmp_path)
    both = polar("grow", run_dir, "--engines", "2", "--nodes", "1", "--dry-run")
    assert both.returncode == 0, both.stderr
    lines = both.stdout.replace(sys.executable, "PYTHON").splitlines()
    split = lines.index("#SBATCH hetjob")  # component 0: the engine nodes, shaped like slurm.gpu; 1: the gateways
    assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu",
            "#SBATCH --signal=B:USR2@120"} <= set(lines[:split])
    assert "#SBATCH --nodes=1" in lines[split:] and not any("gpus" in x or "signal" in x for x in lines[split:])
    assert lines[-1] == f"exec PYTHON -m polar_hpc member --run-dir {run_dir} --roles engine,gateway"
    alone = polar("grow", run_dir, "--engines", "1", "--nodes", "0", "--dry-run")
    lines = alone.stdout.replace(sys.executable, "PYTHON").splitlines()
    assert "#SBATCH hetjob" not in lines and "#SBATCH --gpus-per-node=8" in lines, alone.stdout
    assert lines[-1] == f"exec PYTHON -m polar_hpc member --run-dir {run_dir} --roles engine"


def test_bad_grow_and_shrink_requests_are_one_line_errors(calculator_dir: Path, tmp_path: Path) -> None:
    run_dir = _prepared(calculator_dir, tmp_path)
    env = dict(os.environ, POLAR_HPC_HOME=str(tmp_path / "home"))
    cases = [
        (["grow", run_dir], "the run has no job queued or running (job none)"),  # never submitted
        (["grow", run_dir, "--nodes", "0"], "--nodes and --engines must not be negative nor both 0, --cpus at least 1"),
        (["grow", run_dir, "--engines", "-1"], "--nodes and --engines must not be negative"),
        (["member", "--run-dir", run_dir, "--roles", "gateway,gpu"], "member --roles 'gateway,gpu': a comma list of"),
        (["grow", tmp_path / "nothing-here"], "neither a run directory nor a job id"),
        (["shrink", run_dir, "123"], "job 123 is not a grow job of this run (its grow jobs: none)"),
    ]
    for args, message in cases:
        out = polar(*args, env=env)
        assert out.returncode == 2 and message in out.stderr, out
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    out = polar("shrink", run_dir, env=env)
    assert out.returncode == 0 and "no grow job of this run is queued or running" in out.stdout, out
