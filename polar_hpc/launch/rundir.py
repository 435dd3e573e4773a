"""Lay out a new run directory: validated tasks and resolved topology written into it.

`prepare(tasks_path, topology_path, run_dir)` validates both files first (ConfigError on bad
input, nothing created), then makes `<run>/` (mode 0700) with logs/, shards/, journal/,
`tasks.jsonl` and `topology.yaml` (a service run: inbox/ too, and the task file is optional).
The default folder is `./runs/<time>-<name>` (the task id or file name, reduced to a plain folder
name); a folder that already holds a run is refused (`check_new`, also what `submit --dry-run` checks).

A Slurm run records its job: `<run>/job.json` {"job_id"} and `~/.polar-hpc/jobs/<job id>` (the run
dir; `$POLAR_HPC_HOME` overrides the folder), written by `submit` and again by the driver when the
job starts (so a job submitted by hand with `polar-hpc sbatch` is found too). `resolve` maps a run
directory or a job id back to (run dir, job id). `append_event` adds one timestamped JSON line to a
journal of the launchers (`journal/driver.jsonl`, `journal/grow.jsonl`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import yaml

from polar_hpc import suites
from polar_hpc.config import ConfigError, Task, Topology, load_topology


def prepare(tasks_path: Path | None, topology_path: Path | None, run_dir: Path | None,
            service: bool = False) -> tuple[Path, list[Task], Topology]:
    topology = load_topology(topology_path)
    if service:
        topology = topology.model_copy(update={"service": topology.service.model_copy(update={"enabled": True})})
    tasks = load_run_tasks(tasks_path, topology)
    name = _folder_name("service" if tasks_path is None else tasks[0].id if len(tasks) == 1 else tasks_path.stem)
    chosen = run_dir or (Path(topology.run_dir) if topology.run_dir else None)
    run_dir = check_new((chosen or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}").resolve())
    for sub in ("logs", "shards", "journal") + (("inbox",) if topology.service.enabled else ()):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o700)
    if topology.engine.script and topology_path is not None:  # resolved against the topology file
        script = str((topology_path.parent / topology.engine.script).resolve())
        topology = topology.model_copy(update={"engine": topology.engine.model_copy(update={"script": script})})
    (run_dir / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    (run_dir / "topology.yaml").write_text(
        yaml.safe_dump(topology.model_dump(mode="json") | {"run_dir": str(run_dir)}, sort_keys=False)
    )
    return run_dir, tasks, topology


def load_run_tasks(tasks_path: Path | None, topology: Topology) -> list[Task]:
    """The run's tasks; only a service run may start without a task file."""
    if tasks_path is None:
        if not topology.service.enabled:
            raise ConfigError("no task file given; only a service run (service.enabled, or `run --service`) "
                              "may start without one")
        return []
    warnings: list[str] = []
    tasks = suites.load(tasks_path, warnings=warnings)  # our task files, Harbor task folders, SWE-bench datasets
    for warning in warnings:  # what a suite holds that this run ignores or leaves out
        print(f"warning: {warning}", file=sys.stderr)
    if problems := suites.images.unpulled(tasks):  # refused before the run, never run on the host's tree
        raise ConfigError("\n".join(problems))
    return tasks


def check_new(run_dir: Path) -> Path:
    if (run_dir / "tasks.jsonl").exists():
        raise ConfigError(f"--run-dir {run_dir}: already holds a run; choose a new folder "
                          f"(or `polar-hpc resume {run_dir}` to continue it)")
    return run_dir


def job_index() -> Path:
    return Path(os.environ.get("POLAR_HPC_HOME", Path.home() / ".polar-hpc")) / "jobs"


def record_job(job_id: str, run_dir: Path) -> None:
    (run_dir / "job.json").write_text(json.dumps({"job_id": job_id}))
    job_index().mkdir(parents=True, exist_ok=True)
    (job_index() / job_id).write_text(str(run_dir))


def append_event(path: Path, event: str, **fields) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"t": round(time.time(), 3), "event": event, **fields}) + "\n")


def resolve(target: str) -> tuple[Path, str | None]:
    """(run directory, its latest job id or None) for a run directory or a job id."""
    path = Path(target)
    if not (path / "tasks.jsonl").exists():
        entry = job_index() / target
        if not entry.exists():
            raise ConfigError(f"{target}: neither a run directory nor a job id of a run started from here "
                              "(a job submitted by hand is known once its driver has started)")
        path = Path(entry.read_text().strip())
    job = path / "job.json"
    return path.resolve(), json.loads(job.read_text())["job_id"] if job.exists() else None


def _folder_name(name: str) -> str:
    """`name` as one plain folder name: [A-Za-z0-9._-] only, no leading dot, at most 64 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:64] or "tasks"
