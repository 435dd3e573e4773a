"""Task suites as input: `load(path)` -> list[Task] for anything `polar-hpc run` accepts as tasks.

- a folder: Harbor-format tasks (suites.harbor), run with `harness: oracle`;
- a SWE-bench dataset as published (JSON Lines or a JSON array whose first record has
  instance_id and problem_statement, or Parquet): suites.swebench, run with `harness: oracle`;
- a YAML file whose top level is a suite reference: `suite: PATH` (relative to the file) with the
  `harness` to run (default oracle), `num_samples`, `builder`, `network`, `verifier_sandbox`
  (session | fresh: where hidden tests run, docs/tasks.md) and `metadata` (merged into each
  task's) applied to every task of that suite, for a SWE-bench dataset `image`, a template
  naming every instance's image (suites.swebench), and `dockerfile: host` (default `build`): its
  Harbor tasks with only a Dockerfile run on the host's tree plus environment/workspace instead of
  in the image `image pull` builds (suites.dockerfile), said in `tasks check`'s table;
- anything else: our own YAML / JSONL task files (config.load_tasks).
Bad input raises ConfigError naming file, line (or row) and field; duplicate ids are refused.
What is loaded but ignored or left out (a task.toml key not honoured, a multi-step task) is
appended to `warnings`, one `FILE:LINE: FIELD: why` each.
A task whose image was pulled (`polar-hpc image pull`, suites.images) runs in the cached entry.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from polar_hpc.config import (
    MAX_SAMPLES,
    MAX_SESSIONS,
    ConfigError,
    HarnessSpec,
    Task,
    TestsEvaluator,
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
    verifier_sandbox: Literal["session", "fresh"] | None = None
    metadata: dict[str, Any] = {}
    image: str | None = None  # SWE-bench datasets: a template for each instance's image
    dockerfile: harbor.Dockerfiles = "build"  # Harbor tasks with only a Dockerfile

    @pydantic.field_validator("image")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else swebench.check_template(value)


def load(path: Path, cached_images: bool = True, warnings: list[str] | None = None) -> list[Task]:
    """The tasks of `path`; with `cached_images`, each pulled image replaced by its cache entry."""
    tasks = _load(path, [] if warnings is None else warnings)
    return images.use_cached(tasks) if cached_images else tasks


def _load(path: Path, warnings: list[str]) -> list[Task]:
    if path.is_dir():
        tasks = harbor.load(path, ORACLE, warnings)
    elif swebench.is_dataset(path):
        tasks = swebench.load(path, ORACLE)
    elif path.suffix in (".yaml", ".yml") and _REFERENCE.search(read_text(path, MAX_YAML_BYTES)):
        tasks = _reference(path, warnings)
    else:
        return load_tasks(path)
    dup = duplicate_ids([t.id for t in tasks])
    if dup:
        raise ConfigError(f"{path}: duplicate task id(s): {', '.join(dup[:20])}")
    if (sessions := sum(t.num_samples for t in tasks)) > MAX_SESSIONS:
        raise ConfigError(f"{path}: {sessions} sessions (tasks x num_samples); at most {MAX_SESSIONS}")
    return tasks


def _reference(path: Path, warnings: list[str]) -> list[Task]:
    data, line_of = read_yaml(path)
    ref = validate_data(SuiteRef, data, path, line_of)
    target = path.parent / ref.suite
    if target.is_dir() and ref.image is None:
        tasks = harbor.load(target, ref.harness, warnings, ref.verifier_sandbox or "session", ref.dockerfile)
    elif target.is_dir():
        raise ConfigError(f"{path}:{line_of(('image',))}: image: only for a SWE-bench dataset (a Harbor task names "
                          "its own)")
    elif target.is_file() and swebench.is_dataset(target):
        image = None if ref.image is None else (ref.image, f"{path}:{line_of(('image',))}: image")
        tasks = swebench.load(target, ref.harness, image)
    else:
        raise ConfigError(f"{path}:{line_of(('suite',))}: suite: {target} is neither a folder of Harbor tasks "
                          "nor a SWE-bench dataset (.jsonl, .json, .parquet)")
    return [_apply(t, ref) for t in tasks]


def _apply(task: Task, ref: SuiteRef) -> Task:
    update: dict[str, Any] = {"num_samples": ref.num_samples, "builder": ref.builder,
                              "metadata": task.metadata | ref.metadata}
    if ref.network:
        update["sandbox"] = task.sandbox.model_copy(update={"network": ref.network})
    if ref.verifier_sandbox and isinstance(task.evaluator, TestsEvaluator):
        update["evaluator"] = task.evaluator.model_copy(update={"sandbox": ref.verifier_sandbox})
    return task.model_copy(update=update)
