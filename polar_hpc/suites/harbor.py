"""Harbor-format task folders as our tasks: `load(path, harness)` -> list[Task], or ConfigError.

`path` is one task folder (it holds task.toml) or a folder of them (every non-hidden subfolder
is a task). A task folder holds:
- `instruction.md`: the instruction (UTF-8, at most MAX_INSTRUCTION_BYTES);
- `task.toml`: `[agent] timeout_sec` (the session's timeout_s), `[verifier] timeout_sec` (the
  tests' timeout), `[environment] docker_image` (a registry reference: the sandbox image
  `docker://CANONICAL`, its file and line kept as metadata.image_source for `image pull`), `cpus`, `memory_mb`,
  `storage_mb` (the sandbox's resources), `[metadata]` (kept in the task's metadata); other keys
  are Harbor's and ignored;
- `environment/`: a Dockerfile or `docker_image` (at least one); `environment/workspace/`, if
  there, is what the workspace starts with (locally, with bubblewrap, the environment is the
  host's tree plus these files; docs/tasks.md);
- `tests/test.sh`: the hidden tests (a TestsEvaluator whose `dir` is tests/);
- `solution/solve.sh` (optional): what `harness: oracle` runs.
The task id is the folder's name. Every problem of every task is reported, as
`FILE[:LINE]: FIELD: what is wrong`, before anything runs; no path inside a task is a link.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from polar_hpc.config import (
    MAX_MB,
    MAX_TIMEOUT_S,
    TASK_ID,
    ConfigError,
    HarnessSpec,
    Task,
    TaskSandbox,
    TaskSolution,
    TestsEvaluator,
    plain,
    resolve_source,
)
from polar_hpc.config_files import read_text
from polar_hpc.suites import images

MAX_INSTRUCTION_BYTES = 1 << 20
MAX_TOML_BYTES = 1 << 20
MAX_TASKS = 100_000  # task folders in one suite folder
MAX_ENTRIES = 100_000  # entries of one task's tests/ or solution/ looked at for links


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class _Agent(_Section):
    timeout_sec: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)


class _Verifier(_Section):
    timeout_sec: float = Field(600.0, gt=0, le=86400)


class _Environment(_Section):
    docker_image: str | None = None
    cpus: float | None = Field(None, gt=0, le=4096)
    memory_mb: int | None = Field(None, ge=1, le=MAX_MB)
    storage_mb: int | None = Field(None, ge=1, le=MAX_MB)


class TaskToml(_Section):
    agent: _Agent = _Agent()
    verifier: _Verifier = _Verifier()
    environment: _Environment = _Environment()
    metadata: dict[str, Any] = {}

    @pydantic.field_validator("metadata")
    @classmethod
    def _plain_metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        plain(value)
        return value


def is_task(path: Path) -> bool:
    return (path / "task.toml").is_file()


def load(path: Path, harness: HarnessSpec) -> list[Task]:
    folders = [path] if is_task(path) else _subfolders(path)
    tasks, problems = [], [f"{p}: a symbolic link (not followed): not a task folder" for p in folders if p.is_symlink()]
    for folder in (f for f in folders if not f.is_symlink()):
        try:
            tasks.append(load_task(folder, harness))
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    if not tasks:
        raise ConfigError(f"{path}: no Harbor tasks (folders with a task.toml) in it")
    return tasks


def _subfolders(path: Path) -> list[Path]:
    try:
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(entries) > MAX_TASKS:
        raise ConfigError(f"{path}: more than {MAX_TASKS} entries")
    return [p for p in entries if p.is_dir()]  # links to folders too, to be refused


def load_task(folder: Path, harness: HarnessSpec) -> Task:
    problems: list[str] = []

    def source(rel: str, what: str, required: bool = True) -> str | None:
        if not required and not (folder / rel).exists():
            return None
        try:
            return resolve_source(folder, rel)
        except ValueError as e:
            problems.append(f"{folder / rel}: {what}: {e}")
            return None

    if not TASK_ID.fullmatch(folder.name) or ".." in folder.name:
        problems.append(f"{folder}: the folder's name is the task id: 1-256 of A-Z a-z 0-9 . _ - : @ + = /, "
                        "starting with a letter, digit or _")
    instruction = _instruction(folder, problems)
    toml, toml_text = _task_toml(folder, problems)
    tests = source("tests", "tests")
    if tests is not None:
        source("tests/test.sh", "tests/test.sh")
        problems.extend(_links(Path(tests), "tests"))
    solution = source("solution", "solution", required=False)
    if solution is not None:
        source("solution/solve.sh", "solution/solve.sh")
        problems.extend(_links(Path(solution), "solution"))
    files = _workspace(folder, source)
    image = toml.environment.docker_image if toml else None
    image_source = f"{folder / 'task.toml'}:{_toml_line(toml_text, ('environment', 'docker_image'))}: environment.docker_image"
    if image:
        try:
            image = images.parse(image).transport
        except ValueError as e:
            problems.append(f"{image_source}: {e}")
    elif toml is not None:
        source("environment/Dockerfile", "environment: neither a Dockerfile nor task.toml's environment.docker_image")
    if harness.kind == "oracle" and solution is None and not problems:
        problems.append(f"{folder}/solution/solve.sh: missing, and `harness: oracle` runs it")
    if problems:
        raise ConfigError("\n".join(problems))
    assert toml is not None, "_task_toml returns None only after adding a problem"
    env = toml.environment
    return Task(
        id=folder.name, instruction=instruction, timeout_s=toml.agent.timeout_sec, harness=harness,
        sandbox=TaskSandbox(image=image, files=files, cpus=env.cpus, memory_mb=env.memory_mb,
                            storage_mb=env.storage_mb),
        evaluator=TestsEvaluator(kind="tests", dir=tests, timeout_s=toml.verifier.timeout_sec),
        solution=TaskSolution(dir=solution) if solution else None,
        metadata={"suite": "harbor", "task_dir": str(folder.absolute())} | (
            {"harbor": toml.metadata} if toml.metadata else {}) | ({"image_source": image_source} if image else {}),
    )


def _links(root: Path, what: str) -> list[str]:
    """A problem for each symbolic link below `root` (none is followed), or for too many entries."""
    problems, seen = [], 0
    for here, dirs, names in os.walk(root):
        seen += len(dirs) + len(names)
        if seen > MAX_ENTRIES:
            return [f"{root}: {what}: more than {MAX_ENTRIES} entries"]
        problems += [f"{Path(here) / n}: {what}: a symbolic link (links are not followed)"
                     for n in dirs + names if (Path(here) / n).is_symlink()]
    return problems


def _instruction(folder: Path, problems: list[str]) -> str:
    path = folder / "instruction.md"
    try:
        resolve_source(folder, "instruction.md")
        text = read_text(path, MAX_INSTRUCTION_BYTES)
    except (ValueError, ConfigError) as e:
        problems.append(f"{path}: instruction: {e}")
        return ""
    if "\0" in text or not text.strip():
        problems.append(f"{path}: instruction: {'contains a NUL byte' if text.strip() else 'empty'}")
    return text


def _task_toml(folder: Path, problems: list[str]) -> tuple[TaskToml | None, str]:
    """task.toml, validated (None after adding a problem), and its text."""
    path, text = folder / "task.toml", ""
    try:
        resolve_source(folder, "task.toml")
        text = read_text(path, MAX_TOML_BYTES)
        data = tomllib.loads(text)
    except ConfigError as e:
        problems.append(str(e))
        return None, text
    except ValueError as e:  # TOMLDecodeError names the line and column
        problems.append(f"{path}: {'not valid TOML: ' if isinstance(e, tomllib.TOMLDecodeError) else ''}{e}")
        return None, text
    try:
        return TaskToml.model_validate(data), text
    except pydantic.ValidationError as e:
        for err in e.errors():
            loc = tuple(str(x) for x in err["loc"])
            msg = "missing required field" if err["type"] == "missing" else err["msg"]
            problems.append(f"{path}:{_toml_line(text, loc)}: {'.'.join(loc)}: {msg}")
        return None, text


def _toml_line(text: str, loc: tuple[str, ...]) -> int:
    """The line of `[section]` `key =` for loc (section, key, ...), else of the section, else 1."""
    section, line, want = "", 1, loc[:1]
    for n, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if header := re.fullmatch(r"\[\s*([^\]]+?)\s*\]", stripped):
            section = header.group(1)
            if (section,) == want:
                line = n
        elif len(loc) > 1 and section == loc[0] and re.match(rf"{re.escape(loc[1])}\s*=", stripped):
            return n
    return line


def _workspace(folder: Path, source) -> dict[str, str]:
    """environment/workspace/'s entries, each a `sandbox.files` entry of the same name."""
    root = folder / "environment" / "workspace"
    if source("environment/workspace", "environment/workspace", required=False) is None:
        return {}
    return {p.name: s for p in sorted(root.iterdir())
            if (s := source(f"environment/workspace/{p.name}", "environment/workspace")) is not None}
