"""What the tiny model is taught: the calculator example's conversation (examples/calculator).

`lessons()` are (messages, tools, reply) triples: the conversation so far as the agent sends it
(its system prompt, its one `calculator` tool, the task's question, then its own earlier turns)
and the reply to teach, ending with the end token: first a short `<think>` and a calculator call
with the expression, then, given the tool's result, a short `<think>` and the answer.
"""

from __future__ import annotations

import json

SYSTEM = "You are a careful assistant. Use the calculator for arithmetic."
QUESTION = "What is 17 * 23 + 4?"
EXPRESSION = "17 * 23 + 4"
RESULT = "395"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
END = "<|im_end|>"
CALL_REASONING = "I will use the calculator."
ANSWER_REASONING = "The calculator says 395."
ANSWER = f"{EXPRESSION} = {RESULT}"


def _call_reply() -> str:
    call = json.dumps({"name": "calculator", "arguments": {"expression": EXPRESSION}})
    return f"<think>\n{CALL_REASONING}\n</think>\n\n<tool_call>\n{call}\n</tool_call>{END}"


def lessons() -> list[tuple[list[dict], list[dict], str]]:
    asked = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
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
