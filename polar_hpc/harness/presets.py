"""Presets: known harnesses run unchanged, each given the config it reads, pointed at the proxy.

`launch(task, proxy_url, token, session_id, workspace) -> (command, env)` is what the gateway runs
for any task: the shell harness's own command, or a preset's. A preset writes its harness's config
files into the workspace (which is HOME in the sandbox) and returns its command line; the API key
is always the session token and the model name the task's `harness.env` POLAR_MODEL (default
`polar`: the proxy answers any model name with the run's model). `harness.command` replaces the
preset's command; `harness.env` is applied last.

Each preset keeps its harness offline (no telemetry, update checks or side calls that would open a
second trace), non-interactive and with every permission granted (the sandbox is the boundary);
those that size their own requests are given `CONTEXT_TOKENS` and `OUTPUT_TOKENS`.

| kind | API | config written | command |
| --- | --- | --- | --- |
| mini_swe_agent | OpenAI Chat (litellm) | `.polar/mini.yaml` | `mini -y --exit-immediately` |
| codex | OpenAI Responses, streaming | `~/.codex/config.toml` (custom provider) | `codex exec` |
| claude_code | Anthropic Messages, streaming | env only (ANTHROPIC_*, IS_SANDBOX) | `claude -p` |
| opencode | OpenAI Chat, streaming | `opencode.json` (openai-compatible provider) | `opencode run` |
| qwen_code | OpenAI Chat, streaming | `~/.qwen/settings.json`, env OPENAI_* | `qwen --yolo -p` |
| oracle | none: the task's solution | `.polar/oracle/` (solution, `solution.patch`) or /solution | `git apply`, `bash solve.sh` |
| noop | none | nothing | `true` |

`oracle` and `noop` validate a suite before training (oracle scores 1.0, noop 0.0 on a sound
task); the oracle's copy lies under `.polar/`, which the workspace diff leaves out.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from polar_hpc.config import Task
from polar_hpc.harness import shell
from polar_hpc.sandbox import files
from polar_hpc.trajectory import workspace as diffs

_DIR = ".polar"
ORACLE_MAX_BYTES = 256 << 20  # a solution folder copied in for the oracle
CONTEXT_TOKENS = 65536  # the context claude_code and qwen_code assume (examples/harnesses/topology.yaml)
OUTPUT_TOKENS = 4096  # their cap on a reply: their default (32000) overflows such a context


def launch(
    task: Task, proxy_url: str, token: str, session_id: str, workspace: Path, solution_at: str | None = None
) -> tuple[str, dict[str, str]]:
    """`solution_at`: where the oracle finds the task's solution folder already put (Harbor's
    /solution), else it is copied into the workspace."""
    env = shell.environment(task, proxy_url, token, session_id, workspace)
    kind = task.harness.kind
    if kind == "shell":
        assert task.harness.command is not None  # HarnessSpec requires it for shell
        return task.harness.command, env
    if kind in ("oracle", "noop"):
        if kind == "noop":
            return "true", env
        return oracle(task, workspace, solution_at), env | (dict(task.solution.env) if task.solution else {})
    model = task.harness.env.get("POLAR_MODEL", "polar")
    command, extra = PRESETS[kind](proxy_url, token, model, workspace)
    return task.harness.command or command, env | extra | dict(task.harness.env)


def _write(workspace: Path, rel: str, text: str) -> Path:
    """Write a config file into the workspace without following links (the sandbox made them)."""
    files.write(workspace, rel, text.encode())
    return workspace / rel


def oracle(task: Task, workspace: Path, solution_at: str | None = None) -> str:
    """Copy the task's solution into the workspace (its folder: unless at `solution_at`); the
    command that applies it."""
    solution, steps = task.solution, []
    if solution is None:
        return "echo 'harness oracle: this task has no solution' >&2; exit 2"
    if solution.patch:
        patch = _write(workspace, f"{_DIR}/oracle/solution.patch", solution.patch)  # by its full path: the
        steps.append(f"{diffs.GIT} apply --binary {shlex.quote(str(patch))}")  # cwd may be the image's WORKDIR
    if solution.dir and solution_at:
        steps.append(f"bash {shlex.quote(f'{solution_at}/solve.sh')}")
    elif solution.dir:
        src = Path(solution.dir)
        files.copy(src.parent, src.name, workspace, f"{_DIR}/oracle/solution", ORACLE_MAX_BYTES, threading.Event())
        steps.append(f"bash {shlex.quote(f'{_DIR}/oracle/solution/solve.sh')}")
    return " && ".join(steps)


def mini_swe_agent(proxy_url: str, token: str, model: str, workspace: Path):
    config = {
        "model": {
            "model_name": f"openai/{model}",
            "model_kwargs": {"api_base": f"{proxy_url}/v1", "api_key": token, "drop_params": True},
            "cost_tracking": "ignore_errors",
        },
        "agent": {"cost_limit": 0},
    }
    path = _write(workspace, f"{_DIR}/mini.yaml", yaml.safe_dump(config))
    command = (f'mini -y --exit-immediately -c mini.yaml -c {path} -t "$POLAR_INSTRUCTION" '
               f"-o {workspace / _DIR / 'mini.traj.json'}")
    env = {"MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_GLOBAL_CONFIG_DIR": str(workspace / _DIR / "mini-swe-agent"),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return command, env


def codex(proxy_url: str, token: str, model: str, workspace: Path):
    toml = "\n".join([
        f'model = "{model}"', 'model_provider = "polar"', 'approval_policy = "never"',
        'web_search = "disabled"  # a built-in Responses tool: offline, and not a function the model can call here',
        'sandbox_mode = "danger-full-access"', "", "[model_providers.polar]",
        'name = "polar-hpc proxy"', f'base_url = "{proxy_url}/v1"', 'env_key = "POLAR_API_KEY"',
        'wire_api = "responses"', "",
        "[features]", "multi_agent = false  # its sub-agent tools come as a Responses `namespace` tool", "",
    ])
    _write(workspace, ".codex/config.toml", toml)
    command = 'codex exec --skip-git-repo-check "$POLAR_INSTRUCTION"'
    return command, {"POLAR_API_KEY": token, "CODEX_HOME": str(workspace / ".codex")}


def claude_code(proxy_url: str, token: str, model: str, workspace: Path):
    env = {"ANTHROPIC_MODEL": model,  # ANTHROPIC_BASE_URL and _API_KEY: every harness has them (shell)
           "ANTHROPIC_SMALL_FAST_MODEL": model, "CLAUDE_CONFIG_DIR": str(workspace / ".claude"),
           "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(CONTEXT_TOKENS),
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(OUTPUT_TOKENS),
           "IS_SANDBOX": "1",  # lets root skip permission prompts
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
    return 'claude -p --dangerously-skip-permissions "$POLAR_INSTRUCTION"', env


def opencode(proxy_url: str, token: str, model: str, workspace: Path):
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"polar": {
            "npm": "@ai-sdk/openai-compatible", "name": "polar-hpc proxy",
            "options": {"baseURL": f"{proxy_url}/v1", "apiKey": token},
            "models": {model: {"name": model}},
        }},
        "model": f"polar/{model}", "small_model": f"polar/{model}", "autoupdate": False,
        "share": "disabled", "permission": "allow",
    }
    _write(workspace, "opencode.json", json.dumps(config, indent=2))
    env = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}
    # --title: a given title spares the extra call that would name the session
    return 'opencode run --pure --auto --title polar < "$POLAR_INSTRUCTION_FILE"', env


def qwen_code(proxy_url: str, token: str, model: str, workspace: Path):
    settings = {
        "security": {"auth": {"selectedType": "openai"}}, "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
        "model": {"name": model, "generationConfig": {"contextWindowSize": CONTEXT_TOKENS}},
        "tools": {"approvalMode": "yolo"},
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False,
                   "enableAutoSkill": False},  # background agents: extra model calls
    }
    home = workspace / ".qwen"
    _write(workspace, ".qwen/settings.json", json.dumps(settings, indent=2))
    env = {"OPENAI_BASE_URL": f"{proxy_url}/v1", "OPENAI_API_KEY": token, "OPENAI_MODEL": model,
           "QWEN_HOME": str(home), "QWEN_CODE_MAX_OUTPUT_TOKENS": str(OUTPUT_TOKENS),
           "QWEN_TELEMETRY_ENABLED": "0", "QWEN_USAGE_STATISTICS_ENABLED": "0",
           "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}  # the polar sandbox is its sandbox
    return 'qwen --yolo -p "$POLAR_INSTRUCTION"', env


PRESETS: dict[str, Callable[[str, str, str, Path], tuple[str, dict[str, str]]]] = {
    "mini_swe_agent": mini_swe_agent, "codex": codex, "claude_code": claude_code,
    "opencode": opencode, "qwen_code": qwen_code,
}
