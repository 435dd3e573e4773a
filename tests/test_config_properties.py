"""Every number a user gives is bounded and strictly typed where it is read (property-based, with
hypothesis): whatever a task field, a Harbor task.toml field or a topology field holds, the file
either loads with a value of the field's own type (a bool is not an int) inside its bounds, which
every codec of ours carries to a gateway, or is refused as `FILE:LINE: FIELD: problem`; and a task
that cannot be encoded all the same ends alone, `error` with its reason, while the others dispatch."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import polar
from polar_hpc import config, wire
from polar_hpc.config import ConfigError, Task, Topology, load_tasks, load_topology
from polar_hpc.orchestrator.sessions import SessionTable
from polar_hpc.suites import harbor

NUMBERS = (st.integers() | st.integers(min_value=-(1 << 80), max_value=1 << 80) | st.floats()
           | st.booleans() | st.none() | st.text(max_size=8) | st.sampled_from(["1", "1e3", "0x10", "nan", "inf"])
           | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
TASK_FIELDS = [("num_samples",), ("timeout_s",), ("sandbox", "memory_mb"), ("sandbox", "storage_mb"),
               ("sandbox", "cpus"), ("sandbox", "gpus"), ("evaluator", "timeout_s")]
BASE = {"id": "t", "instruction": "hi", "harness": {"command": "true"},
        "evaluator": {"kind": "command", "command": "true"}}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _numeric_fields(model: type[pydantic.BaseModel], prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, FieldInfo) of every int, float or bool field below `model`."""
    found = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, pydantic.BaseModel):
            found += _numeric_fields(kind, prefix + (name,))
        elif kind in (int, float, bool) or kind in (int | None, float | None):
            found.append((prefix + (name,), info))
    return found


def _set(data: dict, path: tuple, value: Any) -> dict:
    out = json.loads(json.dumps(data))
    here = out
    for part in path[:-1]:
        here = here.setdefault(part, {})
    here[path[-1]] = value
    return out


def _get(model: Any, path: tuple) -> Any:
    for part in path:
        model = getattr(model, part)
    return model


def _within(info: Any, value: Any) -> bool:
    """The value has the field's exact type and meets its ge/gt/le/lt bounds."""
    kinds = {info.annotation} if isinstance(info.annotation, type) else set(info.annotation.__args__)
    if value is None:
        return type(None) in kinds
    if type(value) not in kinds:
        return False
    if type(value) is bool:
        return True
    for bound in info.metadata:
        for attr, ok in (("ge", value.__ge__), ("gt", value.__gt__), ("le", value.__le__), ("lt", value.__lt__)):
            limit = getattr(bound, attr, None)
            if limit is not None and ok(limit) is not True:
                return False
    return math.isfinite(value)


def _info(model: type[pydantic.BaseModel], path: tuple) -> Any:
    return dict(_numeric_fields(model))[path]


@SETTINGS
@given(path=st.sampled_from(TASK_FIELDS), value=NUMBERS)
def test_a_task_number_is_in_bounds_of_its_type_or_refused_with_its_line(path: tuple, value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "tasks.jsonl"
        file.write_text(json.dumps(BASE) + "\n" + json.dumps(_set(dict(BASE, id="odd"), path, value)) + "\n")
        try:
            tasks = load_tasks(file)
        except ConfigError as e:
            assert any(f"{file}:2: {what}" in str(e) for what in (f"{'.'.join(path)}: ", "not valid JSON")), str(e)
            return
    info = _info(Task, path) if path[0] != "evaluator" else config.CommandEvaluator.model_fields[path[1]]
    assert _within(info, _get(tasks[1], path)), (value, _get(tasks[1], path))
    assert value is not True or info.annotation is bool  # `true` is never taken as a number
    wire.raw(tasks[1].model_dump(mode="json"))  # a gateway gets it


PLAIN = st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=4)
                     | st.integers(min_value=-(1 << 70), max_value=1 << 70),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=12)


@SETTINGS
@given(metadata=st.dictionaries(st.text(max_size=4), PLAIN, max_size=3))
def test_task_metadata_is_what_every_codec_carries_or_refused(metadata: dict) -> None:
    try:
        task = Task.model_validate(dict(BASE, metadata=metadata))
    except pydantic.ValidationError as e:
        assert {err["loc"][0] for err in e.errors()} == {"metadata"}
        return
    wire.raw(task.model_dump(mode="json"))


@SETTINGS
@given(path=st.sampled_from([p for p, _ in _numeric_fields(Topology)]), value=NUMBERS)
def test_a_topology_number_is_in_bounds_of_its_type_or_refused_with_its_line(path: tuple, value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "topology.yaml"
        file.write_text("run_dir: null\n" + "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(path[:-1]))
                        + f"{'  ' * (len(path) - 1)}{path[-1]}: {json.dumps(value)}\n")  # a JSON value is YAML
        try:
            topology = load_topology(file)
        except ConfigError as e:
            assert f"{file}:{len(path) + 1}: {'.'.join(path)}: " in str(e), str(e)
            return
    assert _within(_info(Topology, path), _get(topology, path)), (value, _get(topology, path))


TOML_FIELDS = {("environment", "memory_mb"): ("sandbox", "memory_mb"),
               ("environment", "storage_mb"): ("sandbox", "storage_mb"),
               ("environment", "cpus"): ("sandbox", "cpus"), ("agent", "timeout_sec"): ("timeout_s",)}
TOML_VALUES = (st.integers(min_value=-(1 << 80), max_value=1 << 80) | st.floats(allow_nan=False)
               | st.booleans() | st.text(max_size=6))


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, str):  # a TOML basic string: quote, backslash and control characters escaped
        return '"' + "".join("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c
                             for c in value) + '"'
    return repr(value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(TOML_FIELDS)), value=TOML_VALUES)
def test_a_harbor_number_is_in_bounds_of_its_type_or_refused_with_its_line(field: tuple, value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "task"
        (folder / "tests").mkdir(parents=True)
        (folder / "tests" / "test.sh").write_text("exit 0\n")
        (folder / "instruction.md").write_text("hi\n")
        (folder / "task.toml").write_text(f"[{field[0]}]\n{field[1]} = {_toml(value)}\n"
                                          + ("" if field[0] == "environment" else "[environment]\n")
                                          + 'docker_image = "busybox:1"\n')
        try:
            task = harbor.load(folder, config.HarnessSpec(kind="noop"))[0]
        except ConfigError as e:
            assert f"task.toml:2: {'.'.join(field)}: " in str(e), str(e)
            return
    path = TOML_FIELDS[field]
    assert _within(_info(Task, path), _get(task, path)), (value, _get(task, path))
    wire.raw(task.model_dump(mode="json"))


def test_the_audits_task_is_refused_with_its_line_and_exit_2(tmp_path: Path) -> None:
    """The audit's file: a huge memory_mb beside a benign task passed the check and hung the run."""
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("- id: big\n  instruction: hi\n  harness: {command: 'true'}\n  sandbox:\n"
                     "    memory_mb: 99999999999999999999\n    storage_mb: 99999999999999\n"
                     "- id: benign\n  instruction: hi\n  num_samples: true\n  harness: {command: 'true'}\n")
    result = polar("tasks", "check", tasks)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for text in (f"{tasks}:5: sandbox.memory_mb: Input should be less than or equal to {config.MAX_MB}",
                 f"{tasks}:6: sandbox.storage_mb: Input should be less than or equal to {config.MAX_MB}",
                 f"{tasks}:9: num_samples: Input should be a valid integer"):
        assert text in result.stderr, result.stderr


@pytest.mark.parametrize("bad", [1 << 70, object(), b"\xff"])
def test_a_task_that_cannot_be_encoded_ends_alone_and_the_others_dispatch(bad: Any) -> None:
    """Validation keeps such a task out; were one to get past it, it ends `error` with its reason."""
    good = Task.model_validate(dict(BASE, id="good", num_samples=2))
    odd = Task.model_validate(dict(BASE, id="odd", num_samples=2)).model_copy(update={"metadata": {"x": bad}})
    table = SessionTable.from_tasks([odd, good])
    specs = table.take(b"gateway", 4)
    assert [s.session_id for s in specs] == ["good#0.0", "good#1.0"]
    assert [(s.session_id, s.state) for s in table.unsendable] == [("odd#0.0", "error"), ("odd#1.0", "error")]
    assert all("cannot be sent to a gateway" in (table.results[(s.task.id, s.sample_index)].error or "")
               for s in table.unsendable)
    assert table.status(1).states == {"error": 2, "assigned": 2}
