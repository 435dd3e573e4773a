"""The scripted policy: rule files, the built-in calculator rules, pseudo logprobs (in-process)."""

from __future__ import annotations

import json

import pytest

from polar_hpc.engines.scripted.chat_format import ChatFormat
from polar_hpc.engines.scripted.policy import Policy, Reply, logprobs
from polar_hpc.engines.scripted.model import SamplingParams, ScriptedModel
from polar_hpc.config import ConfigError

CALC = {"type": "function", "function": {"name": "calculator", "parameters": {}}}


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat()


def test_default_rules_calculator_flow(fmt):
    policy = Policy.load()
    ask = [{"role": "user", "content": "Please: What is 12 * (3 + 4)? Thanks"}]
    assert policy.reply(fmt.render(ask, [CALC])).text == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}'
        "\n</tool_call>"
    )
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "12 * (3 + 4)"}'}},
    ]}
    answered = [*ask, call, {"role": "tool", "tool_call_id": "c", "content": "84"}]
    assert policy.reply(fmt.render(answered, [CALC])).text == "The answer is 84."
    fallback = policy.reply(fmt.render(ask)).text  # no tools offered
    assert fallback and "tool_call" not in fallback
    later = [*answered, {"role": "assistant", "content": "The answer is 84."},
             {"role": "user", "content": "Thanks"}]
    assert policy.reply(fmt.render(later, [CALC])).text == fallback


def test_custom_rules_expand_groups(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("- when: 'name is (?P<who>\\w+)'\n  reply: 'Hi \\g<who>, \\1!'\n")
    policy = Policy.load(path)
    assert policy.reply("my name is Ada.") == Reply("Hi Ada, Ada!")
    assert policy.reply("nothing") == Reply("")


@pytest.mark.parametrize("text, expected", [
    ("- when: [unclosed", "invalid YAML"),
    ("{}", "expected a non-empty YAML list"),
    ("[]", "expected a non-empty YAML list"),
    ("- when: a\n  reply: b\n- just a string", "rule 1: expected a mapping"),
    ("- when: a\n  reply: b\n  weight: 2", "rule 0: unknown field 'weight'"),
    ("- reply: b", "rule 0: field 'when' must be a string"),
    ("- when: a\n  reply: 3", "rule 0: field 'reply' must be a string"),
    ("- when: '(a'\n  reply: b", "rule 0: field 'when': invalid regex"),
    ("- when: '(?P<x>a)'\n  reply: '\\g<y>'", "rule 0: field 'reply': \\g<y> names no group"),
    ("- when: '(a)'\n  reply: '\\2'", "rule 0: field 'reply': \\2 names no group"),
    ("- when: a\n  reply: b\n  pause_ms: 5", "rule 0: fields 'pause_after' and 'pause_ms' go together"),
    ("- when: a\n  reply: b\n  pause_after: ''\n  pause_ms: 5", "field 'pause_after' must be a non-empty"),
    ("- when: a\n  reply: b\n  pause_after: b\n  pause_ms: -1", "field 'pause_ms' must be an integer >= 0"),
    ("- when: a\n  reply: b\n  pause_after: b\n  pause_ms: 0.5", "field 'pause_ms' must be an integer >= 0"),
])
def test_bad_rule_files_name_file_rule_and_field(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Policy.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_pause_after_delays_the_tokens_after_it_and_the_log_records_their_times(tmp_path, fmt):
    rules, log = tmp_path / "rules.yaml", tmp_path / "samples.jsonl"
    rules.write_text("- when: ''\n  reply: 'first part|then the rest'\n  pause_after: '|'\n"
                     "  pause_ms: 400\n")
    policy = Policy.load(rules)
    assert policy.reply("x") == Reply("first part|then the rest", 11, 0.4)
    model = ScriptedModel(fmt, policy, weight_version="v0", context_length=512, model_name="m",
                          token_delay_ms=10, sample_log=log)
    gen = model.generate("/generate", "r1", fmt.encode("hi"), SamplingParams(None), 0.0)
    model.close()
    gaps = [b - a for a, b in zip(gen.times, gen.times[1:])]
    k = next(i for i, text in enumerate(gen.texts) if "|" in text)  # the token that ends the pause text
    assert gaps[k - 1] == pytest.approx(0.41) and all(g == pytest.approx(0.01) for g in gaps[: k - 1])
    assert all(g == pytest.approx(0.01) for g in gaps[k:])
    assert json.loads(log.read_text())["t"] == gen.times


def test_missing_rules_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read rules file"):
        Policy.load(tmp_path / "absent.yaml")


def test_logprobs_are_deterministic_bounded_and_prompt_dependent():
    a = logprobs([1, 2, 3], [10, 11, 10, 2])
    assert a == logprobs([1, 2, 3], [10, 11, 10, 2])
    assert len(a) == 4 and all(-5 <= x <= -0.01 for x in a)
    assert a[0] != a[2]  # same token, other position
    assert a != logprobs([1, 2, 4], [10, 11, 10, 2])
    assert logprobs([1, 2, 3], [10, 11]) == a[:2]
