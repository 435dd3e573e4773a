"""Task suites as input: `load(path)` -> list[Task] for anything `polar-hpc run` accepts as tasks.

- a folder: Harbor-format tasks (suites.harbor), run with `harness: oracle`;
- a SWE-bench-style dataset (JSONL whose first record has instance_id and problem_statement, or
  Parquet): suites.swebench, run with `harness: oracle`;
- a YAML file whose top level is a suite reference: `suite: PATH` (relative to the file) with the
  `harness` to run (default oracle), `num_samples`, `builder`, `network` and `metadata` (merged
  into each task's) applied to every task of that suite;
- anything else: our own YAML / JSONL task files (config.load_tasks).
Bad input raises ConfigError naming file, line (or row) and field; duplicate ids are refused.
A task whose image was pulled (`polar-hpc image pull`, suites.images) runs in the cached entry.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar_hpc.config import (
    MAX_SAMPLES,
    MAX_SESSIONS,
    ConfigError,
    HarnessSpec,
    Task,
    duplicate_ids,
    load_tasks,
    validate_data,
)
from polar_hpc.config_files import MAX_YAML_BYTES, read_text, read_yaml
from polar_hpc.suites import harbor, images, swebench

ORACLE = HarnessSpec(kind="oracle")
_REFERENCE = re.compile(r"^suite\s*:", re.M)


class SuiteRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    suite: str
    harness: HarnessSpec = ORACLE
    num_samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    builder: Literal["per_request", "prefix_merge"] = "prefix_merge"
    network: Literal["none", "proxy-only", "host"] | None = None
    metadata: dict[str, Any] = {}


def load(path: Path, cached_images: bool = True) -> list[Task]:
    """The tasks of `path`; with `cached_images`, each pulled image replaced by its cache entry."""
    tasks = _load(path)
    return images.use_cached(tasks) if cached_images else tasks


def _load(path: Path) -> list[Task]:
    if path.is_dir():
        tasks = harbor.load(path, ORACLE)
    elif swebench.is_dataset(path):
        tasks = swebench.load(path, ORACLE)
    elif path.suffix in (".yaml", ".yml") and _REFERENCE.search(read_text(path, MAX_YAML_BYTES)):
        tasks = _reference(path)
    else:
        return load_tasks(path)
    dup = duplicate_ids([t.id for t in tasks])
    if dup:
        raise ConfigError(f"{path}: duplicate task id(s): {', '.join(dup[:20])}")
    if (sessions := sum(t.num_samples for t in tasks)) > MAX_SESSIONS:
        raise ConfigError(f"{path}: {sessions} sessions (tasks x num_samples); at most {MAX_SESSIONS}")
    return tasks


def _reference(path: Path) -> list[Task]:
    data, line_of = read_yaml(path)
    ref = validate_data(SuiteRef, data, path, line_of)
    target = path.parent / ref.suite
    if target.is_dir():
        tasks = harbor.load(target, ref.harness)
    elif target.is_file() and (target.suffix == ".parquet" or swebench.is_dataset(target)):
        tasks = swebench.load(target, ref.harness)
    else:
        raise ConfigError(f"{path}:{line_of(('suite',))}: suite: {target} is neither a folder of Harbor tasks "
                          "nor a SWE-bench dataset (.jsonl, .parquet)")
    return [_apply(t, ref) for t in tasks]


def _apply(task: Task, ref: SuiteRef) -> Task:
    update: dict[str, Any] = {"num_samples": ref.num_samples, "builder": ref.builder,
                              "metadata": task.metadata | ref.metadata}
    if ref.network:
        update["sandbox"] = task.sandbox.model_copy(update={"network": ref.network})
    return task.model_copy(update=update)
