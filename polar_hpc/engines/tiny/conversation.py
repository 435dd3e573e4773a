"""What the tiny model is taught: the calculator example's conversations (examples/calculator).

`lessons()` are (messages, tools, reply) triples: the conversation so far as the harness sends it
and the reply to teach, ending with the end token. Two harnesses ask the same question:
- the OpenAI-SDK agent (its system prompt and one `calculator` tool read from
  examples/calculator/agent.py in the checkout): first a short `<think>` and a calculator call with
  the expression, then, given the tool's result, a short `<think>` and the answer;
- mini-swe-agent (its `bash` tool, `MINI_TOOLS`, as mini-swe-agent 2.4.6 sends it; its prompts
  rendered from examples/calculator/mini.yaml, the short config the task gives it): a short
  `<think>` and `echo $((EXPR))`, then, given its observation of `395`, the answer and the
  command that submits.
Replies that call a tool carry no text besides the `<think>`, so that the template renders them
back as sampled (one trace per session).
"""

from __future__ import annotations

import ast
import json
from typing import Any
from pathlib import Path

import jinja2
import yaml

AGENT = Path(__file__).resolve().parents[3] / "examples" / "calculator" / "agent.py"
QUESTION = "What is 17 * 23 + 4?"
EXPRESSION = "17 * 23 + 4"
RESULT = "395"
MINI_CONFIG = AGENT.parent / "mini.yaml"
MINI_TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {
        "type": "string", "description": "The bash command to execute"}}, "required": ["command"]}}}]
MINI_COMMAND = f"echo $(({EXPRESSION}))"
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _agent_literals() -> tuple[str, list[dict]]:
    """The agent's system prompt and tools, read from its source (a checkout's), never copied."""
    tree = ast.parse(AGENT.read_text(encoding="utf-8"))
    tools = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                 if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "TOOLS" for t in n.targets))
    system = next(d for d in (ast.literal_eval(n) for n in ast.walk(tree) if isinstance(n, ast.Dict)
                              and all(isinstance(k, ast.Constant) for k in n.keys)
                              and all(isinstance(v, ast.Constant) for v in n.values))
                  if d.get("role") == "system")
    return system["content"], tools


SYSTEM, TOOLS = _agent_literals()
END = "<|im_end|>"
CALL_REASONING = "I will use the calculator."
ANSWER_REASONING = "The calculator says 395."
ANSWER = f"{EXPRESSION} = {RESULT}"


def _call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _called(reasoning: str, name: str, arguments: dict) -> dict:
    """The assistant turn as the harness sends it back: vLLM's parse of a `<think>` + call reply."""
    return {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _mini(template: str, **variables: Any) -> str:
    """A prompt as mini-swe-agent renders it (jinja, StrictUndefined)."""
    return jinja2.Template(template, undefined=jinja2.StrictUndefined).render(**variables)


def mini_lessons() -> list[tuple[list[dict], list[Any], str]]:
    config = yaml.safe_load(MINI_CONFIG.read_text(encoding="utf-8"))
    asked = [{"role": "system", "content": _mini(config["agent"]["system_template"])},
             {"role": "user", "content": _mini(config["agent"]["instance_template"], task=QUESTION)}]
    observed = _mini(config["model"]["observation_template"],
                     output={"output": f"{RESULT}\n", "returncode": 0, "exception_info": ""})
    command = {"command": MINI_COMMAND}
    answered = [*asked, _called(CALL_REASONING, "bash", command),
                {"role": "tool", "tool_call_id": "call_0", "content": observed}]
    return [
        (asked, MINI_TOOLS, f"<think>\n{CALL_REASONING}\n</think>\n\n{_call('bash', command)}{END}"),
        (answered, MINI_TOOLS, f"{ANSWER}\n{_call('bash', {'command': MINI_SUBMIT})}{END}"),
    ]


def lessons() -> list[tuple[list[dict], list[Any], str]]:
    asked: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    called = _called(CALL_REASONING, "calculator", {"expression": EXPRESSION})
    answered = [*asked, called, {"role": "tool", "tool_call_id": "call_0", "content": RESULT}]
    return [
        (asked, TOOLS, f"<think>\n{CALL_REASONING}\n</think>\n\n{_call('calculator', {'expression': EXPRESSION})}{END}"),
        (answered, TOOLS, f"<think>\n{ANSWER_REASONING}\n</think>\n\n{ANSWER}{END}"),
        *mini_lessons(),
    ]
