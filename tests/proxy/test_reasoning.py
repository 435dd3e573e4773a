"""Reasoning settings (Chat `reasoning_effort`, Responses `reasoning`, Anthropic `thinking`) reach the
chat template as the variables its source reads, through a real proxy to the scripted engine in each
capture mode; what the template cannot express is a 400 naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from polar_hpc import wire
from polar_hpc.engines.scripted.build_tokenizer import ASSET_DIR as ASSETS
from polar_hpc.proxy.calls import BadRequest, Reasoning
from polar_hpc.proxy.reasoning import template_kwargs

from proxy.helpers import start_proxy
from proxy.test_fields import MINIMAL, post, refused_in_shape

EFFORT = "{{ reasoning_effort }}"
SWITCH = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
BUDGET = "{{ thinking_budget }}"


@pytest.mark.parametrize("asked, template, kwargs", [
    (Reasoning("reasoning_effort", effort="high"), EFFORT, {"reasoning_effort": "high"}),
    (Reasoning("reasoning_effort", effort="none"), EFFORT + SWITCH,
     {"reasoning_effort": "none", "enable_thinking": False}),
    (Reasoning("reasoning.effort", effort="none"), SWITCH, {"enable_thinking": False}),
    (Reasoning("thinking", think=False), SWITCH, {"enable_thinking": False}),
    (Reasoning("thinking", think=False), "plain", {}),  # Anthropic's default: nothing to turn off
    (Reasoning("thinking", think=True, budget=2048), BUDGET + SWITCH,
     {"thinking_budget": 2048, "enable_thinking": True}),
    (None, EFFORT + SWITCH + BUDGET, {}),
])
def test_the_variables_the_template_reads(asked, template, kwargs):
    assert template_kwargs(asked, template) == kwargs


@pytest.mark.parametrize("asked, template, param, words", [
    (Reasoning("reasoning_effort", effort="high"), SWITCH, "reasoning_effort", "only thinking off"),
    (Reasoning("reasoning.effort", effort="low"), "plain", "reasoning.effort", "no reasoning setting"),
    (Reasoning("reasoning_effort", effort="none"), "plain", "reasoning_effort", "no reasoning setting"),
    (Reasoning("thinking", think=True, budget=2048), SWITCH, "thinking.budget_tokens", "no thinking budget"),
])
def test_what_the_template_cannot_express_is_refused(asked, template, param, words):
    with pytest.raises(BadRequest, match=words) as e:
        template_kwargs(asked, template)
    assert e.value.param == param


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> Path:
    """The scripted engine's tokenizer with a template that shows each reasoning variable it gets."""
    folder = tmp_path_factory.mktemp("thinking")
    shutil.copy(ASSETS / "tokenizer.json", folder)
    config = json.loads((ASSETS / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{%- if reasoning_effort is defined %}{{ '<|im_start|>system\\nReasoning: ' + reasoning_effort"
        " + '<|im_end|>\\n' }}{% endif %}"
        "{%- if thinking_budget is defined %}{{ '<|im_start|>system\\nBudget: ' + thinking_budget | string"
        " + '<|im_end|>\\n' }}{% endif %}"
        + config["chat_template"]
        + "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
          "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


ASKS = [  # (api, the field asked, the template variables it becomes, what the tito prompt shows)
    ("openai_chat", {"reasoning_effort": "high"}, {"reasoning_effort": "high"}, "Reasoning: high"),
    ("openai_responses", {"reasoning": {"effort": "none", "summary": "auto"}},
     {"reasoning_effort": "none", "enable_thinking": False}, "<think>\n\n</think>\n\n"),
    ("anthropic_messages", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}},
     {"thinking_budget": 2048, "enable_thinking": True}, "Budget: 2048"),
    ("anthropic_messages", {"thinking": {"type": "disabled"}}, {"enable_thinking": False}, "</think>"),
]


@pytest.mark.parametrize("mode", ["tito", "passthrough"])
def test_reasoning_reaches_a_template_that_reads_it(short_tmp, gateway, engine, thinking_model, mode):
    proxy = start_proxy(short_tmp, gateway, engine[0], mode=mode, tokenizer=str(thinking_model))
    tokenizer = Tokenizer.from_file(str(thinking_model / "tokenizer.json"))
    try:
        gateway.open("think", "think")
        for api, asked, kwargs, shown in ASKS:
            r = post(proxy, api, {**MINIMAL[api], **asked}, "think")
            assert r.status_code == 200, r.text
            record = gateway.expect(wire.CallRecord)
            assert record.meta["template_kwargs"] == kwargs, api
            if mode == "tito":  # the proxy rendered it: the prompt shows each variable
                prompt = tokenizer.decode(record.prompt_ids, skip_special_tokens=False)
                assert shown in prompt, (api, prompt)
        # an effort level the template has no variable for (it has reasoning_effort): still passed
        r = post(proxy, "openai_chat", {**MINIMAL["openai_chat"], "reasoning_effort": "minimal"}, "think")
        assert r.status_code == 200, r.text
        assert gateway.expect(wire.CallRecord).meta["template_kwargs"] == {"reasoning_effort": "minimal"}
    finally:
        proxy.stop()


REFUSED = [  # on the scripted engine's own template, which reads no reasoning variable
    ("openai_chat", {"reasoning_effort": "high"}, "reasoning_effort"),
    ("openai_responses", {"reasoning": {"effort": "low"}}, "reasoning.effort"),
    ("openai_responses", {"reasoning": {"summary": "detailed"}}, "reasoning"),
    ("anthropic_messages", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}},
     "thinking.budget_tokens"),
    ("anthropic_messages", {"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ("anthropic_messages", {"thinking": {"type": "adaptive", "display": "summarized"}}, "thinking"),
]


def test_a_template_without_reasoning_variables_refuses_them(proxy):
    proxy.gateway.open("plain", "plain")
    for api, asked, field in REFUSED:
        refused_in_shape(api, post(proxy, api, {**MINIMAL[api], **asked}, "plain"), field)
    # what asks for nothing: disabled thinking where there is no switch, adaptive, Responses' defaults
    for api, asked in [("anthropic_messages", {"thinking": {"type": "disabled"}}),
                       ("anthropic_messages", {"thinking": {"type": "adaptive", "display": "omitted"}}),
                       ("openai_responses", {"reasoning": {"summary": "auto", "context": "auto"}})]:
        r = post(proxy, api, {**MINIMAL[api], **asked}, "plain")
        assert r.status_code == 200, r.text
        assert "template_kwargs" not in proxy.gateway.expect(wire.CallRecord).meta
