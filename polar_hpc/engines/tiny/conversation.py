"""What the tiny model is taught: the calculator example's conversation (examples/calculator).

`lessons()` are (messages, tools, reply) triples: the conversation so far as the agent sends it
(its system prompt and its one `calculator` tool, read from examples/calculator/agent.py in the
checkout, the task's question, then its own earlier turns) and the reply to teach, ending with the
end token: first a short `<think>` and a calculator call
with the expression, then, given the tool's result, a short `<think>` and the answer.
"""

from __future__ import annotations

import ast
import json
from typing import Any
from pathlib import Path

AGENT = Path(__file__).resolve().parents[3] / "examples" / "calculator" / "agent.py"
QUESTION = "What is 17 * 23 + 4?"
EXPRESSION = "17 * 23 + 4"
RESULT = "395"


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


def _call_reply() -> str:
    call = json.dumps({"name": "calculator", "arguments": {"expression": EXPRESSION}})
    return f"<think>\n{CALL_REASONING}\n</think>\n\n<tool_call>\n{call}\n</tool_call>{END}"


def lessons() -> list[tuple[list[dict], list[Any], str]]:
    asked: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    called = {
        "role": "assistant", "content": "", "reasoning_content": CALL_REASONING,
        "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "calculator", "arguments": json.dumps({"expression": EXPRESSION})}}],
    }
    answered = [*asked, called, {"role": "tool", "tool_call_id": "call_0", "content": RESULT}]
    return [
        (asked, TOOLS, _call_reply()),
        (answered, TOOLS, f"<think>\n{ANSWER_REASONING}\n</think>\n\n{ANSWER}{END}"),
    ]
