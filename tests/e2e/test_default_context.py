"""The scripted engine's default context fits what real harnesses ask: a long prompt (their own
instructions and tool schemas) and a 16k-token reply budget (pi asks 16384 new tokens). A request
beyond it is refused with a 400 that names the limit and both counts."""

from __future__ import annotations

from pathlib import Path

from conftest import polar
from tests.e2e.helpers import trajectories, write_jsonl

ASK = ("import openai, sys\n"
       "try:\n"
       "    openai.OpenAI().chat.completions.create(model='m', max_tokens=int(sys.argv[1]),\n"
       "        messages=[{'role': 'system', 'content': 'tool schema ' * 6000}, {'role': 'user', 'content': 'hi'}])\n"
       "    open('out.txt', 'w').write('ok')\n"
       "except openai.BadRequestError as e:\n"
       "    open('out.txt', 'w').write(f'{e.status_code} {e.message}')\n")


def test_default_context_fits_a_16k_reply_and_refuses_beyond_it_clearly(tmp_path: Path) -> None:
    (tmp_path / "ask.py").write_text(ASK)
    def task(name: str, max_tokens: int, expect: str) -> dict:
        return {"id": name, "instruction": "hi", "harness": {"command": f"python ask.py {max_tokens}"},
                "sandbox": {"files": {"ask.py": "ask.py"}},
                "evaluator": {"kind": "command", "command": f"grep -q '{expect}' out.txt && cat out.txt"}}
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [
        task("pi-sized", 16384, "^ok$"),
        task("too-long", 70000, "^400 .*maximum context length of 65536 tokens: [0-9]* tokens of input and 70000"),
    ])
    out = polar("run", tasks, "--run-dir", tmp_path / "run", timeout=300)
    assert out.returncode == 0, out.stderr
    got = {t.task_id: t for t in trajectories(tmp_path / "run")}
    assert {k: (t.status, t.reward) for k, t in got.items()} == {
        "pi-sized": ("completed", 1.0), "too-long": ("completed", 1.0)}
