"""How the proxy talks to vLLM: the `engines.capture` client contract.

- tito: vLLM's tokens-in-tokens-out route `POST /inference/v1/generate` (served with
  `--enable-scale-out`; vLLM 0.32 entrypoints/scale_out/token_in_token_out/protocol.py) with the
  prompt ids as `token_ids`, `output_mode` `text` (the detokenized text and logprobs with token
  strings), `request_id`, `stream` (with `stream_options.include_usage`), and `sampling_params`
  (vLLM's `SamplingParams`): `max_tokens`, `stop`, `temperature`, `top_p`, the controls asked
  (`seed`, `top_k`, `min_p`, the penalties, `logit_bias`), a constraint as `structured_outputs`
  (`json` or `structural_tag`), `logprobs` (0: the sampled token's only; K alternatives asked: K + 1,
  since vLLM counts the sampled token among them: the proxy keeps the K most likely),
  `skip_special_tokens`. This route applies no generation config of the model (but its
  `max_tokens`, which the proxy always sets): the proxy sends the defaults vLLM's OpenAI routes
  would apply (`sampling_defaults`, their `max_tokens` included) for what a call leaves unset.
  The answer's `choices[0]` carries `text`, `token_ids` (the end token included when it was
  sampled), `logprobs.content` (1:1 with them: `logprob`, `top_logprobs` of `{token, logprob}`),
  `finish_reason` (stop | length | abort) and `stop_reason` (the stop id or string; None for the
  end token), and, on a request's last output only, `weight_versions` `[{version, start, end}]`:
  the spans of its output tokens each weight version sampled (vLLM stamps every engine step with
  the version set by `/update_weight_version`, which changes only while generation is paused), read
  as the call's `token_versions` when there are two or more, the last one its `weight_version`
  (None where vLLM's label was never set, `default`: the proxy then stamps the version its
  engine registry gives the engine). The answer's `prompt_token_ids` (first
  event when streamed), `usage.prompt_tokens_details.cached_tokens` (the usage event when
  streamed; only with `--enable-prompt-tokens-details`). Streamed, each event carries only what is
  new; an aborted call's last event has finish_reason `abort` (serving.py emits every terminal
  output); a stream that ends with no choice and `completion_tokens` 0 is read as an abort too.
- passthrough: `POST /v1/chat/completions` with `logprobs` and `return_token_ids`: the answer's
  `prompt_token_ids` and `choices[0].token_ids`, aligned 1:1 with `logprobs.content` (no version:
  the proxy stamps the one its engine registry gives the engine).
- Logprobs are those vLLM is launched to return: `--logprobs-mode processed_logprobs` gives the
  distribution sampled from (after temperature, top-k, top-p); see docs/engines.md.
- `/v1/models` names the model folder (`root`) and `max_model_len`.
- `sampling_defaults`: `GET /polar/sampling_defaults` (the route `launch.LAUNCH` adds): the
  temperature, top_p, top_k, min_p and penalties vLLM's /v1/completions and /v1/chat/completions
  apply where a request leaves them unset, and `max_tokens` (the generation config's
  `max_new_tokens`: the most tokens a request that sets no limit samples), all from
  `ModelConfig.get_diff_sampling_param()` (the model's generation config as `--generation-config`
  and `--override-generation-config` say); None from a
  vLLM started otherwise (no such route: the proxy says so and sends no defaults).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
import json
from typing import Any

import msgspec

from polar_hpc.engines.capture import BROKEN, BadAnswer, Sampled, Sampling, chat_sampled, check_lengths

GENERATE_PATH = "/inference/v1/generate"
CHAT_PATH = "/v1/chat/completions"
VERSIONED_EVENTS = False  # the versions come whole, on the last event, whether streamed or not
UNSET = "default"  # vLLM's label until /update_weight_version sets one (v1/engine/core.py)
DEFAULTS_PATH = "/polar/sampling_defaults"
SAMPLED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
           "max_tokens")  # max_tokens: the generation config's max_new_tokens, as vLLM names it


def generate(ids: list[int], sampling: Sampling, stream: bool, rid: str) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {
        "max_tokens": sampling.max_tokens, "logprobs": sampling.top_logprobs + 1 if sampling.top_logprobs else 0,
        "skip_special_tokens": True, **sampling.controls,
    }
    if sampling.constraint is not None:
        c = sampling.constraint
        params["structured_outputs"] = {"json": json.loads(c.spec)} if c.kind == "json_schema" else {c.kind: c.spec}
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    for key in ("temperature", "top_p"):
        if getattr(sampling, key) is not None:
            params[key] = getattr(sampling, key)
    body: dict[str, Any] = {"token_ids": ids, "sampling_params": params, "output_mode": "text",
                            "return_token_ids": True, "stream": stream, "request_id": rid}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return GENERATE_PATH, body


class Generation:
    """Events are deltas (a whole answer is one): ids, logprobs and text are appended."""

    def __init__(self) -> None:
        self._s = Sampled(ids=[], logprobs=[], finish="")
        self._fed = False
        self._spans: list[tuple[str, int, int]] = []
        self._generated: int | None = None  # completion_tokens of the stream's usage event

    def feed(self, event: dict[str, Any]) -> str:
        s, self._fed = self._s, True
        try:
            s.rid = s.rid or str(event.get("request_id") or "")
            details = (event.get("usage") or {}).get("prompt_tokens_details") or {}
            s.cached_tokens = int(details.get("cached_tokens") or s.cached_tokens)
            if event.get("prompt_token_ids") is not None:
                s.prompt_ids = msgspec.convert(event["prompt_token_ids"], list[int])
            if not event["choices"]:  # the usage event of a stream
                self._generated = (event.get("usage") or {}).get("completion_tokens", self._generated)
                return ""
            choice = event["choices"][0]
            s.ids += msgspec.convert(choice.get("token_ids") or [], list[int])
            entries = (choice.get("logprobs") or {}).get("content") or []
            s.logprobs += [msgspec.convert(e["logprob"], float) for e in entries]
            if any(len(e.get("top_logprobs") or []) > 1 for e in entries):  # alternatives were asked
                s.top_logprobs = (s.top_logprobs or []) + [
                    [(str(a["token"]), float(a["logprob"])) for a in e["top_logprobs"]] for e in entries]
            if choice.get("finish_reason"):
                s.finish, s.matched_stop = str(choice["finish_reason"]), choice.get("stop_reason")
            self._spans += [(str(w["version"]), int(w["start"]), int(w["end"])) for w in choice.get("weight_versions") or []]
            piece = msgspec.convert(choice.get("text") or "", str)
        except BROKEN as e:
            raise BadAnswer(f"engine answer lacks capture fields ({type(e).__name__}: {e})") from None
        s.text += piece
        return piece

    def result(self) -> Sampled:
        s = self._s
        if not s.finish and not s.ids and self._generated == 0:  # ended before its first token
            s.finish, s.message = "abort", "ended by vLLM before its first token"
        if not self._fed or not s.finish:
            raise BadAnswer("engine answer has no finish_reason")
        if s.finish not in ("length", "abort"):
            s.finish = "stop"
        if self._spans:
            versions = [v for v, start, end in self._spans for _ in range(start, end)]
            if len(versions) != len(s.ids):
                raise BadAnswer(f"engine's weight_versions {self._spans} do not cover its {len(s.ids)} tokens")
            last = self._spans[-1][0]
            s.weight_version = None if last == UNSET else last
            s.token_versions = versions if len(set(versions)) > 1 else None
        return check_lengths(s)


def chat(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return CHAT_PATH, dict(body, stream=False, return_token_ids=True, logprobs=True)


def chat_answer(answer: dict[str, Any]) -> Sampled:
    try:
        choice = answer["choices"][0]
        return chat_sampled(answer, choice, answer["prompt_token_ids"], choice["token_ids"], None)
    except BROKEN as e:
        raise BadAnswer(f"engine answer lacks capture fields ({type(e).__name__}: {e})") from None


async def model_facts(get_json: Callable[[str], Awaitable[dict]]) -> tuple[str | None, int]:
    cards = (await get_json("/v1/models")).get("data") or [{}]
    return cards[0].get("root"), int(cards[0].get("max_model_len") or 32768)


async def sampling_defaults(find_json: Callable[[str], Awaitable[dict | None]]) -> dict[str, Any] | None:
    defaults = await find_json(DEFAULTS_PATH)
    return None if defaults is None else {key: defaults[key] for key in SAMPLED if defaults.get(key) is not None}
