"""What the proxy's vLLM route (tito, /inference/v1/generate) samples with, against vLLM's own
/v1/completions for the same prompt ids and seed.

- Defaults: a call that leaves temperature, top_p, top_k... unset samples with the model's
  generation config as vLLM's OpenAI routes apply it (`launch.LAUNCH`'s /polar/sampling_defaults),
  not with `SamplingParams`' neutral defaults, which /inference/v1/generate alone would use; one
  without a token limit samples at most the generation config's `max_new_tokens`, as they do.
- Alternatives: `top_logprobs` K asks vLLM for K + 1 (it lists the sampled token first) and the
  proxy answers the K most likely, most likely first, also where the sampled token is not among them.
"""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from polar_hpc import wire
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import MODEL, start_proxy
from vllm.conftest import start_vllm

pytestmark = pytest.mark.timeout(900)
GENERATION = {"temperature": 2.0, "top_k": 4}  # the copy's generation_config.json: flat, observable
LIMIT = 6  # the copy's max_new_tokens: what a call without max_tokens samples at most
MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]
TOKENS, SEED, K = 24, 7, 3


def _call(proxy, max_tokens=TOKENS, **extra) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=max_tokens, seed=SEED, **extra)


def _direct(server, prompt_ids: list[int], **extra) -> dict:
    return server.post("/v1/completions", {"model": MODEL, "prompt": prompt_ids, "max_tokens": TOKENS, "seed": SEED,
                                           "return_token_ids": True, **extra})["choices"][0]


def test_unset_sampling_parameters_are_the_models_generation_config(vllm, short_tmp, gateway, tmp_path) -> None:  # noqa: F811
    folder = tmp_path / "model"
    shutil.copytree(vllm.folder, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **GENERATION, "max_new_tokens": LIMIT}))
    server = start_vllm(tmp_path, "generation", weights=folder)
    try:
        proxy = start_proxy(short_tmp, gateway, server.url, mode="tito", engine_kind="vllm")
        gateway.send(wire.Engines(urls=[server.url], versions={server.url: "v1"}))
        gateway.open("s", "tok")
        try:
            assert server.get("/polar/sampling_defaults") == {**GENERATION, "max_tokens": LIMIT}
            _call(proxy)
            record = gateway.expect(wire.CallRecord, timeout=300)
            own = _direct(server, record.prompt_ids, logprobs=0)  # vLLM applies the generation config itself
            assert record.output_ids == own["token_ids"]
            assert record.output_logprobs == pytest.approx(own["logprobs"]["token_logprobs"], abs=1e-4)
            neutral = _direct(server, record.prompt_ids, logprobs=0, temperature=1.0, top_k=0)  # SamplingParams'
            assert (record.output_ids, pytest.approx(record.output_logprobs, abs=1e-4)) != (
                neutral["token_ids"], neutral["logprobs"]["token_logprobs"])
            assert record.meta["sampling"] == {"max_tokens": TOKENS, "seed": SEED, **GENERATION}
            _call(proxy, max_tokens=openai.NOT_GIVEN)  # no limit: the generation config's, as vLLM's chat route
            record = gateway.expect(wire.CallRecord, timeout=300)
            chat = server.post("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "seed": SEED})
            assert len(record.output_ids) == chat["usage"]["completion_tokens"] == LIMIT
            assert record.output_ids == _direct(server, record.prompt_ids, logprobs=0)["token_ids"][:LIMIT]
            assert record.meta["sampling"] == {"max_tokens": LIMIT, "seed": SEED, **GENERATION}
        finally:
            proxy.stop()
    finally:
        server.stop()


def test_top_logprobs_are_the_k_most_likely_also_where_the_sampled_token_is_not(vllm, short_tmp, gateway) -> None:  # noqa: F811
    proxy = start_proxy(short_tmp, gateway, vllm.url, mode="tito", engine_kind="vllm")
    gateway.send(wire.Engines(urls=[vllm.url], versions={vllm.url: "v1"}))
    gateway.open("s", "tok")
    try:
        answer = _call(proxy, temperature=GENERATION["temperature"], logprobs=True,
                       top_logprobs=K)
        record = gateway.expect(wire.CallRecord, timeout=300)
        own = _direct(vllm, record.prompt_ids, temperature=GENERATION["temperature"], logprobs=K)
        assert record.output_ids == own["token_ids"]
        entries = answer.choices[0].logprobs.content
        assert len(entries) == len(own["token_ids"])
        outside = 0
        logprobs = own["logprobs"]
        for entry, sampled, alternatives in zip(entries, logprobs["token_logprobs"], logprobs["top_logprobs"]):
            got = [a.logprob for a in entry.top_logprobs]
            want = sorted(alternatives.values(), reverse=True)[:K]  # vLLM adds the sampled token when not in its K
            assert len(got) == K and got == sorted(got, reverse=True)
            assert got == pytest.approx(want, abs=1e-4)
            outside += sampled < want[-1] - 1e-6
        assert outside, "no position where the sampled token is outside the top K: the test would not catch K for K + 1"
    finally:
        proxy.stop()
