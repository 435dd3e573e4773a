"""Topology and task models, loaded from YAML / JSONL, with errors that name file, line and field.

`load_topology(path)` and `load_tasks(path)` return validated models or raise `ConfigError`, whose
message reads `FILE:LINE: FIELD: what is wrong` (one line per problem). Relative paths inside a
task file (sandbox files) are resolved against the task file's folder at load time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import pydantic
import pydantic_core
import yaml
from pydantic import BaseModel, ConfigDict, Field


class ConfigError(Exception):
    """Bad user input; the CLI prints it and exits with code 2."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- topology -------------------------------------------------------------------------------------


class EngineConfig(_Model):
    kind: Literal["scripted", "sglang"] = "scripted"
    model: str = "polar-scripted"
    model_path: str | None = None  # sglang: weights folder or hub id (default: `model`)
    tp_size: int = Field(1, ge=1)  # sglang: GPUs per server; a GPU node runs gpus/tp_size servers
    port: int = Field(30000, ge=1, le=65535)  # sglang: first server's port on its node
    extra_args: list[str] = []  # sglang: appended to `python -m sglang.launch_server`
    startup_timeout_s: float = Field(1800.0, gt=0)  # sglang: until /health answers
    script: str | None = None  # scripted engine: policy rules file
    token_delay_ms: float = Field(0.0, ge=0)
    weight_version: str = "v0"
    sample_log: bool = False  # scripted engine: log every generation to <run>/logs/engine-samples.jsonl
    context_length: int = Field(8192, ge=16)  # scripted engine: longest prompt + output, in tokens


class PoolConfig(_Model):
    """Bounded pipeline stages of a gateway: INIT -> READY buffer -> RUN -> POSTRUN."""

    init: int = Field(4, ge=1)
    ready: int = Field(4, ge=0)
    run: int = Field(8, ge=1)
    postrun: int = Field(4, ge=1)


class GatewayConfig(_Model):
    pools: PoolConfig = PoolConfig()
    heartbeat_s: float = Field(1.0, gt=0)
    peer_timeout_s: float = Field(10.0, gt=0)
    shard_max_bytes: int = Field(64 << 20, ge=1)
    shard_max_age_s: float = Field(60.0, gt=0)


class ProxyConfig(_Model):
    mode: Literal["tito", "passthrough"] = "tito"  # tito: the proxy renders; passthrough: the engine
    port: int = Field(0, ge=0, le=65535)
    tokenizer: str | None = None  # tito: model folder (default: the engine's tokenizer_path)
    tool_parser: Literal["auto", "hermes", "qwen3_coder"] = "auto"
    strict_model: bool = False  # refuse requests naming another model (default: serve ours)
    max_body_mb: float = Field(32, gt=0)  # larger request bodies get 413
    engine_wait_s: float = Field(30, ge=0)  # a call waits this long for an engine while none is up


class ApptainerConfig(_Model):
    image: str | None = None  # the image of tasks that name none
    image_dir: str | None = None  # where relative image names are found (shared filesystem)
    node_local_dir: str | None = None  # SIF images are copied here once per node (default: node tmp)
    starts_per_node: int = Field(16, ge=1)
    starts_per_image: int = Field(8, ge=1)


class SandboxConfig(_Model):
    backend: Literal["auto", "bwrap", "apptainer", "none"] = "auto"
    max_pids: int = Field(512, ge=16)
    max_file_bytes: int = Field(1 << 30, ge=1)
    max_disk_bytes: int = Field(4 << 30, ge=1)
    max_output_bytes: int = Field(1 << 20, ge=1)
    apptainer: ApptainerConfig = ApptainerConfig()


class SlurmComponent(_Model):
    """One component of the hetjob: `nodes` nodes with these resources each."""

    nodes: int = Field(1, ge=1)
    partition: str | None = None
    cpus: int = Field(1, ge=1)  # --cpus-per-task (one task per node)
    mem: str | None = None  # --mem, e.g. 64G
    gpus: int = Field(0, ge=0)  # --gpus-per-node
    gres: str | None = None  # --gres, e.g. gpu:a100:8 (instead of gpus)
    constraint: str | None = None


class SlurmConfig(_Model):
    """The hetjob of `polar-hpc submit`: component 0 = GPU nodes (engines), 1 = CPU nodes (gateways)."""

    gpu: SlurmComponent = SlurmComponent(gpus=1)
    cpu: SlurmComponent = SlurmComponent(cpus=4)
    account: str | None = None
    qos: str | None = None
    time: str = "4:00:00"  # --time, as sbatch takes it
    job_name: str = "polar-hpc"
    signal_s: int = Field(120, ge=10)  # SIGUSR2 this long before the time limit: journal and requeue
    requeue: bool = True  # requeue the job on preemption / time limit
    port: int = Field(0, ge=0, le=65535)  # orchestrator TCP port; 0 picks a free one
    step_restarts: int = Field(3, ge=0)  # a failed engine/gateway step is restarted this many times
    extra_sbatch: list[str] = []  # more job-wide sbatch flags, e.g. ["--mail-type=END"]


class ServiceConfig(_Model):
    enabled: bool = False  # trainers add tasks while the run goes (polar_hpc.client); it ends on drain
    max_queued: int = Field(4096, ge=1)  # queued sessions beyond this answer `busy`
    weight_update_timeout_s: float = Field(600.0, gt=0)  # per engine: pause, load, continue
    weight_update_mode: Literal["wait", "abort"] = "wait"  # in-flight calls: finish first, or abort (retried)


class Topology(_Model):
    run_dir: str | None = None
    engine: EngineConfig = EngineConfig()
    gateway: GatewayConfig = GatewayConfig()
    proxy: ProxyConfig = ProxyConfig()
    sandbox: SandboxConfig = SandboxConfig()
    slurm: SlurmConfig = SlurmConfig()
    service: ServiceConfig = ServiceConfig()


# --- tasks ----------------------------------------------------------------------------------------


class HarnessSpec(_Model):
    """`shell` runs `command`; a preset writes its harness's config and runs it (`command`, if
    given, replaces the preset's command line)."""

    kind: Literal["shell", "mini_swe_agent", "codex", "claude_code", "opencode", "qwen_code"] = "shell"
    command: str | None = None
    env: dict[str, str] = {}

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _shell_needs_command(cls, data: Any, handler: Any) -> HarnessSpec:
        """A shell harness without `command` is a missing field, reported with any others."""
        if not (isinstance(data, dict) and data.get("kind", "shell") == "shell" and "command" not in data):
            return handler(data)
        errors: list[Any] = []
        try:
            handler(data)
        except pydantic.ValidationError as e:
            errors = [{k: v for k, v in err.items() if k in ("type", "loc", "input", "ctx")} for err in e.errors()]
        errors.append({"type": "missing", "loc": ("command",), "input": data})
        raise pydantic_core.ValidationError.from_exception_data(cls.__name__, errors)


class TaskSandbox(_Model):
    image: str | None = None
    files: dict[str, str] = {}  # destination in the workspace -> source path
    prepare: list[str] = []
    network: Literal["none", "proxy-only", "host"] = "host"
    gpus: bool = False  # apptainer: --nv


class CommandEvaluator(_Model):
    kind: Literal["command"]
    command: str
    timeout_s: float = Field(60.0, gt=0)
    # "session": run in the harness's sandbox as it left it; "fresh": in a new sandbox (the task's
    # files and prepare, started while the harness runs) holding the harness's workspace at submission/
    sandbox: Literal["session", "fresh"] = "session"


class RewardFileEvaluator(_Model):
    kind: Literal["reward_file"]
    path: str = "reward.txt"


class RegexEvaluator(_Model):
    kind: Literal["regex"]
    pattern: str


Evaluator = Annotated[
    Union[CommandEvaluator, RewardFileEvaluator, RegexEvaluator], Field(discriminator="kind")
]


_EVALUATOR_KINDS = ("command", "reward_file", "regex")


class Task(_Model):
    id: str = Field(min_length=1)
    instruction: str
    num_samples: int = Field(1, ge=1)
    timeout_s: float = Field(600.0, gt=0)
    harness: HarnessSpec
    sandbox: TaskSandbox = TaskSandbox()
    evaluator: Evaluator | None = None
    builder: Literal["per_request", "prefix_merge"] = "prefix_merge"
    metadata: dict[str, Any] = {}


# --- loading --------------------------------------------------------------------------------------


def load_topology(path: Path | None) -> Topology:
    """The topology in `path`, or the defaults when no file is given."""
    if path is None:
        return Topology()
    data, lines = _read_yaml(path)
    return _validate(Topology, data, path, lines)


def load_tasks(path: Path) -> list[Task]:
    """Tasks from a YAML file (one task, or a list) or a JSONL file (one task per line)."""
    if path.suffix == ".jsonl":
        tasks = _load_jsonl(path)
    else:
        data, lines = _read_yaml(path)
        items = data if isinstance(data, list) else [data]
        tasks = _validate_all(
            [(item, lines, (i,) if isinstance(data, list) else ()) for i, item in enumerate(items)],
            path,
        )
    ids = [t.id for t in tasks]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"{path}: duplicate task id(s): {', '.join(dup)}")
    return [_resolve_files(t, path.parent) for t in tasks]


def _load_jsonl(path: Path) -> list[Task]:
    entries, problems = [], []
    for lineno, text in enumerate(_read_text(path).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            entries.append((json.loads(text), {(): lineno}, ()))
        except json.JSONDecodeError as e:
            problems.append(f"{path}:{lineno}: not valid JSON: {e.msg} (column {e.colno})")
    return _validate_all(entries, path, problems)


def _validate_all(entries: list[tuple[Any, dict, tuple]], path: Path, problems: list[str] | None = None) -> list[Task]:
    """Validate every entry, collecting all problems (in line order) before failing."""
    tasks, problems = [], list(problems or [])
    for data, lines, prefix in entries:
        try:
            tasks.append(_validate(Task, data, path, lines, prefix))
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(sorted(problems, key=_line_key)))
    if not tasks:
        raise ConfigError(f"{path}: no tasks in file")
    return tasks


def _line_key(problem: str) -> int:
    parts = problem.split(":", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def _validate(model: type[BaseModel], data: Any, path: Path, lines: dict, prefix: tuple = ()) -> Any:
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        raise ConfigError("\n".join(_describe(err, path, lines, prefix) for err in e.errors())) from None


def _describe(err: dict, path: Path, lines: dict, prefix: tuple) -> str:
    loc = _strip_union_tags(err["loc"])
    field = ".".join(str(x) for x in loc) or "(top level)"
    line = _line_of(lines, prefix + loc)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "missing required field"
    return f"{path}:{line}: {field}: {msg}"


def _strip_union_tags(loc: tuple) -> tuple:
    """pydantic puts the discriminator value in loc (evaluator.regex.pattern); drop it."""
    return tuple(x for i, x in enumerate(loc) if not (i and loc[i - 1] == "evaluator" and x in _EVALUATOR_KINDS))


def _line_of(lines: dict, loc: tuple) -> int:
    """Line of the deepest known node on the path `loc` (the record's line for JSONL)."""
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return 1


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None


def _read_yaml(path: Path) -> tuple[Any, dict]:
    """Parse YAML, returning the data and a map from key path to 1-based line number."""
    text = _read_text(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _map_lines(node, (), lines)
    return data, lines


def _map_lines(node: yaml.Node, loc: tuple, lines: dict) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = loc + (key.value,)
            _map_lines(value, child, lines)
            lines[child] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _map_lines(value, loc + (i,), lines)


def _resolve_files(task: Task, base: Path) -> Task:
    files = {dest: str((base / src).resolve()) for dest, src in task.sandbox.files.items()}
    missing = [src for src in files.values() if not Path(src).exists()]
    if missing:
        raise ConfigError(f"task {task.id!r}: sandbox.files: no such file: {', '.join(missing)}")
    sandbox = task.sandbox.model_copy(update={"files": files})
    return task.model_copy(update={"sandbox": sandbox})
