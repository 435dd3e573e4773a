"""The engine clients (`engines.capture`): SGLang's cumulative events and vLLM's delta events read
into the same `Sampled`, however the stream is cut; malformed answers are `BadAnswer`, never a
crash or a silently short record. (Against real engines: tests/proxy with the scripted engine,
tests/vllm with vLLM.)"""

from __future__ import annotations

import asyncio

import pytest

from polar_hpc.config import ConfigError
from polar_hpc.engines import kinds
from polar_hpc.engines.capture import BadAnswer, Constraint, Sampled, Sampling

SGLANG, VLLM = kinds.get("sglang").client, kinds.get("vllm").client
IDS, LOGPROBS, TEXTS = [5, 7, 2], [-0.5, -1.25, -0.125], ["a", "bc", ""]


def _sglang_events(n: int) -> list[dict]:
    """The cumulative events of SGLang's stream after each of the first n tokens."""
    return [{"text": "".join(TEXTS[:k]), "meta_info": {
        "output_token_logprobs": [[lp, i, None] for lp, i in zip(LOGPROBS[:k], IDS[:k])], "weight_version": "w3",
        "finish_reason": {"type": "stop", "matched": 2} if k == len(IDS) else None, "id": "r"}}
        for k in range(1, n + 1)]


def _vllm_events(cuts: list[int]) -> list[dict]:
    """vLLM's delta events (/inference/v1/generate), cut before the ids at `cuts`, then its usage event."""
    bounds = [0, *cuts, len(IDS)]
    events = [{"request_id": "r", "prompt_token_ids": [1, 2] if a == 0 else None, "choices": [{
        "text": "".join(TEXTS[a:b]), "token_ids": IDS[a:b], "logprobs": {"content": [{"logprob": lp} for lp in LOGPROBS[a:b]]},
        "finish_reason": "stop" if b == len(IDS) else None, "stop_reason": None}]} for a, b in zip(bounds, bounds[1:])]
    return [*events, {"request_id": "r", "choices": [], "usage": {"prompt_tokens": 2}}]


def _read(client, events: list[dict]) -> tuple[str, Sampled]:
    g = client.Generation()
    text = "".join(g.feed(e) for e in events)
    return text, g.result()


@pytest.mark.parametrize("cuts", [[], [1], [2], [1, 2]])
def test_both_engines_read_into_the_same_record_however_cut(cuts) -> None:
    text, v = _read(VLLM, _vllm_events(cuts))
    s_text, s = _read(SGLANG, _sglang_events(len(IDS)))
    assert text == s_text == "abc"
    assert (v.ids, v.logprobs, v.finish) == (s.ids, s.logprobs, s.finish) == (IDS, LOGPROBS, "stop")
    assert (v.weight_version, s.weight_version) == (None, "w3")  # vLLM's is the proxy's to stamp
    assert v.prompt_ids == [1, 2] and s.matched_stop == 2


def test_sglang_tokens_carry_the_version_of_the_event_that_brought_them() -> None:
    events = _sglang_events(len(IDS))
    events[2]["meta_info"]["weight_version"] = "w4"  # the last token was sampled after an update
    _, s = _read(SGLANG, events)
    assert s.token_versions == ["w3", "w3", "w4"] and s.weight_version == "w4"
    events = _sglang_events(len(IDS))
    _, s = _read(SGLANG, events[1:])  # one version only: none listed (all are weight_version)
    assert s.token_versions is None and s.weight_version == "w3"
    _, s = _read(SGLANG, [events[0], {**events[2], "meta_info": {**events[2]["meta_info"], "weight_version": "w4"}}])
    assert s.token_versions == ["w3", "w4", "w4"]  # an event that brings two tokens stamps both
    assert SGLANG.VERSIONED_EVENTS and not VLLM.VERSIONED_EVENTS  # the proxy streams from SGLang for them


def test_requests_carry_what_capture_needs() -> None:
    path, body = VLLM.generate([1, 2], Sampling(9, 0.5, None, ("x",)), True, "r1")
    params = body["sampling_params"]
    assert path == "/inference/v1/generate" and body["token_ids"] == [1, 2] and params["logprobs"] == 0
    assert body["return_token_ids"] and body["stream"] and params["stop"] == ["x"] and "top_p" not in params
    path, body = SGLANG.generate([1, 2], Sampling(9), False, "r1")
    assert path == "/generate" and body["input_ids"] == [1, 2] and body["return_logprob"]
    for client in (SGLANG, VLLM):
        path, body = client.chat({"messages": [], "stream": True})
        assert path == "/v1/chat/completions" and body["return_token_ids"] and body["logprobs"] and not body["stream"]


@pytest.mark.parametrize("event", [
    {"choices": [{"token_ids": [1, "x"], "finish_reason": "stop"}]},
    {"choices": [{"token_ids": [1], "logprobs": {"content": [{"logprob": None}]}, "finish_reason": "stop"}]},
    {"choices": "no"}, {"nothing": 1}, {"choices": [{"text": 5, "finish_reason": "stop"}]},
])
def test_malformed_vllm_events_are_bad_answers(event) -> None:
    with pytest.raises(BadAnswer):
        _read(VLLM, [event])


@pytest.mark.parametrize("events", [
    [],  # nothing
    [{"choices": [{"token_ids": [1], "logprobs": {"content": [{"logprob": -1.0}]}}]}],  # never finished
    [{"choices": [{"token_ids": [1, 2], "logprobs": {"content": [{"logprob": -1.0}]}, "finish_reason": "stop"}]}],
])
def test_a_vllm_answer_short_of_logprobs_or_unfinished_is_bad(events) -> None:
    with pytest.raises(BadAnswer):
        _read(VLLM, events)


@pytest.mark.parametrize("answer", [
    {}, {"choices": []}, {"id": "x", "prompt_token_ids": [1], "choices": [{"message": {}, "token_ids": [1, 2],
     "logprobs": {"content": [{"logprob": -1.0}]}, "finish_reason": "stop"}]},
])
def test_malformed_chat_answers_are_bad(answer) -> None:
    for client in (SGLANG, VLLM):
        with pytest.raises(BadAnswer):
            client.chat_answer(answer)


def test_an_abort_is_reported_as_such() -> None:
    event = {"choices": [{"token_ids": [], "logprobs": None, "finish_reason": "abort"}]}
    assert _read(VLLM, [event])[1].finish == "abort"
    usage = {"request_id": "r", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 0}}
    assert _read(VLLM, [usage])[1].finish == "abort"  # vLLM streams no choice for a call aborted before a token
    with pytest.raises(BadAnswer):  # tokens counted but none seen: a broken stream, not an abort
        _read(VLLM, [{**usage, "usage": {"prompt_tokens": 2, "completion_tokens": 3}}])
    meta = {"output_token_logprobs": [], "finish_reason": {"type": "abort", "message": "update"}}
    assert _read(SGLANG, [{"text": "", "meta_info": meta}])[1].message == "update"
    with pytest.raises(ConfigError, match="not known"):
        kinds.get("tgi")


def test_sampling_controls_constraint_and_alternatives_go_in_each_engines_own_fields() -> None:
    controls = {"seed": 7, "top_k": 5, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
                "repetition_penalty": 1.1, "logit_bias": {"42": -100}}
    schema = '{"type": "object"}'
    sampling = Sampling(9, 0.5, 0.9, ("x",), controls, 3, Constraint("json_schema", schema))
    _, body = SGLANG.generate([1, 2], sampling, False, "r1")
    params = body["sampling_params"]
    assert params["sampling_seed"] == 7 and "seed" not in params  # SGLang's name
    assert {k: params[k] for k in controls if k != "seed"} == {k: v for k, v in controls.items() if k != "seed"}
    assert params["json_schema"] == schema and body["top_logprobs_num"] == 3 and body["return_text_in_logprobs"]
    params = VLLM.generate([1, 2], sampling, False, "r1")[1]["sampling_params"]
    assert {k: params[k] for k in controls} == controls
    assert params["structured_outputs"] == {"json": {"type": "object"}}
    assert params["logprobs"] == 4  # K + 1: vLLM lists the sampled token first, then the K most likely
    tag = Constraint("structural_tag", '{"type": "structural_tag", "format": {"type": "any_text"}}')
    _, body = VLLM.generate([1], Sampling(4, constraint=tag), False, "r")
    assert body["sampling_params"]["structured_outputs"] == {"structural_tag": tag.spec}
    _, body = SGLANG.generate([1], Sampling(4, constraint=tag), False, "r")
    assert body["sampling_params"]["structural_tag"] == tag.spec and "top_logprobs_num" not in body
    assert sampling.record() == {"max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "stop": ["x"], **controls,
                                 "top_logprobs": 3}


def test_both_engines_alternatives_are_read() -> None:
    events = _sglang_events(len(IDS))
    events[-1]["meta_info"]["output_top_logprobs"] = [[[lp, i, t], [-9.0, 0, "z"]]
                                                     for lp, i, t in zip(LOGPROBS, IDS, TEXTS)]
    s = _read(SGLANG, events)[1]
    assert s.top_logprobs == [[(t, lp), ("z", -9.0)] for lp, t in zip(LOGPROBS, TEXTS)]
    events = _vllm_events([1])
    for e in events[:-1]:
        for entry in e["choices"][0]["logprobs"]["content"]:
            entry["top_logprobs"] = [{"token": "q", "logprob": -0.5}, {"token": "z", "logprob": -9.0}]
    v = _read(VLLM, events)[1]
    assert v.top_logprobs == [[("q", -0.5), ("z", -9.0)]] * len(IDS)


def test_unset_sampling_parameters_take_the_engines_defaults() -> None:
    async def find_json(path: str) -> dict:
        assert path == "/polar/sampling_defaults"
        return {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": None, "max_tokens": 100}

    async def missing(path: str) -> None:
        return None

    defaults = asyncio.run(VLLM.sampling_defaults(find_json))
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 100}  # max_new_tokens
    assert asyncio.run(VLLM.sampling_defaults(missing)) is None  # a vLLM not started by LAUNCH cannot say
    assert asyncio.run(SGLANG.sampling_defaults(find_json)) == {}  # SGLang's /generate: its own defaults
    sampling = Sampling(9, None, 0.8, (), {"top_k": 2, "seed": 1}).defaulted(defaults)
    assert (sampling.temperature, sampling.top_p, sampling.controls) == (0.6, 0.8, {"top_k": 2, "seed": 1})
    params = VLLM.generate([1], Sampling(9).defaulted(defaults), False, "r")[1]["sampling_params"]
    assert (params["temperature"], params["top_p"], params["top_k"], params["max_tokens"]) == (0.6, 0.95, 20, 9)
