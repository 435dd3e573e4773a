"""SWE-bench-style datasets as our tasks: `load(path, harness)` -> list[Task], or ConfigError.

A JSONL file (one instance per line) or, where pyarrow is installed (the `parquet` extra), a
Parquet file (one per row). An instance has `instance_id`, `problem_statement`, `image` (the
environment image holding the repository at its base commit in `workdir`, default /testbed),
`test_command` and `FAIL_TO_PASS` / `PASS_TO_PASS` (lists, or JSON text of lists as SWE-bench
publishes them); `repo`, `base_commit`, `patch` (the gold patch: what `harness: oracle` applies),
`test_patch` (the hidden tests: applied only in the evaluator's fresh sandbox) and `workdir` are
optional; other columns are ignored. The workspace is a copy of `workdir` (prepare), the reward is
`test_command` over FAIL_TO_PASS + PASS_TO_PASS exiting 0. An `image` that is a registry reference
becomes `docker://CANONICAL` (suites.images), its row kept as metadata.image_source. Problems read `FILE:LINE: FIELD: ...`
(Parquet: `FILE: row N: FIELD: ...`), all of them before anything runs.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from polar_hpc.config import TASK_ID, ConfigError, HarnessSpec, Task, TaskSandbox, TaskSolution, TestsEvaluator
from polar_hpc.config_files import MAX_JSONL_BYTES, read_json_line, read_text
from polar_hpc.suites import images

KEYS = ("instance_id", "problem_statement")  # a JSONL file whose first record has these is a dataset


class Instance(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    instance_id: str
    problem_statement: str = Field(min_length=1)
    image: str = Field(min_length=1)
    test_command: str = Field(min_length=1)
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = []
    repo: str | None = None
    base_commit: str | None = None
    patch: str | None = None
    test_patch: str | None = None
    workdir: str = "/testbed"
    timeout_s: float = Field(1800.0, gt=0, le=86400)

    @pydantic.field_validator("instance_id")
    @classmethod
    def _task_id(cls, value: str) -> str:
        if not TASK_ID.fullmatch(value) or ".." in value:
            raise ValueError(f"not usable as a task id (1-256 of A-Z a-z 0-9 . _ - : @ + = /, no '..'): {value[:80]!r}")
        return value

    @pydantic.field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        """A registry reference (`image pull` fetches it) as `docker://CANONICAL`; a SIF or a URI as given."""
        return value if "://" in value or value.endswith(".sif") else images.parse(value).transport

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
    """A Parquet file, or a JSONL file whose first record looks like a SWE-bench instance."""
    if path.suffix == ".parquet":
        return True
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with open(path, "rb") as f:
        first = f.readline(1 << 20)
    try:
        record = read_json_line(first.decode("utf-8", errors="replace"))
    except ValueError:
        return False
    return isinstance(record, dict) and all(k in record for k in KEYS)


def load(path: Path, harness: HarnessSpec) -> list[Task]:
    rows = _parquet_rows(path) if path.suffix == ".parquet" else _jsonl_rows(path)
    tasks, problems = [], []
    for where, record in rows:
        if isinstance(record, str):  # a line that is not JSON
            problems.append(f"{where}: {record}")
            continue
        try:
            instance = Instance.model_validate(record)
            if harness.kind == "oracle" and not instance.patch:
                problems.append(f"{where}: patch: missing, and `harness: oracle` applies it")
                continue
            tasks.append(to_task(instance, harness, where))
        except pydantic.ValidationError as e:
            for err in e.errors():
                field = ".".join(str(x) for x in err["loc"]) or "(top level)"
                msg = "missing required field" if err["type"] == "missing" else err["msg"]
                problems.append(f"{where}: {field}: {msg.removeprefix('Value error, ')}")
    if problems:
        raise ConfigError("\n".join(problems))
    if not tasks:
        raise ConfigError(f"{path}: no instances in it")
    return tasks


def to_task(inst: Instance, harness: HarnessSpec, where: str) -> Task:
    tests = " ".join(shlex.quote(t) for t in inst.FAIL_TO_PASS + inst.PASS_TO_PASS)
    return Task(
        id=inst.instance_id, instruction=inst.problem_statement, timeout_s=inst.timeout_s, harness=harness,
        sandbox=TaskSandbox(image=inst.image, prepare=[f"cp -a {shlex.quote(inst.workdir)}/. ."]),
        evaluator=TestsEvaluator(kind="tests", patch=inst.test_patch or None,
                                 command=f"{inst.test_command} {tests}".strip(), timeout_s=inst.timeout_s),
        solution=TaskSolution(patch=inst.patch) if inst.patch else None,
        metadata={"suite": "swebench", "image_source": f"{where}: image", "repo": inst.repo, "base_commit": inst.base_commit,
                  "FAIL_TO_PASS": inst.FAIL_TO_PASS, "PASS_TO_PASS": inst.PASS_TO_PASS},
    )


def _jsonl_rows(path: Path) -> list[tuple[str, Any]]:
    rows = []
    for n, text in enumerate(read_text(path, MAX_JSONL_BYTES).splitlines(), start=1):
        if text.strip():
            try:
                rows.append((f"{path}:{n}", read_json_line(text)))
            except ValueError as e:
                rows.append((f"{path}:{n}", f"not valid JSON: {e}"))
    return rows


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
