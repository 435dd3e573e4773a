"""What the proxy asks of an engine and gets back, in one form whatever the engine kind.

`engines.kinds.get(kind).client` is that engine kind's client module (`engines/<kind>/client.py`;
the scripted engine speaks SGLang's routes). Every client module has:
- `generate(ids, sampling, stream, rid) -> (path, body)`: the request that samples a reply to the
  prompt `ids` (tito), with the `Sampling` asked (its controls and `Constraint` in the engine's own
  fields), streamed or not, the engine's logprob of each sampled token (and the top alternatives
  when asked) and the sampled ids returned, special tokens left out of the text.
- `Generation()`: reads that answer, or each event of its stream, in order: `feed(event)` returns
  the text new in it (what the harness may be streamed); `result()` the `Sampled`. A kind whose
  events report the weight version (SGLang's) gives each token the version of the event that
  brought it (`Sampled.token_versions`): the proxy always streams from the engine, so a call that
  spans a weight update in `continue` mode has its tokens' versions exact.
- `VERSIONED_EVENTS`: whether its stream events report the version (the proxy then streams).
- `chat(body) -> (path, body)`: the engine's Chat Completions request (passthrough) for an OpenAI
  Chat `body`, not streamed, with prompt ids, sampled ids and their logprobs returned.
- `chat_answer(answer) -> Sampled`: its answer, content and tool calls included.
- `async model_facts(get_json) -> (tokenizer folder or None, context length)`, `get_json(path)`
  being the engine's decoded JSON answer to a GET.
- `async sampling_defaults(find_json) -> dict | None`: the sampling parameters (`temperature`,
  `top_p`, `max_tokens`, and controls by their `Sampling.controls` names) the proxy sends where a
  call leaves them unset (`max_tokens`: the most a call without a limit samples, within the
  context left), for the kind's tito route to sample as the engine's own OpenAI routes would
  (`Sampling.defaulted`); None where the engine cannot say (`find_json(path)`: like `get_json`, None
  where the engine has no such route).
A malformed answer (a capture field missing, ids and logprobs of different lengths) raises
`BadAnswer` naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from polar_hpc.errors import PolarError

BROKEN = (KeyError, IndexError, TypeError, ValueError, AttributeError, msgspec.ValidationError)


class BadAnswer(PolarError, ValueError):
    """The engine's answer lacks what capture needs."""


@dataclass(frozen=True)
class Constraint:
    """Constrained decoding, by the engine's own structured-output support (xgrammar)."""

    kind: str  # json_schema | structural_tag
    spec: str  # its JSON text: a JSON schema, or a structural tag {"type": "structural_tag", "format"}


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float | None = None  # None: the engine's default
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    # seed, top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty, logit_bias
    controls: dict[str, Any] = field(default_factory=dict)
    top_logprobs: int = 0  # alternatives returned at each sampled token
    constraint: Constraint | None = None

    def defaulted(self, defaults: dict[str, Any]) -> Sampling:
        """This, with `defaults` for what it leaves unset (`max_tokens` is the caller's: see tito.py)."""
        return replace(self, temperature=defaults.get("temperature") if self.temperature is None else self.temperature,
                       top_p=defaults.get("top_p") if self.top_p is None else self.top_p,
                       controls={**{k: v for k, v in defaults.items() if k not in ("temperature", "top_p", "max_tokens")},
                                 **self.controls})

    def record(self) -> dict[str, Any]:
        """The sampling parameters the engine was asked for (the call record's `sampling`)."""
        out: dict[str, Any] = {"max_tokens": self.max_tokens}
        for key in ("temperature", "top_p"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.stop:
            out["stop"] = list(self.stop)
        out.update(self.controls)
        if self.top_logprobs:
            out["top_logprobs"] = self.top_logprobs
        return out


@dataclass
class Sampled:
    """One sampled reply: `ids[i]` was sampled with logprob `logprobs[i]` (the end token included
    when it was sampled). `finish` is stop | length | abort (a weight update in `abort` mode; then
    `message` says why); `weight_version` None when the engine reports none (else the version of
    its last event). `token_versions`: per sampled token, the version that sampled it, when they
    differ (a call that went on across a weight update); None: all are `weight_version`."""

    ids: list[int]
    logprobs: list[float]
    finish: str
    weight_version: str | None = None
    cached_tokens: int = 0
    matched_stop: int | str | None = None  # the stop id or string that ended it, when known
    prompt_ids: list[int] | None = None  # as the engine reports them
    rid: str = ""  # the engine's id of the request
    text: str = ""  # generate: the sampled text (special tokens left out)
    content: str | None = None  # chat: the reply's content and tool calls (id, name, arguments)
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    token_texts: list[str] | None = None  # chat: each sampled token's text
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per token: (text, logprob) alternatives
    message: str = ""
    token_versions: list[str] | None = None


def check_lengths(s: Sampled) -> Sampled:
    if len(s.ids) != len(s.logprobs):
        raise BadAnswer(f"engine returned {len(s.logprobs)} logprobs for {len(s.ids)} tokens")
    return s


def chat_sampled(answer: dict, choice: dict, prompt_ids: Any, ids: Any, version: Any) -> Sampled:
    """The `Sampled` of an OpenAI-shaped chat answer, given where the engine puts its ids (raises
    what `BROKEN` lists when a field is missing)."""
    message, entries = choice["message"], choice["logprobs"]["content"]
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    return check_lengths(Sampled(
        ids=msgspec.convert(ids, list[int]),
        logprobs=[msgspec.convert(e["logprob"], float) for e in entries],
        finish=msgspec.convert(choice["finish_reason"], str),
        weight_version=None if version is None else msgspec.convert(version, str),
        cached_tokens=int(details.get("cached_tokens") or 0),
        matched_stop=choice.get("matched_stop", choice.get("stop_reason")),
        prompt_ids=msgspec.convert(prompt_ids, list[int]), rid=str(answer["id"]),
        content=message.get("content"),
        tool_calls=[(str(c["id"]), str(c["function"]["name"]), str(c["function"]["arguments"]))
                    for c in message.get("tool_calls") or []],
        token_texts=[str(e.get("token", "")) for e in entries],
        top_logprobs=[[(str(a["token"]), float(a["logprob"])) for a in e.get("top_logprobs") or []]
                      for e in entries],
    ))

