"""A small tool-using agent: the official OpenAI SDK, one `calculator` tool, a loop until an answer.

It knows nothing of polar-hpc: it reads OPENAI_BASE_URL / OPENAI_API_KEY like any OpenAI program
and its instruction from POLAR_INSTRUCTION. It prints the final answer.
"""

import ast
import json
import operator
import os

try:
    from openai import OpenAI
except ImportError:  # a plain `pip install polar-hpc`: the session fails with this in its log
    raise SystemExit("the calculator example needs the openai package: pip install 'polar-hpc[examples]'") from None

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

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.Pow: operator.pow, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression: {expression}")

    value = ev(ast.parse(expression, mode="eval").body)
    return str(int(value) if float(value).is_integer() else value)


def main() -> None:
    client = OpenAI()
    messages = [
        {"role": "system", "content": "You are a careful assistant. Use the calculator for arithmetic."},
        {"role": "user", "content": os.environ["POLAR_INSTRUCTION"]},
    ]
    for _ in range(8):
        reply = client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(message.content)
            return
        for call in message.tool_calls:
            result = calculate(json.loads(call.function.arguments)["expression"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise SystemExit("no final answer after 8 turns")


if __name__ == "__main__":
    main()
