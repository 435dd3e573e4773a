"""Reasoning settings and Responses logprobs on a real vLLM through a real proxy, in both capture
modes. The tiny model's template (Qwen3's layout) reads `enable_thinking` only: Anthropic's disabled
thinking closes an empty `<think>` block after the generation prompt (tito: the proxy renders it;
passthrough: vLLM, given `chat_template_kwargs`), and an effort level it cannot express is a 400.
A Responses call with `top_logprobs` gets vLLM's own alternatives in the `output_text` part."""

from __future__ import annotations

import anthropic
import openai
import pytest
from tokenizers import Tokenizer

from polar_hpc import wire
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import MODEL
from vllm.test_capture import proxy  # noqa: F401 (fixture: a proxy in each mode on the session's vLLM)

pytestmark = pytest.mark.timeout(900)
EMPTY_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_thinking_disabled_reaches_the_template_and_effort_levels_are_refused(vllm, proxy) -> None:  # noqa: F811
    tokenizer = Tokenizer.from_file(str(vllm.folder / "tokenizer.json"))
    claude = anthropic.Anthropic(base_url=proxy.url, api_key="tok", max_retries=0, timeout=300)
    claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
                           thinking={"type": "disabled"})
    record = proxy.gateway.expect(wire.CallRecord, timeout=120)
    assert record.meta["template_kwargs"] == {"enable_thinking": False}
    assert tokenizer.decode(record.prompt_ids, skip_special_tokens=False).endswith(EMPTY_THINKING)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                   reasoning_effort="none", temperature=0)
    record = proxy.gateway.expect(wire.CallRecord, timeout=120)
    assert tokenizer.decode(record.prompt_ids, skip_special_tokens=False).endswith(EMPTY_THINKING)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       reasoning_effort="high")
    assert e.value.body["param"] == "reasoning_effort" and "enable_thinking" in e.value.body["message"]


def test_responses_top_logprobs_are_vllms_own(vllm, proxy) -> None:  # noqa: F811
    client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)
    reply = client.responses.create(model=MODEL, input="Hi", max_output_tokens=8, temperature=0, top_logprobs=3,
                                    include=["message.output_text.logprobs"])
    record = proxy.gateway.expect(wire.CallRecord, timeout=120)
    entries = reply.output[0].content[0].logprobs
    assert [e.logprob for e in entries] == record.output_logprobs
    direct = vllm.post("/v1/completions", {
        "model": MODEL, "prompt": record.prompt_ids, "max_tokens": 8, "temperature": 0, "logprobs": 3,
        "return_token_ids": True})["choices"][0]
    assert record.output_ids == direct["token_ids"]
    for entry, alternatives in zip(entries, direct["logprobs"]["top_logprobs"]):
        want = sorted(alternatives.values(), reverse=True)[:3]
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx(want, abs=1e-4)
