"""An engine's load and prefix-cache figures, read from its Prometheus `/metrics` text.

`read(text)` returns the figures found, each summed over the engine's label sets (one per data-
parallel rank, say), by SGLang's names (served with `--enable-metrics`) or vLLM's:

- `running`: requests being generated (`sglang:num_running_reqs`, `vllm:num_requests_running`);
- `waiting`: requests queued (`sglang:num_queue_reqs`, `vllm:num_requests_waiting`);
- `prompt_tokens` / `cached_tokens`: prompt tokens the engine was asked for and those of them its
  prefix cache already held (counters: `sglang:prompt_tokens_total` / `sglang:cached_tokens_total`,
  `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`);
- `cache_hit_rate`: SGLang's gauge of the same name (its recent batches; the mean over label sets).

`hit_rate(figures)` is cached over prompt tokens since the engine started, or SGLang's gauge where
the counters are missing, or None. Values that are not finite numbers are skipped. Callers read at
most `MAX_BYTES` of the text (engines' texts are tens to hundreds of KiB).
"""

from __future__ import annotations

import math
import re

MAX_BYTES = 1 << 20
_NAMES = {
    "sglang:num_running_reqs": "running", "vllm:num_requests_running": "running",
    "sglang:num_queue_reqs": "waiting", "vllm:num_requests_waiting": "waiting",
    "sglang:prompt_tokens_total": "prompt_tokens", "vllm:prefix_cache_queries_total": "prompt_tokens",
    "sglang:cached_tokens_total": "cached_tokens", "vllm:prefix_cache_hits_total": "cached_tokens",
    "sglang:cache_hit_rate": "cache_hit_rate",
}
_MEAN = {"cache_hit_rate"}
_VALUE = re.compile(r"(?:\{[^\n]*?\})?[ \t]+([^ \t\n]+)")  # after a name: its labels, its value


def read(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, figure in _NAMES.items():  # str.find skips the other lines (most of them) at C speed
        at = text.find(name)
        while at >= 0:
            end = at + len(name)
            value = _VALUE.match(text, end) if at == 0 or text[at - 1] == "\n" else None
            if value is not None:
                try:
                    number = float(value[1])
                except ValueError:
                    number = math.nan
                if math.isfinite(number):
                    sums[figure] = sums.get(figure, 0.0) + number
                    counts[figure] = counts.get(figure, 0) + 1
            at = text.find(name, end)
    return {f: v / counts[f] if f in _MEAN else v for f, v in sums.items()}


def hit_rate(figures: dict[str, float]) -> float | None:
    prompt = figures.get("prompt_tokens", 0.0)
    if prompt > 0:
        return min(1.0, figures.get("cached_tokens", 0.0) / prompt)
    return figures.get("cache_hit_rate")
