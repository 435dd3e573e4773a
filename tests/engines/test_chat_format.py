"""The scripted tokenizer assets, the ChatML template and tool-call parsing (in-process)."""

from __future__ import annotations

import json

import pytest

from polar_hpc.engines.scripted import build_tokenizer
from polar_hpc.engines.scripted.chat_format import ASSET_DIR, ChatFormat
from polar_hpc.proxy.tool_parsers import parse_tool_calls

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Évalue une expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat()


def test_build_is_deterministic_and_committed(tmp_path):
    build_tokenizer.build(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (ASSET_DIR / name).read_bytes(), name


def test_special_and_added_token_ids(fmt):
    ids = {t: fmt.tokenizer.token_to_id(t) for t in build_tokenizer.SPECIAL_TOKENS}
    assert ids == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    tool_ids = [fmt.tokenizer.token_to_id(t) for t in build_tokenizer.TOOL_TOKENS]
    assert tool_ids == [4092, 4093, 4094, 4095]
    assert fmt.vocab_size == 4096 and fmt.im_end_id == 2 and fmt.eos_ids == {0, 2}
    assert fmt.special_ids == {0, 1, 2}
    config = json.loads((ASSET_DIR / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["added_tokens_decoder"]["4092"]["special"] is False
    assert config["added_tokens_decoder"]["2"]["special"] is True


def test_encode_decode_roundtrip_keeps_added_tokens(fmt):
    text = '<tool_call>\n{"name": "x", "arguments": {"q": "héllo 😀"}}\n</tool_call><|im_end|>'
    ids = fmt.encode(text)
    assert ids[0] == 4092 and ids[-2:] == [4093, 2]
    assert fmt.decode(ids) == text
    assert fmt.decode(ids, skip_special_tokens=True) == text.removesuffix("<|im_end|>")
    assert b"".join(fmt.token_bytes(i) for i in ids) == text.encode()


def test_render_tools_messages_and_parts(fmt):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is "}, {"type": "text", "text": "1 + 1?"},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function",
             "function": {"name": "calculator", "arguments": '{"expression":"1+1"}'}},
            {"id": "b", "type": "function",
             "function": {"name": "calculator", "arguments": {"expression": "2"}}},
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "2"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]
    text = fmt.render(messages, [CALC])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    # tools keep their key order and non-ASCII text
    assert "\n" + json.dumps(CALC, ensure_ascii=False) + "\n</tools>" in text
    assert "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n" in text
    assert (
        '<|im_start|>assistant\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression":"1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2"}}\n</tool_call>'
        "<|im_end|>\n"
    ) in text
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    plain = fmt.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_parse_tool_calls():
    call = '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>'
    assert parse_tool_calls(call) == (None, [{"name": "calc", "arguments": '{"x": 1}'}])
    assert parse_tool_calls("Sure.\n" + call + "\n" + call) == (
        "Sure.", [{"name": "calc", "arguments": '{"x": 1}'}] * 2
    )
    string_args = '<tool_call>{"name": "c", "arguments": "{\\"y\\": 2}"}</tool_call>'
    assert parse_tool_calls(string_args) == (None, [{"name": "c", "arguments": '{"y": 2}'}])
    for text in ("none", "<tool_call>\nnot json\n</tool_call>", '<tool_call>{"x": 1}</tool_call>'):
        assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize("reply", [
    "The answer is 5.",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
    'Let me see.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "7"}}\n</tool_call>',
    '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
    '<tool_call>\n{"name": "b", "arguments": {"k": "ü"}}\n</tool_call>',
])
def test_prefix_extension_invariant(fmt, reply):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 2 + 3?"}]
    prompt_ids = fmt.encode(fmt.render(messages, [CALC]))
    sampled = fmt.encode(reply) + [fmt.im_end_id]
    content, calls = parse_tool_calls(reply)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": c} for i, c in enumerate(calls)
        ]
    follow = {"role": "tool", "tool_call_id": "c0", "content": "5"} if calls else {
        "role": "user", "content": "Thanks!"
    }
    next_ids = fmt.encode(fmt.render([*messages, message, follow], [CALC]))
    assert next_ids[: len(prompt_ids) + len(sampled)] == prompt_ids + sampled
