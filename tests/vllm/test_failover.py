"""An engine killed in the middle of a call: the proxy retries the call on the other vLLM before
the harness saw a byte, the harness gets its answer, and the call is recorded once, token-exact
against the engine that answered, its record naming the engine that failed. Needs a second vLLM
(started here, stopped at the end), serving a checkpoint nudged far from the tiny model's (same
tokenizer and template) so that its greedy reply runs long: it is still sampling when killed."""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request

import openai
import pytest

from polar_hpc import wire
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import MODEL, start_proxy
from vllm.conftest import start_vllm
from vllm.model import model_dir, perturbed

pytestmark = pytest.mark.timeout(900)  # the session's vLLM may start within a test: minutes on a busy host
LONG = 400  # tokens the call may take: the second engine is still sampling when killed (tens per second here)


def test_a_killed_engine_fails_over_and_nothing_is_recorded_twice(vllm, short_tmp, gateway, tmp_path) -> None:  # noqa: F811
    second = start_vllm(tmp_path, "second", perturbed(model_dir(), tmp_path / "noisy", scale=1.0))
    try:
        # the second engine is first in line for a new session (both idle: registration order)
        proxy = start_proxy(short_tmp, gateway, [second.url, vllm.url], mode="tito", engine_kind="vllm")
        gateway.send(wire.Engines(urls=[second.url, vllm.url], versions={second.url: "a", vllm.url: "b"}))
        gateway.open("s", "tok")
        client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=600)
        ask = [{"role": "user", "content": "Count to a thousand."}]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.chat.completions.create, model=MODEL, messages=ask, max_tokens=LONG,
                               temperature=0)
            deadline = time.monotonic() + 120
            while _running(second) == 0:  # the call is being sampled on the second engine
                assert time.monotonic() < deadline and not call.done(), "the call never reached the second engine"
                time.sleep(0.1)
            second.stop(kill=True)
            answer = call.result(timeout=600)
        record = gateway.expect(wire.CallRecord, timeout=60)
        gateway.quiet(2)  # one record for one call: the killed attempt left none
        assert (record.call_index, record.engine_url, record.meta["retried"]) == (0, vllm.url, [second.url])
        assert record.weight_version == "b"
        direct = vllm.post("/v1/completions", {"model": MODEL, "prompt": record.prompt_ids, "max_tokens": LONG,
                                               "temperature": 0, "logprobs": 0, "return_token_ids": True})
        choice = direct["choices"][0]
        assert (record.output_ids, record.output_logprobs) == (choice["token_ids"], choice["logprobs"]["token_logprobs"])
        assert answer.choices[0].finish_reason == choice["finish_reason"]
        proxy.stop()
    finally:
        second.stop(kill=True)


def _running(server) -> float:
    """Requests the server is sampling now (its Prometheus gauge)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0
