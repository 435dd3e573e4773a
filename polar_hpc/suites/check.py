"""`polar-hpc tasks check SUITE`: validate a suite (or any task file) and print one row per task;
then a ConfigError for every task `run` would refuse (an image not pulled)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from polar_hpc import suites
from polar_hpc.config import ConfigError, Task
from polar_hpc.suites import dockerfile


def show(path: Path, console: Console) -> None:
    """Load `path` as `polar-hpc run` would (ConfigError on bad input) and print what it ignores
    (one `warning: FILE:LINE: FIELD: why` each) and its tasks."""
    warnings: list[str] = []
    tasks = suites.load(path, warnings=warnings)
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    table = Table("task", "suite", "harness", "environment", "timeout_s", "evaluator", "solution", "resources",
                  title=f"{path}: {len(tasks)} task(s), {sum(t.num_samples for t in tasks)} session(s)")
    for task in tasks:
        table.add_row(task.id, str(task.metadata.get("suite", "tasks")), task.harness.kind,
                      _environment(task), f"{task.timeout_s:g}", _evaluator(task), _solution(task), _resources(task))
    console.print(table)
    if problems := suites.images.unpulled(tasks):  # what `run` would refuse
        raise ConfigError("\n".join(problems))


def _environment(task: Task) -> str:
    box, pulled = task.sandbox, task.metadata.get("image")
    if pulled:
        how = "built" if pulled["reference"].startswith("build:") else "pulled"
        return f"{pulled['reference']} ({how}: {Path(box.image or '').suffix[1:]})"
    if box.image and suites.images.is_reference(box.image):
        return f"{box.image} (NOT PULLED: run `polar-hpc image pull`)"
    if task.metadata.get("build"):
        return "Dockerfile only: NOT BUILT (run `polar-hpc image pull`)"
    if task.metadata.get("dockerfile"):
        return f"{dockerfile.ON_HOST} ({len(box.files)} file(s))"
    return box.image or f"host + {len(box.files)} file(s)"


def _evaluator(task: Task) -> str:
    spec = task.evaluator
    if spec is None:
        return "-"
    if spec.kind == "tests":
        parts = (["tests/"] if spec.dir else []) + (["test patch"] if spec.patch else [])
        fresh = ", fresh sandbox" if spec.sandbox == "fresh" else ""
        return f"tests ({', '.join(parts) or 'command'}, {spec.timeout_s:g}s{fresh})"
    if spec.kind == "swebench":
        return f"swebench ({spec.instance['repo']} {spec.instance['version']}, {spec.timeout_s:g}s)"
    return spec.kind


def _solution(task: Task) -> str:
    s = task.solution
    return "-" if s is None else ", ".join((["solve.sh"] if s.dir else []) + (["patch"] if s.patch else []))


def _resources(task: Task) -> str:
    box = task.sandbox
    parts = [f"{box.cpus:g} cpu" if box.cpus else "", f"{box.memory_mb} MB mem" if box.memory_mb else "",
             f"{box.storage_mb} MB disk" if box.storage_mb else ""]
    return ", ".join(p for p in parts if p) or "-"
