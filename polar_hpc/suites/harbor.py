"""Harbor-format task folders as our tasks: `load(path, harness)` -> list[Task], or ConfigError.

`path` is one task folder (it holds task.toml) or a folder of them (every non-hidden subfolder
is a task). A task folder holds:
- `instruction.md`: the instruction (UTF-8, at most MAX_INSTRUCTION_BYTES);
- `task.toml`, Harbor's schema: `[agent] timeout_sec` (the session's timeout_s) and `user` (the
  harness's user in the image, pulled or built: `sandbox.user`; with `dockerfile: host`, none, a
  warning), `[verifier] timeout_sec`, `env` and `user` (the tests'), `[solution] env` (the oracle's),
  `[environment] docker_image` (a registry reference: the sandbox image `docker://CANONICAL`, its
  file and line kept as metadata.image_source for `image pull`), `cpus`, `memory_mb`, `storage_mb`
  (or the legacy `memory`/`storage` strings, converted as Harbor converts them: "2G" is 2048 MB),
  `env` (the harness's and the tests'), `allow_internet = false` / `network_mode = "no-network"`
  (network proxy-only: the harness reaches only its model); `[metadata]`, `[task]` and `source`
  kept in the task's metadata. The harness and the tests start in the image's WorkingDir
  (`sandbox.cwd: image`), as in Harbor's container. A user that is not a name or uid, or a
  `[verifier] user` other than `[agent] user` where the tests run in the harness's own sandbox
  (`verifier_sandbox` session: one user is mapped there), is an error. Every other key, and a value
  not honoured here (public or allowlisted network, GPUs...),
  is named in `warnings` (FILE:LINE: FIELD: why) and ignored;
  `${VAR}` / `${VAR:-default}` in env values are the host's variables, as in Harbor. A multi-step
  task (`[[steps]]`) is refused: in a folder of tasks it is left out with a warning, the others load;
- `environment/`: a Dockerfile or `docker_image` (at least one); `environment/workspace/`, if
  there, is what the workspace starts with (a task with only a Dockerfile keeps it as
  metadata.dockerfile and, unless `dockerfile` is `host`, its build context's key as
  metadata.build: suites.dockerfile builds it);
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
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from polar_hpc.config import (
    MAX_MB,
    ImageUser,
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
from polar_hpc.suites import dockerfile as builder
from polar_hpc.suites import images

MAX_INSTRUCTION_BYTES = 1 << 20
MAX_TOML_BYTES = 1 << 20
MAX_TASKS = 100_000  # task folders in one suite folder
MAX_ENTRIES = 100_000  # entries of one task's tests/ or solution/ looked at for links


_Env = dict[str, str]


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class _Agent(_Section):
    timeout_sec: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    user: ImageUser | None = None  # Harbor's: a name or a uid (TOML integer); None: the image's User

    @pydantic.field_validator("user", mode="before")
    @classmethod
    def _uid(cls, value: Any) -> Any:
        if type(value) is int:
            if not 0 <= value < 1 << 31:
                raise ValueError(f"{value} is not a uid")
            return str(value)
        return value


class _Verifier(_Agent):
    timeout_sec: float = Field(600.0, gt=0, le=86400)
    env: _Env = {}


class _Solution(_Section):
    env: _Env = {}


class _Environment(_Section):
    docker_image: str | None = None
    cpus: float | None = Field(None, gt=0, le=4096)
    memory_mb: int | None = Field(None, ge=1, le=MAX_MB)
    storage_mb: int | None = Field(None, ge=1, le=MAX_MB)
    memory: str | None = None  # legacy, Harbor's: "2G" -> memory_mb 2048
    storage: str | None = None
    env: _Env = {}
    allow_internet: bool = True
    network_mode: Literal["public", "no-network", "allowlist"] | None = None

    @pydantic.field_validator("memory", "storage")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            _size_mb(value)
        return value

    @pydantic.model_validator(mode="after")
    def _legacy_sizes(self) -> _Environment:
        """Harbor's conversion: the legacy string wins over memory_mb / storage_mb."""
        if self.memory is not None:
            self.memory_mb = _size_mb(self.memory)
        if self.storage is not None:
            self.storage_mb = _size_mb(self.storage)
        return self


class TaskToml(_Section):
    agent: _Agent = _Agent()
    verifier: _Verifier = _Verifier()
    solution: _Solution = _Solution()
    environment: _Environment = _Environment()
    metadata: dict[str, Any] = {}
    task: dict[str, Any] = {}  # Harbor's package info (name, description, authors, keywords)
    source: str | None = None
    steps: list[Any] = []

    @pydantic.field_validator("metadata")
    @classmethod
    def _plain_metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        plain(value)
        return value


# task.toml keys honoured above (or harmless: the schema's version); every other one is warned about
_HONOURED = {
    "": {"schema_version", "version", "agent", "verifier", "solution", "environment", "metadata", "task", "source"},
    "agent": {"timeout_sec", "user"},
    "verifier": {"timeout_sec", "env", "user"},
    "solution": {"env"},
    "environment": {"docker_image", "cpus", "memory_mb", "storage_mb", "memory", "storage", "env", "allow_internet",
                    "network_mode", "os"},
}
_WHY = {  # why a key Harbor knows is not honoured here
    "network_mode": "not honoured per phase: the harness and the tests share the task's network",
    "allowed_hosts": "not honoured: no host allowlist; the network is proxy-only",
    "gpus": "not honoured: GPUs are given to a sandbox only by sandbox.gpus (Apptainer --nv)",
    "gpu_types": "not honoured", "mcp_servers": "not honoured: no MCP server is started",
    "skills_dir": "not honoured: no skills are copied", "healthcheck": "not run",
    "build_timeout_sec": "not used: Dockerfiles are built as docs/tasks.md says", "steps": "multi-step task",
    "workdir": "not a Harbor key: commands start in the image's WORKDIR (its OCI WorkingDir)",
}


def is_task(path: Path) -> bool:
    return (path / "task.toml").is_file()


def load(path: Path, harness: HarnessSpec, warnings: list[str] | None = None,
         verifier_sandbox: Literal["session", "fresh"] = "session", dockerfile: Dockerfiles = "build") -> list[Task]:
    """The tasks of `path`, verified in `verifier_sandbox`, those with only a Dockerfile built or
    run on the host's tree (`dockerfile`); what is ignored or left out is appended to `warnings`."""
    single = is_task(path)
    folders = [path] if single else _subfolders(path)
    tasks, problems = [], [f"{p}: a symbolic link (not followed): not a task folder" for p in folders if p.is_symlink()]
    told: list[str] = []
    for folder in (f for f in folders if not f.is_symlink()):
        try:
            task = load_task(folder, harness, told, verifier_sandbox, dockerfile)
        except ConfigError as e:
            problems.append(str(e))
            continue
        if task is None and single:
            problems += [w for w in told if w.endswith(MULTI_STEP)]
        elif task is not None:
            tasks.append(task)
    if problems:
        raise ConfigError("\n".join(problems))
    if warnings is not None:
        warnings += told
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


def load_task(folder: Path, harness: HarnessSpec, warnings: list[str] | None = None,
              verifier_sandbox: Literal["session", "fresh"] = "session", built: Dockerfiles = "build") -> Task | None:
    """The task of `folder` (ConfigError naming every problem), or None for a multi-step task."""
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
    toml, toml_text = _task_toml(folder, problems)
    told = _unhonoured(folder / "task.toml", toml_text) if toml is not None else []
    if warnings is not None:
        warnings += told
    if toml is not None and toml.steps:
        return None
    instruction = _instruction(folder, problems)
    env = toml.environment.env if toml else {}
    resolved = {section: _resolve(folder / "task.toml", toml_text, section, values, problems)
                for section, values in (("environment", env), ("verifier", toml.verifier.env if toml else {}),
                                        ("solution", toml.solution.env if toml else {}))}
    tests = source("tests", "tests")
    if tests is not None:
        source("tests/test.sh", "tests/test.sh")
        problems.extend(_links(Path(tests), "tests"))
    solution = source("solution", "solution", required=False)
    if solution is not None:
        source("solution/solve.sh", "solution/solve.sh")
        problems.extend(_links(Path(solution), "solution"))
    files = _workspace(folder, source)
    image, dockerfile = (toml.environment.docker_image if toml else None), None
    image_source = f"{folder / 'task.toml'}:{_toml_line(toml_text, ('environment', 'docker_image'))}: environment.docker_image"
    if image:
        try:
            image = images.parse(image).transport
        except ValueError as e:
            problems.append(f"{image_source}: {e}")
    elif toml is not None:
        dockerfile = source("environment/Dockerfile", "environment: neither a Dockerfile nor task.toml's "
                            "environment.docker_image")
    if harness.kind == "oracle" and solution is None and not problems:
        problems.append(f"{folder}/solution/solve.sh: missing, and `harness: oracle` runs it")
    users = (toml.agent.user, toml.verifier.user) if toml is not None and (image or dockerfile) else (None, None)
    if dockerfile and built == "host" and warnings is not None:  # the host's tree has no users of an image
        warnings += [f"{folder / 'task.toml'}:{_toml_line(toml_text, (section, 'user'))}: {section}.user: not honoured "
                     "with `dockerfile: host` (no image, so none of its users): run as the sandbox's own user"
                     for section, user in zip(("agent", "verifier"), users) if user]
    users = (None, None) if dockerfile and built == "host" else users
    if verifier_sandbox == "session" and users[0] != users[1]:
        problems.append(f"{folder / 'task.toml'}:{_toml_line(toml_text, ('verifier', 'user'))}: verifier.user: "
                        f"{users[1] or 'the image User'} differs from agent.user ({users[0] or 'the image User'}): "
                        "the tests run in the harness's own sandbox, where one user is mapped; not supported "
                        "(a suite file's `verifier_sandbox: fresh` runs them in a sandbox of their own)")
    if problems:
        raise ConfigError("\n".join(problems))
    assert toml is not None, "_task_toml returns None only after adding a problem"
    box, task_env = toml.environment, resolved["environment"]
    offline = not box.allow_internet or box.network_mode == "no-network"
    network: dict[str, Any] = {"network": "proxy-only"} if offline else {}  # else the sandbox's default
    try:
        return Task(
            id=folder.name, instruction=instruction, timeout_s=toml.agent.timeout_sec or 600.0,
            harness=harness.model_copy(update={"env": task_env | harness.env}) if task_env else harness,
            sandbox=TaskSandbox(image=image, files=files, cpus=box.cpus, memory_mb=box.memory_mb,
                                storage_mb=box.storage_mb, cwd="image", user=users[0], **network),
            evaluator=TestsEvaluator(kind="tests", dir=tests, timeout_s=toml.verifier.timeout_sec,
                                     env=task_env | resolved["verifier"], sandbox=verifier_sandbox, user=users[1]),
            solution=TaskSolution(dir=solution, env=task_env | resolved["solution"]) if solution else None,
            metadata={"suite": "harbor", "task_dir": str(folder.absolute())} | (
                {"harbor": toml.metadata} if toml.metadata else {}) | ({"image_source": image_source} if image else {})
            | ({"harbor_task": toml.task} if toml.task else {}) | ({"source": toml.source} if toml.source else {})
            | ({"dockerfile": dockerfile} if dockerfile else {})
            | ({"build": builder.spec(folder / "environment", offline)} if dockerfile and built == "build" else {}),
        )
    except pydantic.ValidationError as e:  # an env name or value no process can carry
        raise ConfigError("\n".join(f"{folder / 'task.toml'}: {'.'.join(map(str, err['loc']))}: {err['msg']}"
                                     for err in e.errors())) from None


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
        if header := re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?", stripped):
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


Dockerfiles = Literal["build", "host"]  # tasks with only a Dockerfile: built by `image pull`, or on the host's tree
MULTI_STEP = "steps: a multi-step task ([[steps]]: an instruction and tests per step) is not run here: refused"


def _size_mb(size: str) -> int:
    """Harbor's legacy size string in MB: "2G" -> 2048, "512M" -> 512, "1024K" -> 1 (case-insensitive)."""
    text = size.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(text[-1:])
    try:
        if scale is None:
            raise ValueError
        return int(float(text[:-1]) * scale)
    except ValueError:
        raise ValueError(f"{size!r} is not a size such as '2G', '512M' or '1024K'") from None


def _unhonoured(path: Path, text: str) -> list[str]:
    """One warning per task.toml key (and value) not honoured here."""
    data, found = tomllib.loads(text), []

    def warn(loc: tuple[str, ...], why: str) -> None:
        found.append(f"{path}:{_toml_line(text, loc)}: {'.'.join(loc)}: {why}")

    for key in data:
        if key == "steps":
            warn((key,), MULTI_STEP.removeprefix("steps: "))
        elif key not in _HONOURED[""]:
            warn((key,), "not a Harbor task.toml key: ignored")
    for section, known in _HONOURED.items():
        table = data.get(section) if section else None
        for key in table if isinstance(table, dict) else ():
            if key not in known:
                warn((section, key), _WHY.get(key, "not a Harbor task.toml key") + ": ignored")
    box: dict[str, Any] = data["environment"] if isinstance(data.get("environment"), dict) else {}
    if box.get("allow_internet") is True or box.get("network_mode") in ("public", "allowlist"):
        key = "network_mode" if "network_mode" in box else "allow_internet"
        warn(("environment", key), "not granted: the sandbox's network is proxy-only (the harness reaches only its "
                                   "model); a suite file's `network: host` grants the host's network")
    if box.get("os") not in (None, "linux"):
        warn(("environment", "os"), f"{box['os']!r}: only Linux tasks run here")
    return found


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _resolve(path: Path, text: str, section: str, env: dict[str, str], problems: list[str]) -> dict[str, str]:
    """`env` with each ${VAR} / ${VAR:-default} replaced by the host's variable, as Harbor resolves them."""
    out = {}
    for key, value in env.items():
        missing = [m.group(1) for m in _TEMPLATE.finditer(value) if m.group(2) is None and m.group(1) not in os.environ]
        if missing:
            problems.append(f"{path}:{_toml_line(text, (f'{section}.env', key))}: {section}.env.{key}: ${{{missing[0]}}} is not "
                            "set where the suite is loaded (and has no ${VAR:-default})")
        out[key] = _TEMPLATE.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)
    return out
