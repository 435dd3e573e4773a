"""The tiny model (`polar_hpc.engines.tiny`): its build is deterministic, its Qwen3-style template
renders a conversation as a prefix of its continuation within one user query (and drops earlier
queries' reasoning, as Qwen3 does), and, served by the session's real vLLM, it solves the
calculator example's conversation at temperature 1: a calculator call, then 395."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from polar_hpc.engines.tiny import conversation as calc
from polar_hpc.engines.tiny.template import CHAT_TEMPLATE
from polar_hpc.engines.tiny.tokenizer import write_tokenizer
from vllm.conftest import vllm_python
from vllm.model import build, model_dir

pytestmark = pytest.mark.timeout(900)  # a build, or the session's vLLM start: minutes on a busy host
ROOT = Path(__file__).resolve().parents[2]


def call(i: int, expression: str) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}


# Two user queries; the first takes two tool steps, each reply with reasoning (in both of the
# forms harnesses send it back: a field, or a <think> block in the content).
SESSION = [
    {"role": "system", "content": calc.SYSTEM},
    {"role": "user", "content": "What is (2 + 3) * 4?"},
    {"role": "assistant", "content": "", "reasoning_content": "First 2 + 3.", "tool_calls": [call(1, "2 + 3")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "assistant", "content": "<think>\nNow 5 * 4.\n</think>\n\n", "tool_calls": [call(2, "5 * 4")]},
    {"role": "tool", "tool_call_id": "call_2", "content": "20"},
    {"role": "assistant", "content": "It is 20.", "reasoning": "Done."},
    {"role": "user", "content": "And plus one?"},
    {"role": "assistant", "content": "", "reasoning_content": "Add one.", "tool_calls": [call(3, "20 + 1")]},
    {"role": "tool", "tool_call_id": "call_3", "content": "21"},
    {"role": "assistant", "content": "21, with both tools and all."},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tokenizer(out, CHAT_TEMPLATE, ["<think>", "</think>"])
    return AutoTokenizer.from_pretrained(str(out))


def render(tokenizer, messages: list[dict], generation: bool, tools: list[dict] = calc.TOOLS) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation)


def test_template_extends_within_a_query_and_drops_earlier_reasoning(tokenizer):
    replies = [i for i, m in enumerate(SESSION) if m["role"] == "assistant"]
    second_query = SESSION.index({"role": "user", "content": "And plus one?"})
    for i in replies:
        before, through = render(tokenizer, SESSION[:i], True), render(tokenizer, SESSION[: i + 1], False)
        assert through.startswith(before), f"reply {i} does not extend its prompt"
        later = render(tokenizer, SESSION, False)
        assert later.startswith(through) == (i > second_query), f"reply {i} in the whole session"
    whole = render(tokenizer, SESSION, False)
    assert "First 2 + 3." not in whole and "Now 5 * 4." not in whole and "Done." not in whole
    assert "<think>\nAdd one.\n</think>\n\n<tool_call>\n" in whole
    first = render(tokenizer, SESSION[:7], False)  # before the second query: all reasoning kept
    for reasoning in ("First 2 + 3.", "Now 5 * 4.", "Done."):
        assert f"<think>\n{reasoning}\n</think>\n\n" in first
    assert '{"name": "calculator", "arguments": {"expression": "5 * 4"}}' in first


def test_template_renders_the_taught_conversation(tokenizer):
    """What the tiny model is taught is what the template renders for the harness's history (the
    calculator agent's, mini-swe-agent's: two calls each)."""
    lessons = calc.lessons()
    assert len(lessons) == 4
    for (asked, tools, call_reply), (answered, _, _) in zip(lessons[::2], lessons[1::2]):
        assert render(tokenizer, answered, False, tools).startswith(render(tokenizer, asked, True, tools) + call_reply)


def test_build_is_deterministic(tmp_path):
    vllm_python()  # skips (or fails under POLAR_REQUIRE_VLLM=1) without a vLLM venv
    cached = model_dir()
    build(tmp_path / "again")
    names = sorted(p.name for p in cached.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    for name in names:
        assert (tmp_path / "again" / name).read_bytes() == (cached / name).read_bytes(), name


def test_build_refuses_bad_use(tmp_path):
    python = vllm_python()
    usage = subprocess.run([str(python), "-m", "polar_hpc.engines.tiny"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert usage.returncode == 2 and "usage:" in usage.stderr and "Traceback" not in usage.stderr
    (tmp_path / "taken").mkdir()
    taken = subprocess.run([str(python), "-m", "polar_hpc.engines.tiny", str(tmp_path / "taken")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert taken.returncode == 2 and "exists" in taken.stderr and "Traceback" not in taken.stderr


def test_vllm_renders_as_transformers_does(vllm, tokenizer):
    """vLLM's prompt ids for the agent's first call are the main venv's rendering of it."""
    asked = calc.lessons()[0][0]
    answer = vllm.post("/v1/chat/completions", {"model": vllm.model, "messages": asked, "tools": calc.TOOLS,
                                                "max_tokens": 1, "return_token_ids": True})
    assert answer["prompt_token_ids"] == tokenizer.encode(render(tokenizer, asked, True), add_special_tokens=False)


def test_solves_the_calculator_at_temperature_1(vllm):
    """Eight samples of each of the agent's two calls, as the agent makes them (no temperature:
    the default 1), with vLLM's hermes tool parser: a calculator call with the expression, then 395."""
    asked = [{"role": "system", "content": calc.SYSTEM}, {"role": "user", "content": calc.QUESTION}]
    first = vllm.post("/v1/chat/completions", {"model": vllm.model, "messages": asked, "tools": calc.TOOLS,
                                               "n": 8, "logprobs": True})
    for choice in first["choices"]:
        calls = choice["message"]["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("calculator", {"expression": calc.EXPRESSION})], choice
        assert choice["finish_reason"] == "tool_calls"
        assert min(t["logprob"] for t in choice["logprobs"]["content"]) > -1e-3
    message = {k: v for k, v in first["choices"][0]["message"].items() if v is not None}
    history = [*asked, message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                 "content": calc.RESULT}]
    second = vllm.post("/v1/chat/completions", {"model": vllm.model, "messages": history, "tools": calc.TOOLS,
                                                "n": 8})
    for choice in second["choices"]:
        assert not choice["message"].get("tool_calls") and choice["finish_reason"] == "stop"
        assert choice["message"]["content"].endswith(calc.ANSWER), choice
