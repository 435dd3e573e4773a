"""Lay out a new run directory: validated tasks and resolved topology written into it.

`prepare(tasks_path, topology_path, run_dir)` validates both files first (ConfigError on bad
input, nothing created), then makes `<run>/` (mode 0700) with logs/, shards/, journal/,
`tasks.jsonl` and `topology.yaml` (a service run: inbox/ too, and the task file is optional).
The default folder is `./runs/<time>-<name>` (the task id or file name, reduced to a plain folder
name); a folder that already holds a run is refused.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import yaml

from polar_hpc.config import ConfigError, Task, Topology, load_tasks, load_topology


def prepare(tasks_path: Path | None, topology_path: Path | None, run_dir: Path | None,
            service: bool = False) -> tuple[Path, list[Task], Topology]:
    topology = load_topology(topology_path)
    if service:
        topology = topology.model_copy(update={"service": topology.service.model_copy(update={"enabled": True})})
    tasks = load_run_tasks(tasks_path, topology)
    name = _folder_name("service" if tasks_path is None else tasks[0].id if len(tasks) == 1 else tasks_path.stem)
    chosen = run_dir or (Path(topology.run_dir) if topology.run_dir else None)
    run_dir = (chosen or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}").resolve()
    if (run_dir / "tasks.jsonl").exists():
        raise ConfigError(f"--run-dir {run_dir}: already holds a run; choose a new folder")
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
    return load_tasks(tasks_path)


def _folder_name(name: str) -> str:
    """`name` as one plain folder name: [A-Za-z0-9._-] only, no leading dot, at most 64 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:64] or "tasks"
