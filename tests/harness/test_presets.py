"""Harness presets write the config each harness reads, pointed at the proxy with the token."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pydantic
import pytest
import yaml

from conftest import polar
from polar_hpc.config import Task
from polar_hpc.harness.presets import CONTEXT_TOKENS, PRESETS, launch

URL, TOKEN = "http://127.0.0.1:4321", "tok-abc"


def task(kind: str, **harness) -> Task:
    return Task(id="t", instruction="What is 1+1?", harness={"kind": kind, **harness})


def test_mini_swe_agent_config(tmp_path: Path):
    command, env = launch(task("mini_swe_agent"), URL, TOKEN, "s", tmp_path)
    config = yaml.safe_load((tmp_path / ".polar" / "mini.yaml").read_text())
    assert config["model"]["model_kwargs"] == {"api_base": URL + "/v1", "api_key": TOKEN, "drop_params": True}
    assert config["model"]["model_name"] == "openai/polar"
    assert command.startswith("mini -y --exit-immediately -c mini.yaml -c " + str(tmp_path))
    assert env["MSWEA_CONFIGURED"] == "true" and env["OPENAI_API_KEY"] == TOKEN


def test_codex_config_is_a_custom_responses_provider(tmp_path: Path):
    command, env = launch(task("codex", env={"POLAR_MODEL": "qwen"}), URL, TOKEN, "s", tmp_path)
    config = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    assert config["model"] == "qwen" and config["model_provider"] == "polar"
    provider = config["model_providers"]["polar"]
    assert provider["base_url"] == URL + "/v1" and provider["wire_api"] == "responses"
    assert env[provider["env_key"]] == TOKEN and env["CODEX_HOME"] == str(tmp_path / ".codex")
    assert command.startswith("codex exec")


def test_claude_code_env_is_offline_and_sized(tmp_path: Path):
    command, env = launch(task("claude_code"), URL, TOKEN, "s", tmp_path)
    assert env["ANTHROPIC_BASE_URL"] == URL and env["ANTHROPIC_API_KEY"] == TOKEN
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "polar"
    assert env["IS_SANDBOX"] == "1" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(CONTEXT_TOKENS)
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path / ".claude")
    assert command.startswith("claude -p --dangerously-skip-permissions")


def test_opencode_config_is_an_openai_compatible_provider(tmp_path: Path):
    command, env = launch(task("opencode", env={"POLAR_MODEL": "qwen"}), URL, TOKEN, "s", tmp_path)
    config = json.loads((tmp_path / "opencode.json").read_text())
    assert config["provider"]["polar"]["options"] == {"baseURL": URL + "/v1", "apiKey": TOKEN}
    assert config["model"] == config["small_model"] == "polar/qwen"
    assert config["permission"] == "allow" and config["autoupdate"] is False
    assert "--title" in command and command.endswith('< "$POLAR_INSTRUCTION_FILE"')
    assert env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"


def test_qwen_code_settings_and_overrides(tmp_path: Path):
    command, env = launch(task("qwen_code", command="qwen -p hi", env={"X": "1"}), URL, TOKEN, "s", tmp_path)
    settings = json.loads((tmp_path / ".qwen" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert settings["model"]["generationConfig"]["contextWindowSize"] == CONTEXT_TOKENS
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert env["QWEN_HOME"] == str(tmp_path / ".qwen") and env["OPENAI_BASE_URL"] == URL + "/v1"
    assert command == "qwen -p hi" and env["X"] == "1" and env["OPENAI_MODEL"] == "polar"
    assert set(PRESETS) == {"mini_swe_agent", "codex", "claude_code", "opencode", "qwen_code"}


def test_unknown_kind_is_refused_with_its_line(tmp_path: Path):
    bad = tmp_path / "task.yaml"
    bad.write_text("id: t\ninstruction: hi\nharness:\n  kind: aider\n")
    result = polar("run", bad, "--run-dir", tmp_path / "run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{bad}:4: harness.kind:" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", sorted(PRESETS))
def test_presets_need_no_command(kind: str, tmp_path: Path):
    """A preset task without `command` validates and runs the preset's own command line (its
    harness's program, pointed at the proxy); a shell task without one is refused."""
    command, env = launch(task(kind), URL, TOKEN, "s", tmp_path)
    program = {"mini_swe_agent": "mini ", "codex": "codex ", "claude_code": "claude ", "opencode": "opencode ",
               "qwen_code": "qwen "}[kind]
    assert command.startswith(program) and TOKEN in env.values(), (command, env)
    with pytest.raises(pydantic.ValidationError, match="command"):
        task("shell")
