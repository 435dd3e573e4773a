"""Token-exactness checks of captured traces against the session's real vLLM (`conftest.Vllm`).

`check_sampled_runs(vllm, trace)`: every sampled run of a merged trace (loss mask 1) is what vLLM
samples after the tokens before it (asked again with the same prompt ids; the tiny model is peaked
enough that temperature 1 gives the same ids), its logprobs are vLLM's up to float summation order
(a run's vLLM batches concurrent sessions), and every other token has logprob 0. Returns the runs.
`rendered(vllm, messages, tools)`: the prompt ids vLLM's chat route renders for a conversation.
`free_port()`: a port for a vLLM a run starts (not the engine config's default, another's maybe).
"""

from __future__ import annotations

import socket

import pytest

from e2e.helpers import sampled_runs


def check_sampled_runs(vllm, trace) -> list[tuple[int, int]]:
    sequence = (trace.prompt_ids + trace.response_ids).tolist()
    runs = sampled_runs(trace.loss_mask.tolist())
    for start, end in runs:
        prompt = sequence[: len(trace.prompt_ids) + start]
        again = vllm.post("/v1/completions", {"model": vllm.model, "prompt": prompt, "max_tokens": end - start,
                                              "logprobs": 0, "return_token_ids": True})["choices"][0]
        assert again["prompt_token_ids"] == prompt
        assert trace.response_ids[start:end].tolist() == again["token_ids"]
        assert trace.logprobs[start:end].tolist() == pytest.approx(again["logprobs"]["token_logprobs"], abs=1e-4)
    assert all(lp == 0.0 for lp, m in zip(trace.logprobs, trace.loss_mask) if not m)
    return runs


def rendered(vllm, messages: list[dict], tools: list[dict]) -> list[int]:
    answer = vllm.post("/v1/chat/completions", {"model": vllm.model, "messages": messages, "tools": tools,
                                                "max_tokens": 1, "return_token_ids": True})
    return answer["prompt_token_ids"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
