"""A shell harness is given both APIs: OPENAI_* (base URL ending in /v1) and ANTHROPIC_* (the
proxy's root), the same session token as key. Unmodified SDK programs that read only their own
variables reach the proxy through a real run."""

from __future__ import annotations

from pathlib import Path

from conftest import polar
from polar_hpc.harness.shell import environment
from tests.e2e.helpers import trajectories, write_jsonl

OPENAI = ("import openai; r = openai.OpenAI().chat.completions.create(model='m', "
          "messages=[{'role': 'user', 'content': 'hi'}], max_tokens=8); open('out.txt', 'w').write('ok')")
ANTHROPIC = ("import anthropic; r = anthropic.Anthropic().messages.create(model='m', max_tokens=8, "
             "messages=[{'role': 'user', 'content': 'hi'}]); open('out.txt', 'w').write('ok')")


def test_environment_names_both_apis(tmp_path: Path) -> None:
    from polar_hpc.config import Task

    task = Task(id="t", instruction="hi", harness={"command": "true", "env": {"ANTHROPIC_API_KEY": "mine"}})
    env = environment(task, "http://127.0.0.1:9", "tok", "t#0.0", tmp_path)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1" and env["OPENAI_API_KEY"] == "tok"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert env["ANTHROPIC_API_KEY"] == "mine"  # harness.env is applied last


def test_openai_and_anthropic_sdks_reach_the_proxy_from_a_shell_harness(tmp_path: Path) -> None:
    evaluator = {"kind": "command", "command": "test -s out.txt"}
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [
        {"id": f"sdk-{name}", "instruction": "hi", "harness": {"command": f'python -c "{code}"'}, "evaluator": evaluator}
        for name, code in (("openai", OPENAI), ("anthropic", ANTHROPIC))
    ])
    run_dir = tmp_path / "run"
    out = polar("run", tasks, "--run-dir", run_dir, timeout=300)
    assert out.returncode == 0, out.stderr
    got = {t.task_id: t for t in trajectories(run_dir)}
    assert set(got) == {"sdk-openai", "sdk-anthropic"}
    for t in got.values():
        assert (t.status, t.reward) == ("completed", 1.0), (t.task_id, t.status)
        assert t.traces, t.task_id
