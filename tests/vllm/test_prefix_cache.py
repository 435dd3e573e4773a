"""The proxy reads a real vLLM's prefix-cache counters (`vllm:prefix_cache_hits_total` over
`vllm:prefix_cache_queries_total`) and its request gauges from its /metrics, and reports the hit
rate in its own metrics: two calls with one long system prompt, the second finds it cached."""

from __future__ import annotations

import urllib.request

import openai
import pytest

from polar_hpc.engines import gauges
from proxy.conftest import gateway, short_tmp  # noqa: F401 (fixtures)
from proxy.helpers import MODEL, start_proxy

pytestmark = pytest.mark.timeout(900)  # the session's vLLM may start within a test: minutes on a busy host
SYSTEM = "You answer questions about arithmetic, briefly and exactly. " * 40  # several KV blocks


def test_the_proxy_reports_vllms_prefix_cache_hit_rate(vllm, short_tmp, gateway) -> None:  # noqa: F811
    proxy = start_proxy(short_tmp, gateway, vllm.url, mode="passthrough", engine_kind="vllm", metrics_s=0.1)
    try:
        gateway.open("s", "tok", "task")
        client = openai.OpenAI(base_url=proxy.base_url, api_key="tok", max_retries=0, timeout=600)
        for question in ("What is 2 + 2?", "What is 3 + 5?"):
            client.chat.completions.create(model=MODEL, max_tokens=1, temperature=0, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        with urllib.request.urlopen(vllm.url + "/metrics", timeout=60) as r:
            own = gauges.read(r.read().decode())
        assert own["cached_tokens"] > 0, own  # the second call found the system prompt cached
        rate = own["cached_tokens"] / own["prompt_tokens"]
        seen = gateway.wait_metrics(lambda m: m.get(("polar_proxy_engine_cache_hit_rate", vllm.url)) == rate, 60)
        assert seen[("polar_proxy_engine_requests", vllm.url)] == 0
    finally:
        proxy.stop()
