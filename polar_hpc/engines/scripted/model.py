"""The scripted engine's generation core (no HTTP): what it samples for a prompt, and the records.

`ScriptedModel.generate` turns prompt ids into a `Generation`: the policy's reply for the decoded
prompt, as `encode(reply) + [<|im_end|>]`, cut by SGLang's rules (a stop/eos token ends it and is
included in output_ids; a stop string ends it, the text stops before it; max_new_tokens ends it with
finish `length`). It also simulates a prefix cache (cached_tokens = longest common prefix with the
last 64 sequences served; `prompt_tokens` and `cached_tokens` add them up since the start), plans
when each token is sampled and sent (`times`: wall-clock seconds, one token every `token_delay_ms` after the
request arrived, plus the policy's pause after the token that completes its `pause_after` text;
routes wait until those times) and appends one JSON line per generation to the sample log (with
`t`, those times). `load(version)` serves a new weight version from now on; `version_at(t)` is the
one that served at time t: the version that sampled a token due then.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_hpc.errors import PolarError
from polar_hpc.engines.scripted.chat_format import ChatFormat
from polar_hpc.engines.scripted.policy import Policy, logprobs


class BadRequest(PolarError):
    """A request the engine refuses (HTTP 400); `param` names the offending field, if any."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int | None  # None: up to the context length
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    skip_special_tokens: bool = True


@dataclass(frozen=True)
class Generation:
    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]  # {"type": "stop", "matched": id|str} | {"type": "length", ...}
    texts: list[str]  # texts[k]: visible text after k tokens, each a prefix of texts[-1]
    cached_tokens: int
    started: float  # time.perf_counter() when the request arrived
    times: list[float]  # times[k]: when output token k is sent (time.time())

    @property
    def text(self) -> str:
        return self.texts[-1]


class ScriptedModel:
    """The engine's state: tokenizer, policy, weight version, prefix cache, sample log."""

    def __init__(
        self, fmt: ChatFormat, policy: Policy, *, weight_version: str, context_length: int,
        model_name: str, token_delay_ms: float = 0.0, sample_log: Path | None = None,
    ) -> None:
        self.fmt, self.policy = fmt, policy
        self.weight_version, self.context_length, self.model_name = (
            weight_version, context_length, model_name,
        )
        self.token_delay_s = token_delay_ms / 1000
        self._loads = [(float("-inf"), weight_version)]  # (time.time(), version) of each weight update
        self._cache: deque[list[int]] = deque(maxlen=64)
        self.prompt_tokens = self.cached_tokens = 0  # since the start, as SGLang's counters
        self._log = None
        if sample_log is not None:
            Path(sample_log).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(sample_log, "a", encoding="utf-8")

    def load(self, version: str) -> None:
        """Serve `version` from now on."""
        self.weight_version = version
        self._loads.append((time.time(), version))

    def version_at(self, t: float) -> str:
        """The version that was serving at time `t` (that sampled a token due then)."""
        return next(v for when, v in reversed(self._loads) if when <= t)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def generate(
        self, route: str, rid: str, prompt_ids: list[int], params: SamplingParams, started: float
    ) -> Generation:
        """Sample (deterministically) after prompt_ids; log it; raise BadRequest if it can't fit."""
        n_prompt = len(prompt_ids)
        if n_prompt >= self.context_length:
            raise BadRequest(
                f"The input ({n_prompt} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        budget = params.max_new_tokens
        budget = self.context_length - n_prompt if budget is None else budget
        if n_prompt + budget > self.context_length:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens: {n_prompt} tokens of input and {budget} tokens "
                f"for the completion."
            )
        now = time.time()
        reply = self.policy.reply(self.fmt.decode(prompt_ids))
        planned = self.fmt.encode(reply.text) + [self.fmt.im_end_id]
        output_ids, finish, text = self._cut(planned, budget, params)
        skip = params.skip_special_tokens
        texts = [
            os.path.commonprefix([self.fmt.decode(output_ids[:k], skip), text])
            for k in range(len(output_ids))
        ] + [text]
        cached = max((_common_length(prompt_ids, seq) for seq in self._cache), default=0)
        self._cache.append(prompt_ids + output_ids)
        self.prompt_tokens += n_prompt
        self.cached_tokens += cached
        n = len(output_ids)
        pause_after = n if reply.pause_at is None else next(
            (k for k in range(1, n + 1) if len(texts[k]) >= reply.pause_at), n)
        times = [now + k * self.token_delay_s + (reply.pause_s if k > pause_after else 0.0)
                 for k in range(1, n + 1)]
        gen = Generation(
            rid, prompt_ids, output_ids, logprobs(prompt_ids, output_ids), finish, texts,
            cached, started, times,
        )
        self._record(route, gen)
        return gen

    def _cut(
        self, planned: list[int], budget: int, params: SamplingParams
    ) -> tuple[list[int], dict[str, Any], str]:
        """Output ids, finish reason and final text of the planned ids under params."""
        skip = params.skip_special_tokens
        for k, token in enumerate(planned[:budget], start=1):
            if token in params.stop_token_ids or token in self.fmt.eos_ids:
                return planned[:k], {"type": "stop", "matched": token}, self.fmt.decode(
                    planned[: k - 1], skip
                )
            if params.stop:
                text = self.fmt.decode(planned[:k], skip)
                hits = [(text.find(s), s) for s in params.stop if s in text]
                if hits:
                    index, stop = min(hits)
                    return planned[:k], {"type": "stop", "matched": stop}, text[:index]
        output_ids = planned[:budget]
        return output_ids, {"type": "length", "length": budget}, self.fmt.decode(output_ids, skip)

    def _record(self, route: str, gen: Generation) -> None:
        if self._log is None:
            return
        line = {
            "route": route, "rid": gen.rid, "input_ids": gen.prompt_ids,
            "output_ids": gen.output_ids, "output_logprobs": gen.logprobs,
            "finish_reason": gen.finish_reason, "weight_version": self.weight_version,
            "t": gen.times,
        }
        self._log.write(json.dumps(line) + "\n")
        self._log.flush()


def _common_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
