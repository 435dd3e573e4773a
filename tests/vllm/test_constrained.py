"""Constrained decoding and sampling controls on a real vLLM through a real proxy: `tool_choice:
required` yields a tool call, a `json_schema` answer parses and validates (both capture modes); in
tito the same seed samples the same ids, and a constrained call's recorded ids and logprobs are
exactly vLLM's own under the same constraint (its forced tokens at logprob 0.0: the constrained
distribution's), with the call marked constrained. The dev model's weights are random: the
constraint, not the model, makes the reply well-formed."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from polar_hpc import wire
from polar_hpc.proxy.calls import Call
from polar_hpc.proxy.constraints import constraint
from polar_hpc.proxy.tool_parsers import parser_for
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import MODEL
from vllm.test_capture import ASK, proxy  # noqa: F401 (fixture: a proxy in each mode on the session's vLLM)

pytestmark = pytest.mark.timeout(900)
MAX = 120
# bounded values, no extra keys: the random model cannot run a value on past MAX tokens
PICK = {"name": "pick", "description": "Pick an operation.", "parameters": {
    "type": "object", "properties": {"op": {"enum": ["add", "sub"]}}, "required": ["op"],
    "additionalProperties": False}}
TOOLS = [{"type": "function", "function": PICK}]
ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}


def client(proxy) -> openai.OpenAI:  # noqa: F811
    return openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=300)


def test_tool_choice_required_yields_a_tool_call(vllm, proxy) -> None:  # noqa: F811
    reply = client(proxy).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                  max_tokens=MAX, temperature=0)
    record = proxy.gateway.expect(wire.CallRecord, timeout=120)
    calls = reply.choices[0].message.tool_calls
    if proxy.mode == "passthrough" and reply.choices[0].finish_reason == "length":
        pass  # vLLM's own chat route (a JSON array, any whitespace) may let the random model run out
    else:
        assert calls and all(c.function.name == "pick" for c in calls), reply
        for c in calls:
            jsonschema.validate(json.loads(c.function.arguments), PICK["parameters"])
    assert record.meta["constrained"]["reasons"] == ["tool_choice required"]
    assert record.meta["constrained"]["by"] == ("structural_tag" if proxy.mode == "tito" else "engine chat route")


def test_a_json_schema_answer_parses_and_validates(vllm, proxy) -> None:  # noqa: F811
    # JSON allows whitespace between any two tokens, which the random model would fill MAX with:
    # its whitespace tokens are biased away (a logit_bias, itself honoured by the engine)
    tokenizer = Tokenizer.from_file(str(vllm.folder / "tokenizer.json"))
    texts = {i: tokenizer.decode([i]) for i in range(tokenizer.get_vocab_size())}
    spaces = {str(i): -100 for i, text in texts.items() if text and not text.strip()}
    reply = client(proxy).chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=MAX, temperature=0, logit_bias=spaces,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}})
    record = proxy.gateway.expect(wire.CallRecord, timeout=120)
    jsonschema.validate(json.loads(reply.choices[0].message.content), ANSWER)
    assert record.meta["constrained"]["reasons"] == ["response_format json_schema"]


def test_the_same_seed_samples_the_same_ids(vllm, proxy) -> None:  # noqa: F811
    if proxy.mode != "tito":
        pytest.skip("tito: the proxy sends the seed to vLLM itself")
    ids = []
    for seed in (1234, 1234):
        client(proxy).chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, temperature=1.0, seed=seed)
        record = proxy.gateway.expect(wire.CallRecord, timeout=120)
        assert record.meta["sampling"]["seed"] == seed
        ids.append(record.output_ids)
    assert ids[0] == ids[1] and ids[0]


def test_constrained_logprobs_are_vllms_own_under_the_constraint(vllm, proxy) -> None:  # noqa: F811
    if proxy.mode != "tito":
        pytest.skip("tito: the proxy's own constraint, asked of vLLM again directly")
    client(proxy).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                          max_tokens=MAX, temperature=0)
    record = proxy.gateway.expect(wire.CallRecord, timeout=120)
    spec = constraint(Call(ASK, TOOLS, tool_choice="required"), parser_for("hermes", None))
    assert spec is not None
    direct = vllm.post("/v1/completions", {
        "model": MODEL, "prompt": record.prompt_ids, "max_tokens": MAX, "temperature": 0, "logprobs": 0,
        "return_token_ids": True, "structured_outputs": {"structural_tag": spec.spec}})["choices"][0]
    assert record.output_ids == direct["token_ids"]
    assert record.output_logprobs == direct["logprobs"]["token_logprobs"]
    assert record.output_logprobs[0] == 0.0  # `<tool_call>` was forced: certain under the constraint
    assert record.meta["constrained"] == {"reasons": ["tool_choice required"], "by": "structural_tag"}


def test_n_2_gives_two_captured_samples(vllm, proxy) -> None:  # noqa: F811
    if proxy.mode != "tito":
        pytest.skip("passthrough refuses n > 1")
    reply = client(proxy).chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, temperature=1.0,
                                                  seed=99, n=2)
    assert len(reply.choices) == 2
    records = sorted((proxy.gateway.expect(wire.CallRecord, timeout=120) for _ in range(2)),
                     key=lambda r: r.meta["choice"])
    for i, record in enumerate(records):  # each choice is vLLM's own sample for its seed
        direct = vllm.post("/v1/completions", {
            "model": MODEL, "prompt": record.prompt_ids, "max_tokens": 16, "temperature": 1.0, "seed": 99 + i,
            "logprobs": 0, "return_token_ids": True})["choices"][0]
        assert record.output_ids == direct["token_ids"]
        assert record.output_logprobs == direct["logprobs"]["token_logprobs"]
        assert record.meta["sampling"]["seed"] == 99 + i
    assert records[0].meta["rid"] != records[1].meta["rid"]  # two requests (the dev model may say the same)
