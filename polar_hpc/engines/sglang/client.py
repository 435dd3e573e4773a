"""How the proxy talks to SGLang (and the scripted engine, which speaks its routes): the
`engines.capture` client contract.

- tito: `POST /generate` with `input_ids`, `sampling_params` (`max_new_tokens`,
  `skip_special_tokens`, `stop`, `temperature`, `top_p`, the controls asked under SGLang's names:
  `sampling_seed`, `top_k`, `min_p`, the penalties, `logit_bias`; a constraint as `json_schema` or
  `structural_tag`), `return_logprob` (with `top_logprobs_num` and `return_text_in_logprobs` when
  alternatives are asked: `meta_info.output_top_logprobs`), `stream`, `rid`.
  Each answer (and each stream event) is cumulative: `text` is the whole text so far and
  `meta_info.output_token_logprobs` `[[logprob, id, text], ...]` every token so far;
  `meta_info.finish_reason` `{"type": stop|length|abort, "matched": ..., "message": ...}`,
  `weight_version` (the version serving when the event was made: the one that sampled the
  event's new tokens), `cached_tokens`.
- passthrough: `POST /v1/chat/completions` with `return_token_ids` and `logprobs` (SGLang >=
  0.5.17): `choices[0].prompt_token_ids` / `response_token_ids`, `logprobs.content`, and
  `metadata.weight_version`.
- `/get_model_info` `tokenizer_path` and `/v1/models` `max_model_len` are the model's facts.
- `sampling_defaults`: none. SGLang's /generate applies its `--preferred-sampling-params` itself
  (tokenizer_manager) and, unlike its OpenAI routes (`--sampling-defaults model`, the default),
  not the model's generation config; see docs/engines.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from polar_hpc.engines.capture import BROKEN, BadAnswer, Sampled, Sampling, chat_sampled

CHAT_PATH = "/v1/chat/completions"
VERSIONED_EVENTS = True  # each stream event's weight_version sampled its new tokens


def generate(ids: list[int], sampling: Sampling, stream: bool, rid: str) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"max_new_tokens": sampling.max_tokens, "skip_special_tokens": True}
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    for key in ("temperature", "top_p"):
        if getattr(sampling, key) is not None:
            params[key] = getattr(sampling, key)
    params.update({_NAMES.get(k, k): v for k, v in sampling.controls.items()})
    if sampling.constraint is not None:
        params[sampling.constraint.kind] = sampling.constraint.spec
    body = {"input_ids": ids, "sampling_params": params, "return_logprob": True, "stream": stream, "rid": rid}
    if sampling.top_logprobs:
        body.update(top_logprobs_num=sampling.top_logprobs, return_text_in_logprobs=True)
    return "/generate", body


_NAMES = {"seed": "sampling_seed"}  # SGLang's names of the controls whose names differ


class Generation:
    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None
        self._read = 0
        self._versions: list[str] = []  # per token so far: the version of the event that brought it

    def feed(self, event: dict[str, Any]) -> str:
        self._last = event
        meta = event.get("meta_info")
        if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), list):
            new = len(meta["output_token_logprobs"]) - len(self._versions)
            self._versions += [str(meta.get("weight_version", ""))] * new
        text = event.get("text") or ""  # cumulative: each event's text extends the last's
        piece, self._read = text[self._read:], len(text)
        return piece

    def result(self) -> Sampled:
        if self._last is None:
            raise BadAnswer("engine answered nothing")
        try:
            meta = self._last.get("meta_info") or {}
            pairs = meta["output_token_logprobs"]
            finish = meta.get("finish_reason") or {}
            kind = finish.get("type") if isinstance(finish, dict) else finish
            return Sampled(
                ids=[int(p[1]) for p in pairs], logprobs=[float(p[0]) for p in pairs],
                finish=kind if kind in ("length", "abort") else "stop",
                weight_version=str(meta.get("weight_version", "")),
                cached_tokens=int(meta.get("cached_tokens") or 0),
                matched_stop=finish.get("matched") if isinstance(finish, dict) else None,
                rid=str(meta.get("id") or ""), text=self._last.get("text") or "",
                message=str(finish.get("message") or "") if isinstance(finish, dict) else "",
                top_logprobs=[[(str(a[2]), float(a[0])) for a in alternatives]
                              for alternatives in meta["output_top_logprobs"]]
                if meta.get("output_top_logprobs") else None,
                token_versions=list(self._versions) if len(set(self._versions)) > 1
                and len(self._versions) == len(pairs) else None,
            )
        except BROKEN as e:
            raise BadAnswer(f"engine answer lacks capture fields ({e!r})") from None


def chat(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return CHAT_PATH, dict(body, stream=False, return_token_ids=True, logprobs=True)


def chat_answer(answer: dict[str, Any]) -> Sampled:
    try:
        choice = answer["choices"][0]
        return chat_sampled(answer, choice, choice["prompt_token_ids"], choice["response_token_ids"],
                            answer["metadata"]["weight_version"])
    except BROKEN as e:
        raise BadAnswer(f"engine answer lacks capture fields ({type(e).__name__}: {e})") from None


async def model_facts(get_json: Callable[[str], Awaitable[dict]]) -> tuple[str | None, int]:
    info = await get_json("/get_model_info")
    cards = (await get_json("/v1/models")).get("data") or [{}]
    return info.get("tokenizer_path"), int(cards[0].get("max_model_len") or 32768)


async def sampling_defaults(find_json: Callable[[str], Awaitable[dict | None]]) -> dict[str, Any] | None:
    return {}
