"""How the proxy talks to vLLM: the `engines.capture` client contract.

- tito: `POST /v1/completions` with the token ids as `prompt`, `max_tokens`, `stop`,
  `temperature`, `top_p`, the controls asked (`seed`, `top_k`, `min_p`, the penalties,
  `logit_bias`), a constraint as `structured_outputs` (`json` or `structural_tag`), `logprobs: K`
  (the sampled token's logprob, and K alternatives in `top_logprobs`), `return_token_ids`,
  `skip_special_tokens`, `stream`, `request_id`. The answer's `choices[0]` carries `text`,
  `token_ids` (the end token included when it was sampled), `logprobs.token_logprobs` (1:1 with
  them), `prompt_token_ids`, `finish_reason` (stop | length | abort) and `stop_reason` (the stop
  id or string; None for the end token). Streamed, each event carries only what is new, the
  prompt ids in the first.
- passthrough: `POST /v1/chat/completions` with `logprobs` and `return_token_ids`: the answer's
  `prompt_token_ids` and `choices[0].token_ids`, aligned 1:1 with `logprobs.content`.
- Logprobs are those vLLM is launched to return: `--logprobs-mode processed_logprobs` gives the
  distribution sampled from (after temperature, top-k, top-p); see docs/engines.md.
- A streamed call that ends before its first token (aborted while queued or prefilling) gets no
  choice event at all, only the usage event with `completion_tokens` 0 (vLLM 0.32
  entrypoints/openai/completion/serving.py: a choice's events are skipped while it has no token,
  its finishing one included; a failure is an error event instead): read as finish `abort`.
- vLLM answers carry no weight version (`weight_version` None: the proxy stamps the version its
  engine registry gives the engine) and no cached-token count unless the server is started with
  `--enable-prompt-tokens-details`.
- `/v1/models` names the model folder (`root`) and `max_model_len`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
import json
from typing import Any

import msgspec

from polar_hpc.engines.capture import BROKEN, BadAnswer, Sampled, Sampling, chat_sampled, check_lengths

CHAT_PATH = "/v1/chat/completions"
VERSIONED_EVENTS = False  # no weight version in its answers


def generate(ids: list[int], sampling: Sampling, stream: bool, rid: str) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "prompt": ids, "max_tokens": sampling.max_tokens, "logprobs": sampling.top_logprobs,
        "return_token_ids": True, "skip_special_tokens": True, "stream": stream, "request_id": rid,
        **sampling.controls,
    }
    if sampling.constraint is not None:
        c = sampling.constraint
        body["structured_outputs"] = {"json": json.loads(c.spec)} if c.kind == "json_schema" else {c.kind: c.spec}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    for key in ("temperature", "top_p"):
        if getattr(sampling, key) is not None:
            body[key] = getattr(sampling, key)
    return "/v1/completions", body


class Generation:
    """Events are deltas (a whole answer is one): ids, logprobs and text are appended."""

    def __init__(self) -> None:
        self._s = Sampled(ids=[], logprobs=[], finish="")
        self._fed = False
        self._generated: int | None = None  # completion_tokens of the stream's usage event

    def feed(self, event: dict[str, Any]) -> str:
        s, self._fed = self._s, True
        try:
            s.rid = s.rid or str(event.get("id") or "")
            details = (event.get("usage") or {}).get("prompt_tokens_details") or {}
            s.cached_tokens = int(details.get("cached_tokens") or s.cached_tokens)
            choices = event["choices"]
            if not choices:  # the usage event of a stream
                self._generated = (event.get("usage") or {}).get("completion_tokens", self._generated)
                return ""
            choice = choices[0]
            if choice.get("prompt_token_ids") is not None:
                s.prompt_ids = msgspec.convert(choice["prompt_token_ids"], list[int])
            s.ids += msgspec.convert(choice.get("token_ids") or [], list[int])
            logprobs = choice.get("logprobs") or {}
            s.logprobs += msgspec.convert(logprobs.get("token_logprobs") or [], list[float])
            if logprobs.get("top_logprobs"):
                s.top_logprobs = (s.top_logprobs or []) + [
                    list(msgspec.convert(alternatives, dict[str, float]).items())
                    for alternatives in logprobs["top_logprobs"]]
            if choice.get("finish_reason"):
                s.finish, s.matched_stop = str(choice["finish_reason"]), choice.get("stop_reason")
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
