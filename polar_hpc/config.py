"""Topology and task models, loaded from YAML / JSONL, with errors that name file, line and field.

`load_topology(path)` and `load_tasks(path)` return validated models or raise `ConfigError`, whose
message reads `FILE:LINE: FIELD: what is wrong` (one line per problem). Relative paths inside a
task file (sandbox files) are resolved against the task file's folder at load time and must stay
inside it (no absolute path elsewhere, no `..`, no symbolic link). Text that reaches a command line
or an environment (instruction, commands, env values) may not hold a NUL byte, env names must be
valid. Files are read within bounds (polar_hpc.config_files); numbers are finite and bounded
(MAX_SAMPLES, MAX_TIMEOUT_S, MAX_SESSIONS per file); task ids are `TASK_ID` without `..`, safe in
paths and session ids. A section a child process reads (`proxy:`) is a msgspec Struct of
polar_hpc.wire, defined there once and validated here from that definition (`Settings`).
`task_file_sessions(path)` is the one count of the sessions a run's task file
asks for (a task without num_samples: DEFAULT_SAMPLES).
"""

from __future__ import annotations

import gc
import json
import re
import stat
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin, get_type_hints

import msgspec
import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import core_schema

from polar_hpc import nofollow
from polar_hpc.config_files import MAX_DEPTH, MAX_JSONL_BYTES, ConfigError, nesting, read_json_line, read_text, read_yaml
from polar_hpc.wire import MAX_COUNT, MAX_SECONDS, ProxySettings

MAX_SAMPLES = 10_000  # num_samples of one task
DEFAULT_SAMPLES = 1  # num_samples of a task that names none
MAX_SESSIONS = 1_000_000  # sessions (tasks x num_samples) of one task file
MAX_TIMEOUT_S = 7 * 86400.0  # a session's timeout_s
MAX_MB = 1 << 24  # a task's memory_mb / storage_mb (16 TiB)
MAX_BYTES = 1 << 50  # a size in bytes of the topology
MAX_INT = (1 << 63) - 1  # a number in a task's metadata: what every codec of ours (msgpack, JSON) carries
UID_RANGE = (2_000_000_000, 2_000_065_535)  # sandbox.uid_range: no account, subuid range or systemd range of a usual host
SCRIPTED_CONTEXT = 65536  # the scripted engine's context: harnesses' own prompts (~31k) + 16k replies
TASK_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:@+=/-]{0,255}")


class _Model(BaseModel):
    # strict: a number is a number of its type (`true` is not 1, "3" is not 3); 3 is a valid float
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


# --- topology -------------------------------------------------------------------------------------


class EngineConfig(_Model):
    kind: Literal["scripted", "sglang", "vllm"] = "scripted"
    model: str = "polar-scripted"
    model_path: str | None = None  # sglang/vllm: weights folder or hub id (default: `model`)
    python: str | None = None  # sglang/vllm: the Python that runs the server (default: polar-hpc's own)
    tp_size: int = Field(1, ge=1, le=1024)  # sglang/vllm: GPUs per server; a GPU node runs gpus/tp_size servers
    port: int = Field(30000, ge=1, le=65535)  # sglang/vllm: first server's port on its node
    extra_args: list[str] = []  # sglang/vllm: appended to the server's command line
    startup_timeout_s: float = Field(1800.0, gt=0, le=MAX_SECONDS)  # sglang/vllm: until /health answers
    script: str | None = None  # scripted engine: policy rules file
    token_delay_ms: float = Field(0.0, ge=0, le=60_000)
    weight_version: str = "v0"
    sample_log: bool = False  # scripted engine: log every generation to <run>/logs/engine-samples.jsonl
    context_length: int = Field(SCRIPTED_CONTEXT, ge=16, le=1 << 24)  # scripted engine: longest prompt + output


class PoolConfig(_Model):
    """Bounded pipeline stages of a gateway: INIT -> READY buffer -> RUN -> POSTRUN."""

    init: int = Field(4, ge=1, le=MAX_COUNT)
    ready: int = Field(4, ge=0, le=MAX_COUNT)
    run: int = Field(8, ge=1, le=MAX_COUNT)
    postrun: int = Field(4, ge=1, le=MAX_COUNT)


class GatewayConfig(_Model):
    pools: PoolConfig = PoolConfig()
    heartbeat_s: float = Field(1.0, gt=0, le=3600)
    peer_timeout_s: float = Field(10.0, gt=0, le=MAX_SECONDS)
    shard_max_bytes: int = Field(64 << 20, ge=1, le=MAX_BYTES)
    shard_max_age_s: float = Field(60.0, gt=0, le=MAX_SECONDS)


class Settings:
    """`Annotated[S, Settings()]`: a field holding a msgspec Struct of settings S (defined in
    polar_hpc.wire, which children decode without pydantic), validated by pydantic from S's own field
    types, defaults and bounds (msgspec.Meta) with this module's strictness, so its errors name
    the file, line and field as every other's do."""

    def __get_pydantic_core_schema__(self, source: type, handler: pydantic.GetCoreSchemaHandler) -> Any:
        hints = get_type_hints(source, include_extras=True)
        fields: dict[str, Any] = {f.name: (_bounded(hints[f.name]), _default(f)) for f in msgspec.structs.fields(source)}
        model = pydantic.create_model(source.__name__, __base__=_Model, **fields)
        return core_schema.no_info_after_validator_function(
            lambda m: source(**dict(m)), handler.generate_schema(model),
            serialization=core_schema.plain_serializer_function_ser_schema(msgspec.structs.asdict))


_CONSTRAINTS = ("gt", "ge", "lt", "le", "multiple_of", "pattern", "min_length", "max_length")  # msgspec's and pydantic's


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.required:
        return ...
    if field.default is msgspec.NODEFAULT:
        return Field(default_factory=field.default_factory)
    return field.default


def _bounded(hint: Any) -> Any:
    """`Annotated[T, msgspec.Meta(ge=..)]` as `Annotated[T, Field(ge=..)]`; any other type as it is."""
    if get_origin(hint) is not Annotated:
        return hint
    base, *extras = get_args(hint)
    meta = [m for m in extras if isinstance(m, msgspec.Meta)]
    return Annotated[base, Field(**{k: getattr(m, k) for m in meta for k in _CONSTRAINTS if getattr(m, k) is not None})]


class ApptainerConfig(_Model):
    image: str | None = None  # the image of tasks that name none
    image_dir: str | None = None  # where relative image names are found (shared filesystem)
    node_local_dir: str | None = None  # SIF images are copied here once per node (default: node tmp)
    starts_per_node: int = Field(16, ge=1, le=MAX_COUNT)
    starts_per_image: int = Field(8, ge=1, le=MAX_COUNT)


class SandboxConfig(_Model):
    backend: Literal["auto", "bwrap", "apptainer", "none"] = "auto"
    max_pids: int = Field(512, ge=16, le=MAX_COUNT)
    max_file_bytes: int = Field(1 << 30, ge=1, le=MAX_BYTES)
    max_disk_bytes: int = Field(4 << 30, ge=1, le=MAX_BYTES)
    max_output_bytes: int = Field(1 << 20, ge=1, le=MAX_BYTES)
    max_cpus: float = Field(1.0, gt=0, le=4096)  # per sandbox, where a cpu cgroup can be made
    # a gateway running as root runs each sandbox (bwrap, apptainer) as its own host uid:gid U:U from
    # these, inclusive: never root, never 65534, one live sandbox per uid on the node (sandbox/uids.py)
    uid_range: list[int] = Field(list(UID_RANGE), min_length=2, max_length=2)  # [FIRST, LAST]
    apptainer: ApptainerConfig = ApptainerConfig()

    @pydantic.field_validator("uid_range")
    @classmethod
    def _uid_range(cls, value: list[int]) -> list[int]:
        first, last = value
        if not 1 <= first <= last <= (1 << 32) - 2:
            raise ValueError(f"[{first}, {last}]: [FIRST, LAST] with 1 <= FIRST <= LAST <= 4294967294")
        if first <= 65534 <= last:
            raise ValueError(f"[{first}, {last}] holds 65534 (nobody), which other host processes share")
        if last - first >= MAX_COUNT:
            raise ValueError(f"[{first}, {last}]: at most {MAX_COUNT} uids")
        return value


class SlurmComponent(_Model):
    """One component of the hetjob: `nodes` nodes with these resources each."""

    nodes: int = Field(1, ge=1, le=MAX_COUNT)
    partition: str | None = None
    cpus: int = Field(1, ge=1, le=MAX_COUNT)  # --cpus-per-task (one task per node)
    mem: str | None = None  # --mem, e.g. 64G
    gpus: int = Field(0, ge=0, le=1024)  # --gpus-per-node
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
    signal_s: int = Field(120, ge=10, le=86400)  # SIGUSR2 this long before the time limit: journal and requeue
    requeue: bool = True  # requeue the job on preemption / time limit
    port: int = Field(0, ge=0, le=65535)  # orchestrator TCP port; 0 picks a free one
    step_restarts: int = Field(3, ge=0, le=MAX_COUNT)  # a failed engine/gateway step is restarted this many times
    # walltime admission plans for each session's timeout_s, or (observed) for the admit_quantile of what
    # the task's completed sessions took in this life, once admit_min_samples of them completed
    admit_by: Literal["timeout", "observed"] = "timeout"
    admit_quantile: float = Field(0.9, gt=0, le=1)
    admit_min_samples: int = Field(3, ge=1, le=MAX_COUNT)
    stop_budget_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)  # seconds to stop in; None: a third of KillWait
    extra_sbatch: list[str] = []  # more job-wide sbatch flags, e.g. ["--mail-type=END"]


class ServiceConfig(_Model):
    enabled: bool = False  # trainers add tasks while the run goes (polar_hpc.client); it ends on drain
    max_queued: int = Field(4096, ge=1, le=MAX_COUNT)  # queued sessions beyond this answer `busy`
    weight_update_timeout_s: float = Field(600.0, gt=0, le=MAX_SECONDS)  # per engine: pause, load, continue
    # in-flight calls: finish first, abort (retried), or continue on the new weights (docs/service.md)
    weight_update_mode: Literal["wait", "abort", "continue"] = "wait"


class MetricsConfig(_Model):
    enabled: bool = True  # per-process counters, the orchestrator's /metrics and metrics.jsonl (docs/observe.md)
    interval_s: float = Field(5.0, gt=0, le=3600)  # how often each process sends a snapshot; the log's period
    host: str = "127.0.0.1"  # where the orchestrator serves /metrics
    port: int = Field(0, ge=0, le=65535)  # 0: a free port (its URL is in rendezvous.json)


class Topology(_Model):
    run_dir: str | None = None
    engine: EngineConfig = EngineConfig()
    gateway: GatewayConfig = GatewayConfig()
    proxy: Annotated[ProxySettings, Settings()] = ProxySettings()
    sandbox: SandboxConfig = SandboxConfig()
    slurm: SlurmConfig = SlurmConfig()
    service: ServiceConfig = ServiceConfig()
    metrics: MetricsConfig = MetricsConfig()


# --- tasks ----------------------------------------------------------------------------------------


def _no_nul(text: str) -> str:
    if "\0" in text:
        raise ValueError("contains a NUL byte, which no command line or environment can carry")
    return text


def _env_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r} is not an environment variable name (letters, digits and _, not first a digit)")
    return name


_Text = Annotated[str, pydantic.AfterValidator(_no_nul)]
_EnvName = Annotated[str, pydantic.AfterValidator(_env_name)]
# a user in a task's image, as `docker exec -u` takes it: NAME, UID, NAME:GROUP or UID:GID
ImageUser = Annotated[str, pydantic.StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$",
                                                      max_length=256)]


class HarnessSpec(_Model):
    """`shell` runs `command`; a preset writes its harness's config and runs it (`command`, if
    given, replaces the preset's command line); `oracle` runs the task's `solution`, `noop` nothing."""

    kind: Literal["shell", "mini_swe_agent", "codex", "claude_code", "opencode", "qwen_code", "oracle",
                  "noop"] = "shell"
    command: _Text | None = None
    env: dict[_EnvName, _Text] = Field(default_factory=dict)

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
    files: dict[str, str] = {}  # destination in the workspace -> source path (inside the task's folder)
    prepare: list[_Text] = []
    network: Literal["none", "proxy-only", "host"] = "proxy-only"  # host: an explicit opt-in
    gpus: bool = False  # apptainer: --nv
    # a suite's task.toml resources: storage_mb bounds the session's disk (below the topology's
    # max_disk_bytes), cpus its cgroup's CPU quota (below max_cpus); memory_mb is recorded only
    cpus: float | None = Field(None, gt=0, le=4096)
    memory_mb: int | None = Field(None, ge=1, le=MAX_MB)
    storage_mb: int | None = Field(None, ge=1, le=MAX_MB)
    # where the harness (and tests evaluator) start: the session's workspace, or, as in the task's
    # container (Harbor), the image's WorkingDir ("/" where it has none; the workspace without an image)
    cwd: Literal["workspace", "image"] = "workspace"
    user: ImageUser | None = None  # the harness's user in the image (Harbor's [agent] user); None: the image's User


_DEFAULT_SANDBOX = TaskSandbox()


class CommandEvaluator(_Model):
    kind: Literal["command"]
    command: _Text
    timeout_s: float = Field(60.0, gt=0, le=86400)
    # "session": run in the harness's sandbox as it left it; "fresh": in a new sandbox (the task's
    # files and prepare, started while the harness runs) holding the harness's workspace at submission/
    sandbox: Literal["session", "fresh"] = "session"


class RewardFileEvaluator(_Model):
    kind: Literal["reward_file"]
    path: str = "reward.txt"


class RegexEvaluator(_Model):
    kind: Literal["regex"]
    pattern: str


class TestsEvaluator(_Model):
    """Hidden tests (polar_hpc.suites), run once the harness has finished: `dir` (a folder of the
    task's, copied in only then, at /tests = $POLAR_TESTS_DIR) and / or `patch` (a diff applied to
    the workspace then), then `command` with `env`; the reward from /logs/verifier/reward.json (every
    key kept), else reward.txt; neither is an error (`reward: exit_code`: 1.0 on exit 0, else 0.0,
    no file read). `sandbox`: "session" runs them in the harness's own sandbox as it left it
    (Harbor's way), "fresh" in a new sandbox holding only its workspace diff."""

    kind: Literal["tests"]
    dir: str | None = None
    patch: _Text | None = None
    command: _Text = 'bash "$POLAR_TESTS_DIR/test.sh"'
    timeout_s: float = Field(600.0, gt=0, le=86400)
    env: dict[_EnvName, _Text] = {}
    sandbox: Literal["session", "fresh"] = "session"
    reward: Literal["file", "exit_code"] = "file"
    user: ImageUser | None = None  # the tests' user in the image (Harbor's [verifier] user); None: the image's User


class SwebenchEvaluator(_Model):
    """A SWE-bench row graded by the official `swebench` package (trajectory.swebench): in a fresh
    sandbox of the task's image, the harness's workspace diff applied to /testbed, then the eval
    script the package writes for `instance` (the row's published columns that grading reads)."""

    kind: Literal["swebench"]
    instance: dict[str, Any]
    timeout_s: float = Field(1800.0, gt=0, le=86400)


Evaluator = Annotated[
    Union[CommandEvaluator, RewardFileEvaluator, RegexEvaluator, TestsEvaluator, SwebenchEvaluator],
    Field(discriminator="kind"),
]


_EVALUATOR_KINDS = ("command", "reward_file", "regex", "tests", "swebench")


class TaskSolution(_Model):
    """What `harness: oracle` runs: `dir` (a folder of the task's holding solve.sh) and / or `patch`
    (a diff applied with git apply), copied into the workspace only for the oracle."""

    dir: str | None = None
    patch: _Text | None = None
    env: dict[_EnvName, _Text] = {}  # the oracle's environment (Harbor: [solution.env])


class Task(_Model):
    id: str
    instruction: _Text
    num_samples: int = Field(DEFAULT_SAMPLES, ge=1, le=MAX_SAMPLES)  # sessions started
    # early acceptance (docs/tasks.md): the group is decided at `accept` finished samples, or after
    # `accept_grace_s` from its first at `accept_fraction` of `accept`; the other samples are cancelled
    accept: int | None = Field(None, ge=1, le=MAX_SAMPLES)
    accept_fraction: float | None = Field(None, gt=0, le=1)
    accept_grace_s: float | None = Field(None, ge=0, le=MAX_TIMEOUT_S)
    timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)
    harness: HarnessSpec
    sandbox: TaskSandbox = Field(default_factory=lambda: _DEFAULT_SANDBOX)  # shared, not copied per task
    evaluator: Evaluator | None = None
    solution: TaskSolution | None = None
    builder: Literal["per_request", "prefix_merge"] = "prefix_merge"
    metadata: dict[str, Any] = Field(default_factory=dict)

    @pydantic.field_validator("id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        """Ids name sessions (`<id>#<sample>.<attempt>`) and may name a run folder: no `#`, spaces, `..`."""
        if not TASK_ID.fullmatch(value) or ".." in value:
            raise ValueError("a task id is 1-256 of the characters A-Z a-z 0-9 . _ - : @ + = /, starting with a "
                             f"letter, digit or _, without '..' (got {value[:80]!r})")
        return value

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _acceptance(cls, data: Any, handler: Any) -> Task:
        """`accept` at most `num_samples`; `accept_fraction` and `accept_grace_s` together, with `accept`."""
        task = handler(data)
        problem = None
        if task.accept is not None and task.accept > task.num_samples:
            problem = ("accept", f"{task.accept} accepted samples of {task.num_samples} started: at most num_samples")
        elif (task.accept_fraction is None) != (task.accept_grace_s is None):
            given, missing = (("accept_fraction", "accept_grace_s") if task.accept_grace_s is None
                              else ("accept_grace_s", "accept_fraction"))
            problem = (given, f"needs {missing} too: accept_fraction and accept_grace_s go together")
        elif task.accept_fraction is not None and task.accept is None:
            problem = ("accept_fraction", "a fraction of what: set accept too")
        if problem is None:
            return task
        raise pydantic_core.ValidationError.from_exception_data(cls.__name__, [
            {"type": "value_error", "loc": (problem[0],), "input": data, "ctx": {"error": ValueError(problem[1])}}])

    @pydantic.field_validator("metadata")
    @classmethod
    def _shallow_metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value and nesting(value) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        plain(value)
        return value


def task_file_sessions(path: Path) -> int:
    """Sessions a run's task file (`<run>/tasks.jsonl`, one validated task per line, written by
    `prepare`) asks for: the sum of its num_samples; 0 when it is missing. A line that is not a task
    object (a crash cut it short) counts nothing."""
    n = 0
    try:
        with nofollow.fopen(path, "rb") as f:  # never a link planted in the run directory
            for line in f:
                try:
                    n += int(json.loads(line).get("num_samples", DEFAULT_SAMPLES)) if line.strip() else 0
                except (ValueError, AttributeError, TypeError):
                    continue
    except OSError:  # missing, or a link or FIFO there
        return 0
    return n
def plain(value: Any) -> None:
    """ValueError unless `value` is what msgpack and JSON both carry as it is: text keys, numbers
    within 64 bits, text, bools, null, lists and maps (not a YAML date, bytes or set)."""
    level = [value]
    while level:
        below: list[Any] = []
        for x in level:
            if isinstance(x, dict):
                if not all(isinstance(k, str) for k in x):
                    raise ValueError("a key that is not text")
                below.extend(x.values())
            elif isinstance(x, list):
                below.extend(x)
            elif isinstance(x, int) and not isinstance(x, bool) and not -MAX_INT - 1 <= x <= MAX_INT:
                raise ValueError(f"a number beyond 64 bits: {str(x)[:40]}")
            elif x is not None and not isinstance(x, (str, int, float)):
                raise ValueError(f"a {type(x).__name__}, not text, a number, a bool, null, a list or a map")
        level = below


def duplicate_ids(ids: list[str]) -> list[str]:
    """The ids that occur more than once, sorted (linear time)."""
    return sorted(i for i, n in Counter(ids).items() if n > 1)


# --- loading --------------------------------------------------------------------------------------


def load_topology(path: Path | None) -> Topology:
    """The topology in `path`, or the defaults when no file is given."""
    if path is None:
        return Topology()
    data, line_of = read_yaml(path)
    return validate_data(Topology, data, path, line_of)


def load_tasks(path: Path, files_checked: bool = False) -> list[Task]:
    """Tasks from a YAML file (one task, or a list) or a JSONL file (one task per line).

    `files_checked`: a run's own copy of tasks already loaded once (sandbox files resolved and
    checked then), so sources are taken as they are."""
    was_enabled = gc.isenabled()
    gc.disable()  # a big suite allocates only live objects: the cyclic collector would rescan them all
    try:
        return _load_tasks(path, files_checked)
    finally:
        if was_enabled:
            gc.enable()


def _load_tasks(path: Path, files_checked: bool) -> list[Task]:
    if path.suffix == ".jsonl":
        tasks = _load_jsonl(path, files_checked)
    else:
        data, line_of = read_yaml(path)
        items = data if isinstance(data, list) else [data]
        tasks = _validate_all(
            [(item, line_of, (i,) if isinstance(data, list) else ()) for i, item in enumerate(items)],
            path, files_checked=files_checked,
        )
    dup = duplicate_ids([t.id for t in tasks])
    if dup:
        raise ConfigError(f"{path}: duplicate task id(s): {', '.join(dup[:20])}{' ...' if len(dup) > 20 else ''}")
    sessions = sum(t.num_samples for t in tasks)
    if sessions > MAX_SESSIONS:
        raise ConfigError(f"{path}: {sessions} sessions (tasks x num_samples); at most {MAX_SESSIONS} per task file")
    return tasks


def _load_jsonl(path: Path, files_checked: bool) -> list[Task]:
    entries, problems = [], []
    for lineno, text in enumerate(read_text(path, MAX_JSONL_BYTES).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            entries.append((read_json_line(text), lambda loc, n=lineno: n, ()))
        except ValueError as e:
            problems.append(f"{path}:{lineno}: not valid JSON: {e}")
    return _validate_all(entries, path, problems, files_checked)


def _validate_all(entries: list[tuple[Any, Callable, tuple]], path: Path, problems: list[str] | None = None,
                  files_checked: bool = False) -> list[Task]:
    """Validate every entry, collecting all problems (in line order) before failing."""
    tasks, problems = [], list(problems or [])
    for data, line_of, prefix in entries:
        try:
            task = validate_data(Task, data, path, line_of, prefix)
            resolve = not files_checked and (task.sandbox.files or getattr(task.evaluator, "dir", None)
                                             or (task.solution and task.solution.dir))
            tasks.append(_resolve_files(task, path, line_of, prefix) if resolve else task)
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


def validate_data(model: type[BaseModel], data: Any, path: Path, line_of: Callable, prefix: tuple = ()) -> Any:
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        raise ConfigError("\n".join(_describe(err, path, line_of, prefix) for err in e.errors())) from None


def _describe(err: Any, path: Path, line_of: Callable, prefix: tuple) -> str:
    loc = _strip_union_tags(err["loc"])
    field = ".".join(str(x) for x in loc) or "(top level)"
    line = line_of(prefix + loc)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "missing required field"
    elif err["type"] == "value_error":
        msg = str(err["ctx"]["error"])
    return f"{path}:{line}: {field}: {msg}"


def _strip_union_tags(loc: tuple) -> tuple:
    """pydantic puts the discriminator value in loc (evaluator.regex.pattern); drop it."""
    return tuple(x for i, x in enumerate(loc) if not (i and loc[i - 1] == "evaluator" and x in _EVALUATOR_KINDS))


def _resolve_files(task: Task, path: Path, line_of: Callable, prefix: tuple) -> Task:
    """Each `sandbox.files` source (and a tests evaluator's or a solution's `dir`) as an absolute
    path inside the task file's folder, or ConfigError.

    A source must be a regular file or folder below that folder, reached without `..` and without
    a symbolic link on the way; a destination must be relative, without `..`.
    """
    base, folder, files, problems = path.parent.resolve(), path.parent.absolute(), {}, []
    for dest, src in task.sandbox.files.items():
        line = line_of(prefix + ("sandbox", "files", dest))
        try:
            files[dest] = _source(base, folder, dest, src)
        except ValueError as e:
            problems.append(f"{path}:{line}: sandbox.files: {e}")
    update: dict[str, Any] = {"sandbox": task.sandbox.model_copy(update={"files": files})}
    for name, part in (("evaluator", task.evaluator), ("solution", task.solution)):
        if isinstance(part, (TestsEvaluator, TaskSolution)) and part.dir is not None:
            try:
                update[name] = part.model_copy(update={"dir": _source(base, folder, name, part.dir)})
            except ValueError as e:
                problems.append(f"{path}:{line_of(prefix + (name, 'dir'))}: {name}.dir: {e}")
    if problems:
        raise ConfigError("\n".join(problems))
    return task.model_copy(update=update)


def resolve_source(folder: Path, src: str) -> str:
    """`src` (relative to `folder`) as an absolute path checked as a task file's sources are."""
    return _source(folder.resolve(), folder.absolute(), "source", src)


def _source(base: Path, folder: Path, dest: str, src: str) -> str:
    target = PurePosixPath(dest)
    if "\0" in dest or target.is_absolute() or ".." in target.parts or not dest.strip("./"):
        raise ValueError(f"destination leaves the workspace (absolute, '..' or empty): {dest}")
    if "\0" in src:
        raise ValueError(f"source contains a NUL byte: {src!r}")
    given = Path(src)
    if ".." in given.parts:
        raise ValueError(f"'..' is not allowed in a source: {src}")
    full = given if given.is_absolute() else base / given
    rel = next((full.relative_to(f) for f in (base, folder) if full.is_relative_to(f)), None)
    if rel is None:
        raise ValueError(f"source outside the task's folder ({base}): {src}")
    here, mode = base, base.stat().st_mode
    for part in rel.parts:
        here = here / part
        try:
            mode = here.lstat().st_mode
        except FileNotFoundError:
            raise ValueError(f"no such file: {src}") from None
        except OSError as e:
            raise ValueError(f"cannot read {src}: {e.strerror}") from None
        if stat.S_ISLNK(mode):
            raise ValueError(f"a symbolic link on the way ({here}; links are not followed): {src}")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(f"not a regular file or folder: {src}")
    return str(here)
