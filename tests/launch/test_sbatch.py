"""`polar-hpc submit --dry-run` and `polar-hpc sbatch`: the hetjob script, and bad topologies."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from tests.conftest import polar

HERE = Path(__file__).resolve().parent


def _directives(script: str) -> list[str]:
    """The script up to its command, but the output path (the command and output differ by design)."""
    return [x for x in script.partition("# command")[0].splitlines() if not x.startswith("#SBATCH --output=")]


def test_dry_run_equals_the_golden_file(calculator_dir: Path, tmp_path: Path) -> None:
    out = polar("submit", "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml",
                "--run-dir", "/RUN", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.replace(sys.executable, "PYTHON") == (HERE / "golden" / "dry-run.sbatch").read_text()
    assert not Path("/RUN").exists()  # a dry run writes nothing


def test_sbatch_renders_the_same_job_and_prepares_the_run(calculator_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = polar("sbatch", "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml", "--run-dir", run_dir)
    assert out.returncode == 0, out.stderr
    golden = (HERE / "golden" / "dry-run.sbatch").read_text()
    assert _directives(out.stdout) == _directives(golden)  # extra_sbatch too, with component 0's lines
    assert f"#SBATCH --output={run_dir}/logs/slurm-%j.out" in out.stdout.splitlines()
    assert out.stdout.rstrip().endswith(f"-m polar_hpc driver --run-dir {run_dir}")
    assert (run_dir / "tasks.jsonl").exists() and (run_dir / "topology.yaml").exists()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for key in ("server.json", "client.json"):
        assert stat.S_IMODE((run_dir / "keys" / key).stat().st_mode) == 0o600


def test_invalid_topology_names_the_field(calculator_dir: Path, tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("slurm:\n  gpu:\n    nodes: 0\n  cpu:\n    cpus: 4\n    gpu: 1\n")
    for command in (["submit", "--dry-run"], ["submit"], ["sbatch"]):
        out = polar(*command, "-c", topo, "--tasks", calculator_dir / "task.yaml", "--run-dir", tmp_path / "run")
        assert out.returncode == 2, out
        assert f"{topo}:3: slurm.gpu.nodes: Input should be greater than or equal to 1" in out.stderr
        assert f"{topo}:6: slurm.cpu.gpu: unknown key" in out.stderr
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_readme_topology_example_is_valid(tmp_path: Path) -> None:
    import re

    from polar_hpc.config import load_topology

    readme = (HERE.parent.parent / "README.md").read_text()
    section = readme.split("## Running on Slurm", 1)[1]
    path = tmp_path / "topology.yaml"
    path.write_text(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    topology = load_topology(path)
    assert (topology.slurm.gpu.nodes, topology.slurm.gpu.gpus, topology.slurm.cpu.nodes) == (2, 8, 4)
    assert topology.engine.kind == "sglang" and topology.engine.tp_size == 8


def test_status_and_cancel_of_an_unknown_run(tmp_path: Path) -> None:
    for command in ("status", "cancel"):
        out = polar(command, tmp_path / "nothing-here", env=dict(os.environ, POLAR_HPC_HOME=str(tmp_path)))
        assert out.returncode == 2 and "neither a run directory nor a job id of a run started from here" in out.stderr, out


def test_submit_without_slurm_says_so(calculator_dir: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no sbatch on this PATH
    out = polar("submit", "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml",
                "--run-dir", tmp_path / "run", env=env)
    assert out.returncode == 2 and "no `sbatch` here" in out.stderr, out
    assert not (tmp_path / "run").exists()


def test_dry_run_refuses_a_run_dir_that_holds_a_run_as_submit_does(calculator_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = polar("sbatch", "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml", "--run-dir", run_dir)
    assert out.returncode == 0, out.stderr
    for command in (["submit", "--dry-run"], ["sbatch"]):
        again = polar(*command, "-c", HERE / "topology.yaml", "--tasks", calculator_dir / "task.yaml",
                      "--run-dir", run_dir)
        assert again.returncode == 2 and f"--run-dir {run_dir}: already holds a run" in again.stderr, again
        assert "#SBATCH" not in again.stdout and "Traceback" not in again.stderr
    status = polar("status", run_dir)  # prepared for sbatch by hand, not started yet
    assert status.returncode == 0 and "none has started for this run yet" in status.stdout, status
    assert "0 of 8 sessions ended (none), 8 never ended" in status.stdout and "no driver has started" in status.stdout
    # logs cut by a kill, or damaged: read as far as they are whole, never a traceback
    (run_dir / "journal" / "driver.jsonl").write_text('{"event": "start", "job": "77"}\n[1, 2]\n{"event": "en')
    (run_dir / "journal" / "orchestrator.jsonl").write_text(
        '{"event": "result", "session": 5}\nnot json\n{"event": "result", "session": "calculator-basic#0.0", '
        '"status": "completed"}\n{"event": "queued", "session": "calculator-basic#1.0"')
    status = polar("status", run_dir)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status
    assert "1 of 8 sessions ended (completed 1), 7 never ended" in status.stdout, status.stdout
    assert "the driver of job 77 ended without saying why: it was killed" in status.stdout, status.stdout
