"""SWE-bench datasets as published, as our tasks: `load(path, harness, image=None)` -> list[Task], or ConfigError.

A dataset is a file as SWE-bench publishes it on Hugging Face: JSON Lines (`.jsonl`, or `.json`
as `datasets` writes it), a JSON array (`.json`) or, where pyarrow is installed (the `parquet`
extra), Parquet (one instance per row). An instance has SWE-bench's columns: `instance_id`,
`repo`, `version`, `base_commit`, `problem_statement` (the instruction), `patch` (the gold patch:
what `harness: oracle` applies), `test_patch`, `FAIL_TO_PASS` and `PASS_TO_PASS` (JSON text of
lists, or lists); `hints_text`, `created_at`, `environment_setup_commit` and any other column are
kept out of the task (hints are not shown, as in SWE-bench's own runs). Grading is the official
`swebench` package's (a SwebenchEvaluator; trajectory.swebench), which must know the repo and
version: rendering the row's eval script at load time checks it.
The image: `image` (a suite file's template, `{instance_id}` and `{docker_id}` replaced) if given,
else the row's own `image` column where a dataset has one, else SWE-bench's name for it
(`swebench/sweb.eval.x86_64.<docker_id>:latest`, docker_id the id lower-cased with `__` as
`_1776_`), as `docker://CANONICAL` (suites.images), where it came from kept as
metadata.image_source. The harness works in /testbed where the sandbox starts commands in the
image's WORKDIR (SWE-bench's is /testbed), else on a copy of it in the workspace. Problems read
`FILE:LINE: FIELD: ...` (Parquet: `FILE: row N: FIELD: ...`), all of them before anything runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from polar_hpc.config import (
    TASK_ID,
    ConfigError,
    HarnessSpec,
    SwebenchEvaluator,
    Task,
    TaskSandbox,
    TaskSolution,
)
from polar_hpc.config_files import MAX_JSONL_BYTES, read_json_line, read_text
from polar_hpc.suites import images
from polar_hpc.trajectory import swebench as grading

KEYS = ("instance_id", "problem_statement")  # a JSON file whose first record has these is a dataset
TEMPLATE_FIELDS = ("instance_id", "docker_id")
# where the image's WORKDIR is /testbed (SWE-bench's) the harness works there; else on a copy of it
PREPARE = f'[ "$(pwd -P)" = {grading.REPO_DIR} ] || cp -a {grading.REPO_DIR}/. .'
HEAD_BYTES = 1 << 20  # read to recognise a dataset
_BETWEEN = re.compile(r"[ \t\r\n,]*")  # between a JSON array's elements


class Instance(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    instance_id: str
    repo: str = Field(min_length=1)
    version: str = Field(min_length=1)
    base_commit: str = Field(min_length=1)
    problem_statement: str = Field(min_length=1)
    patch: str = ""
    test_patch: str = Field(min_length=1)
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    image: str | None = None  # not SWE-bench's column: a dataset that names its images (SWE-bench 5's do)

    @pydantic.field_validator("instance_id")
    @classmethod
    def _task_id(cls, value: str) -> str:
        if not TASK_ID.fullmatch(value) or ".." in value:
            raise ValueError(f"not usable as a task id (1-256 of A-Z a-z 0-9 . _ - : @ + = /, no '..'): {value[:80]!r}")
        return value

    @pydantic.field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """SWE-bench stores these lists as JSON text."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("neither a list nor JSON text of one") from None
        return value


def is_dataset(path: Path) -> bool:
    """A Parquet file, or a .jsonl / .json file (lines or an array) whose first record looks like an instance."""
    if path.suffix == ".parquet":
        return True
    if path.suffix not in (".jsonl", ".json") or not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES).decode("utf-8", errors="replace").lstrip()
    if head.startswith("["):
        try:
            first, _ = json.JSONDecoder().raw_decode(head, _BETWEEN.match(head, 1).end())  # type: ignore[union-attr]
        except ValueError:  # the first record is longer than the head: its keys still show in it
            return all(f'"{k}"' in head for k in KEYS)
    else:
        try:
            first = read_json_line(head.split("\n", 1)[0])
        except ValueError:
            return False
    return isinstance(first, dict) and all(k in first for k in KEYS)


def check_template(template: str) -> str:
    """`template` if every `{...}` in it is one of TEMPLATE_FIELDS, else ValueError."""
    unknown = sorted(set(re.findall(r"\{([^{}]*)\}", template)) - set(TEMPLATE_FIELDS))
    if unknown:
        raise ValueError(f"unknown placeholder(s) {', '.join(unknown)} (known: {', '.join(TEMPLATE_FIELDS)})")
    return template


def load(path: Path, harness: HarnessSpec, image: tuple[str, str] | None = None) -> list[Task]:
    """`image`: (template, where it was given) overriding every row's image."""
    rows = _rows(path)
    tasks, problems = [], []
    for where, record in rows:
        if isinstance(record, str):  # a line that is not JSON
            problems.append(f"{where}: {record}")
            continue
        try:
            instance = Instance.model_validate(record)
        except pydantic.ValidationError as e:
            for err in e.errors():
                field = ".".join(str(x) for x in err["loc"]) or "(top level)"
                msg = "missing required field" if err["type"] == "missing" else err["msg"]
                problems.append(f"{where}: {field}: {msg.removeprefix('Value error, ')}")
            continue
        if harness.kind == "oracle" and not instance.patch:
            problems.append(f"{where}: patch: missing, and `harness: oracle` applies it")
            continue
        try:
            tasks.append(to_task(instance, harness, where, image))
        except grading.SwebenchMissing as e:
            raise ConfigError(f"{path}: {e}") from None
        except ValueError as e:
            problems.append(f"{where}: {e}")
    if problems:
        raise ConfigError("\n".join(problems))
    if not tasks:
        raise ConfigError(f"{path}: no instances in it")
    return tasks


def to_task(inst: Instance, harness: HarnessSpec, where: str, override: tuple[str, str] | None) -> Task:
    graded = {k: getattr(inst, k) for k in grading.GRADED}
    try:
        spec = grading.test_spec(graded)
    except ValueError as e:
        raise ValueError(f"repo, version: {e}") from None
    docker_id = inst.instance_id.lower().replace("__", "_1776_")
    if override:
        name, source = override[0].format(instance_id=inst.instance_id, docker_id=docker_id), override[1]
    elif inst.image:
        name, source = inst.image, f"{where}: image"
    else:
        name, source = spec.instance_image_key, f"{where}: instance_id (SWE-bench's image name)"
    try:
        reference = name if "://" in name or name.endswith(".sif") else images.parse(name).transport
    except ValueError as e:
        raise ValueError(f"image: {e}") from None
    return Task(
        id=inst.instance_id, instruction=inst.problem_statement, timeout_s=1800.0, harness=harness,
        sandbox=TaskSandbox(image=reference, prepare=[PREPARE]),
        evaluator=SwebenchEvaluator(kind="swebench", instance=graded),
        solution=TaskSolution(patch=inst.patch) if inst.patch else None,
        metadata={"suite": "swebench", "image_source": source, "repo": inst.repo, "version": inst.version,
                  "base_commit": inst.base_commit, "FAIL_TO_PASS": inst.FAIL_TO_PASS,
                  "PASS_TO_PASS": inst.PASS_TO_PASS},
    )


def _rows(path: Path) -> list[tuple[str, Any]]:
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    text = read_text(path, MAX_JSONL_BYTES)
    return _array_rows(path, text) if text.lstrip().startswith("[") else _jsonl_rows(path, text)


def _jsonl_rows(path: Path, text: str) -> list[tuple[str, Any]]:
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((f"{path}:{n}", read_json_line(line)))
            except ValueError as e:
                rows.append((f"{path}:{n}", f"not valid JSON: {e}"))
    return rows


def _array_rows(path: Path, text: str) -> list[tuple[str, Any]]:
    """Each element of a JSON array, named by the line it starts on."""
    try:
        read_json_line(text)  # strict JSON first (no NaN, bounded nesting)
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    rows: list[tuple[str, Any]] = []
    decoder, pos, line, counted = json.JSONDecoder(), text.index("[") + 1, 1, 0
    while True:
        pos = _BETWEEN.match(text, pos).end()  # type: ignore[union-attr]  # it matches the empty string
        if text[pos] == "]":
            return rows
        line += text.count("\n", counted, pos)
        counted = pos
        value, pos = decoder.raw_decode(text, pos)
        rows.append((f"{path}:{line}", value))


def _parquet_rows(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{path}: reading Parquet needs pyarrow (pip install 'polar-hpc[parquet]'); "
                          "or give the dataset as JSONL") from None
    if path.stat().st_size > MAX_JSONL_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_JSONL_BYTES} bytes")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow's errors have no common base: a damaged file is bad input
        raise ConfigError(f"{path}: not a readable Parquet file: {e}") from None
    return [(f"{path}: row {i}", row) for i, row in enumerate(table.to_pylist())]
