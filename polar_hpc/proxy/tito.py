"""`tito` capture mode (tokens in, tokens out): the proxy renders, the engine only samples.

`Renderer(folder)` is the model's own tokenizer and chat template (`chat_template.ModelFiles`:
rendering what transformers' `apply_chat_template` renders, tools included, without importing
transformers), loaded from a local folder in well under a second; it keeps
the last `RENDER_CACHE` renderings (keyed by exactly what the template sees) and `ENCODE_CACHE`
tokenizations, each cache within `CACHE_BYTES`, and each token's text. Messages its template
cannot render are a `BadRequest`; a call's reasoning settings are rendered as the template
variables `reasoning.template_kwargs` finds (or refused). A big call's prompt is built in the worker thread
(`calls.offload`): the caches are locked, and a chain is replaced, never changed in place.
`Tito(renderer, tool_parser, router, engine)`: `await answer(session, call, emit)` renders
the call's conversation, asks an engine to sample from its token ids (the kind's client's
`generate`, `engines.capture`), streamed when the harness streams (and always from an engine
whose events carry the weight version, `VERSIONED_EVENTS`: per-token versions), awaits `emit(piece)` for each
piece of content as tokens arrive and for each tool call (a `ToolCall`) as soon as its closing tag
arrives (`CallReader` over the engine's text), and returns the `Outcome` (the same content and
calls, ids included; `aborted.Aborted` if the engine aborted the generation; `EngineError` 502 if
the engine reports other prompt ids than it was sent). The engine is asked for the call's sampling
controls, the engine kind's `sampling_defaults` for those the call leaves unset (vLLM's generation
config defaults, which its tito route does not apply itself; a call without a token limit samples
the context left, at most their `max_tokens`), and, when the harness asked for
structured output, the `constraints.constraint` it decodes under; `meta` records both (`sampling`,
`constrained`). `tool_choice: none` reads no calls; parallel tool calls off keeps the first.
Chat's n > 1 samples each choice with a request of its own (`Outcome.choices`), each starting its own chain.

Drift-free history: `Chains` (one per session) keeps, for each chain of calls, the conversation
through the last sampled reply and its exact ids (prompt + sampled). When a call re-sends that
conversation (same messages, tools and template rendering) and adds to it, its prompt is the
chain's ids followed by the tokens of what was added (the template's text after the reply's end
token), never a re-tokenization of the reply, provided the template renders that history as it was:
the chain's prompt text still starts the rendering and the reply renders as the text sampled (a
template that rewrites the past, as Qwen3's drops earlier queries' reasoning, starts a new chain),
so a prompt's text is always the template's rendering. Otherwise a new chain starts; `meta` says
which chain a call extends, or why it starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
from jinja2 import TemplateError

from polar_hpc.engines.capture import Sampled, Sampling
from polar_hpc.proxy import aborted, constraints
from polar_hpc.proxy.calls import (
    BadRequest, Call, Outcome, ToolCall, assistant_message, message_key, new_id, offload,
)
from polar_hpc.proxy.chat_template import ModelFiles, aliased, compiled
from polar_hpc.proxy.engine_client import EngineClient, EngineError
from polar_hpc.proxy.reasoning import template_kwargs
from polar_hpc.proxy.routing import Router
from polar_hpc.proxy.tool_parsers import NO_CALLS, CallReader, ToolParser, parser_for

log = logging.getLogger("polar_hpc.proxy")

MAX_CHAINS = 16
RENDER_CACHE = 64  # renderings kept: the samples of a task share their first prompts
ENCODE_CACHE = 256  # tokenizations kept
CACHE_BYTES = 64 << 20  # what each of the two caches may hold in all, roughly
WINDOW_CHARS_PER_TOKEN = 4  # a longer prompt is first counted on this many characters per context token
CUT_MARGIN = 1024  # tokens a cut inside a word could add to a prefix's count


class _Lru:
    """Recently used values: at most `items`, costing at most `budget` in all (a value costing more
    is not kept), so a few huge prompts cannot pin the proxy's memory. A lock makes it safe from the
    threads big calls are worked in (`calls.offload`)."""

    def __init__(self, items: int, budget: int) -> None:
        self.items, self.budget, self.cost = items, budget, 0
        self._values: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            entry = self._values.get(key)
            if entry is None:
                return None
            self._values.move_to_end(key)
            return entry[0]

    def put(self, key: Any, value: Any, cost: int) -> None:
        if cost > self.budget:
            return
        with self._lock:
            if key in self._values:
                return
            self._values[key] = (value, cost)
            self.cost += cost
            while len(self._values) > self.items or self.cost > self.budget:
                self.cost -= self._values.popitem(last=False)[1][1]


class Renderer:
    def __init__(self, folder: str | Path) -> None:
        # One text per call: tokenizers' thread pool would only hand each one to another thread and
        # block the event loop until that thread runs (tens of ms when an engine saturates the CPUs).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.folder = str(folder)
        self.files = ModelFiles.load(Path(folder))
        self.tokenizer = self.files.tokenizer
        templates = self.files.templates  # the tool parser is told by the template that renders tools
        self.chat_template = templates.get("tool_use") or templates.get("default") or next(iter(templates.values()))
        self.eos_ids = self.files.eos_ids
        self._rendered = _Lru(RENDER_CACHE, CACHE_BYTES)
        self._encoded = _Lru(ENCODE_CACHE, CACHE_BYTES)
        self._token_text = functools.lru_cache(maxsize=1 << 16)(self._decode_one)  # per instance

    def kwargs(self, call: Call) -> dict[str, Any]:
        """The template variables that honour the call's reasoning settings (`reasoning`)."""
        return template_kwargs(call.reasoning, self.files.template(call.tools))

    def text(self, messages: list[dict], tools: list[dict] | None, generation: bool,
             kwargs: dict[str, Any] | None = None) -> str:
        key = msgspec.json.encode((messages, tools, generation, kwargs or None))  # all the template sees, exactly
        text = self._rendered.get(key)
        if text is None:
            text = self._render(messages, tools or None, generation, kwargs or {})
            self._rendered.put(key, text, len(key) + len(text))
        return text

    def _render(self, messages: list[dict], tools: list[dict] | None, generation: bool,
                kwargs: dict[str, Any]) -> str:
        """What `apply_chat_template(messages, tools=tools, tokenize=False,
        add_generation_prompt=generation, **kwargs)` renders (`chat_template`), without its per-call
        deep copy of everything into plain data (decoded JSON is plain data already). A template that
        cannot render the harness's messages is the request's fault (BadRequest)."""
        chat = [{k: v for k, v in m.items() if v is not None} for m in _templated(messages)]
        try:
            template = compiled(self.files.template(tools))
            return template.render(
                messages=aliased(chat), tools=tools, documents=None,
                add_generation_prompt=generation, **self.files.special, **kwargs,
            )
        except (TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
                RecursionError) as e:
            raise BadRequest(f"the model's chat template cannot render these messages: {e}",
                             "messages") from None

    def encode(self, text: str) -> list[int]:
        ids = self._encoded.get(text)  # the samples of a task all open with the same prompt
        if ids is None:
            ids = self._tokenize(text)
            self._encoded.put(text, ids, len(text) + 40 * len(ids))  # ~40 bytes per int in a tuple
        return list(ids)

    def _tokenize(self, text: str) -> tuple[int, ...]:
        # Without offsets (half the time), and with the GIL released, so the event loop runs while
        # a big text is cut.
        return tuple(self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    def refuse_overlong(self, text: str, context: int) -> None:
        """BadRequest when `text` certainly has more tokens than `context`, found by tokenizing only
        its first `WINDOW_CHARS_PER_TOKEN * context` characters (cut before a space where there is
        one, a pre-tokenizer boundary): a huge prompt is refused without tokenizing all of it, or
        holding its ids. A text within that window is left to the engine's own check."""
        window = WINDOW_CHARS_PER_TOKEN * context
        if len(text) <= window:
            return
        cut = text.rfind(" ", 0, window)
        while cut > 0 and text[cut - 1].isspace():
            cut = text.rfind(" ", 0, cut - 1)
        prefix = text[:cut] if cut > 0 else text[:window]
        n = len(self.tokenizer.encode_batch_fast([prefix], add_special_tokens=False)[0].ids)
        if n > context + CUT_MARGIN:
            raise BadRequest(f"the prompt has more than {n - CUT_MARGIN} tokens (counted in its first {len(prefix)} "
                             f"of {len(text)} characters); the engine's context length is {context} tokens", "messages")

    def decode(self, ids: list[int]) -> str:
        """The ids' text, special tokens included, as sampled (no clean-up of spaces)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self._token_text(token_id)

    def _decode_one(self, token_id: int) -> str:
        return self.decode([token_id])


def _templated(messages: list[dict]) -> list[dict]:
    """Messages as templates expect them: tool-call arguments as objects, not JSON strings."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m, tool_calls=[_object_arguments(c) for c in m["tool_calls"]])
        out.append(m)
    return out


def _object_arguments(call: dict) -> dict:
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        arguments = json.loads(fn["arguments"])
    except ValueError:
        return call
    return dict(call, function=dict(fn, arguments=arguments)) if isinstance(arguments, dict) else call


@dataclass
class _Chain:
    number: int
    messages: list[dict]  # through the last sampled assistant reply
    keys: list[tuple]  # their `message_key`s
    tools: list[dict] | None
    kwargs: dict[str, Any]  # the template variables its calls were rendered with (reasoning)
    ids: list[int]  # prompt + sampled ids of the chain's last call
    sampled: int  # how many of `ids` its last call sampled
    prompt_text: str  # the rendered prompt of the chain's last call


@dataclass
class _Prompt:
    ids: list[int]
    chain: _Chain | None  # the chain it extends
    why: str  # why it starts a new chain ("" when it extends one)
    text: str  # the rendered prompt
    keys: list[tuple]  # the `message_key` of each of the call's messages
    kwargs: dict[str, Any]  # the template variables it was rendered with


class Chains:
    """A session's chains; `prompt` finds the one a conversation extends."""

    def __init__(self) -> None:
        self._chains: list[_Chain] = []
        self.started = 0

    def prompt(self, r: Renderer, call: Call, context: int) -> _Prompt:
        kwargs = r.kwargs(call)
        full = r.text(call.messages, call.tools, True, kwargs)
        r.refuse_overlong(full, context)
        keys = [message_key(m) for m in call.messages]
        why = "first call of the session"
        for chain in reversed(self._chains):
            glue, why = self._glue(r, chain, call, keys, full, kwargs)
            if glue is not None:
                return _Prompt(chain.ids + r.encode(glue), chain, "", full, keys, kwargs)
        return _Prompt(r.encode(full), None, why, full, keys, kwargs)

    @staticmethod
    def _glue(
        r: Renderer, chain: _Chain, call: Call, keys: list[tuple], full: str, kwargs: dict[str, Any]
    ) -> tuple[str | None, str]:
        """The text after the chain's last reply, when `call` re-sends the chain's history."""
        n, messages = len(chain.messages), call.messages
        if call.tools != chain.tools:
            return None, f"tools differ from chain {chain.number}"
        if kwargs != chain.kwargs:
            return None, f"reasoning settings differ from chain {chain.number}"
        for i in range(min(n, len(messages))):
            if keys[i] != chain.keys[i]:
                return None, f"message {i} differs from chain {chain.number}"
        if len(messages) <= n:
            return None, f"conversation does not extend chain {chain.number}"
        if chain.ids[-1] not in r.eos_ids:
            return None, f"chain {chain.number}'s last reply did not end with an end token"
        before = chain.prompt_text  # usually still the start of the rendering; else re-render
        if not full.startswith(before):
            before = r.text(messages[: n - 1], call.tools, True, kwargs)
        end = r.token_text(chain.ids[-1])
        at = full.find(end, len(before)) if full.startswith(before) else -1
        if at < 0:
            return None, f"template renders chain {chain.number}'s history differently"
        if full[len(before):at + len(end)] != r.decode(chain.ids[-chain.sampled:]):
            return None, f"template renders chain {chain.number}'s last reply differently"
        return full[at + len(end):], ""

    def record(self, prompt: _Prompt, call: Call, outcome: Outcome) -> int:
        """The number of the chain the call extended or started, now through its reply."""
        reply = assistant_message(outcome)
        messages, keys = [*call.messages, reply], [*prompt.keys, message_key(reply)]
        if prompt.chain is None:
            number, self.started = self.started, self.started + 1
        else:
            number = prompt.chain.number
        chain = _Chain(number, messages, keys, call.tools, prompt.kwargs, outcome.prompt_ids + outcome.output_ids,
                       len(outcome.output_ids), prompt.text)
        # A chain is replaced whole, never changed, as `prompt` may read it in another thread.
        at = next((i for i, c in enumerate(self._chains) if c.number == number), None)
        if at is None:
            self._chains.append(chain)
            del self._chains[:-MAX_CHAINS]
        else:
            self._chains[at] = chain
        return number


class Tito:
    """`engine` is the engine kind's client module (`engines.kinds.get(kind).client`). `renderer` may be
    None: the engine's tokenizer folder and context length are then looked up (`model_facts`) by
    `warm()` (at start) or by the first call."""

    def __init__(self, renderer: Renderer | None, parser_name: str, router: Router, engine: ModuleType) -> None:
        self.renderer, self.parser_name, self.router, self.engine = renderer, parser_name, router, engine
        self.parser = parser_for(parser_name, renderer.chat_template) if renderer else None
        self.context_length: int | None = None
        self.defaults: dict[str, Any] | None = None  # the engine's sampling defaults (`sampling_defaults`)
        self._setup = asyncio.Lock()
        self._chains: dict[str, Chains] = {}

    async def _prepare(self, session_id: str) -> None:
        async with self._setup:
            if self.renderer is not None and self.context_length is not None and self.defaults is not None:
                return
            (folder, self.context_length), _ = await self.router.attempt(
                session_id, lambda client: self.engine.model_facts(client.get_json))
            defaults, _ = await self.router.attempt(
                session_id, lambda client: self.engine.sampling_defaults(client.find_json))
            if defaults is None:
                log.warning("tito: the engine does not say its sampling defaults (a vLLM not started by polar-hpc's "
                            "LAUNCH): what a call leaves unset is the engine's SamplingParams' default")
            self.defaults = defaults or {}
            if self.renderer is None:
                if not folder:
                    raise EngineError(502, "the engine names no tokenizer folder; set the topology's proxy.tokenizer")
                try:
                    self.renderer = await asyncio.to_thread(Renderer, folder)
                except ValueError as e:
                    raise EngineError(502, str(e)) from None
                self.parser = parser_for(self.parser_name, self.renderer.chat_template)
            renderer, parser, context_length = self._ready()
            log.info("tito: tokenizer %s, tool parser %s, context %d, sampling defaults %s", renderer.folder,
                     parser.name, context_length, self.defaults)

    def _ready(self) -> tuple[Renderer, ToolParser, int]:
        """The tokenizer, tool parser and context length: all set once `_prepare` returned."""
        assert self.renderer is not None and self.parser is not None and self.context_length is not None
        return self.renderer, self.parser, self.context_length

    async def warm(self) -> None:
        """Load the tokenizer now if the engine answers, so the first call need not wait."""
        try:
            await self._prepare("")
        except EngineError as e:
            log.info("tito: tokenizer not loaded yet (%s); the first call will retry", e.message)
        finally:
            self.router.forget("")

    def forget(self, session_id: str) -> None:
        self._chains.pop(session_id, None)

    async def answer(
        self, session_id: str, call: Call, emit: Callable[[str | ToolCall], Awaitable[None]]
    ) -> Outcome:
        await self._prepare(session_id)
        renderer, _, context_length = self._ready()
        chains = self._chains.setdefault(session_id, Chains())
        prompt = await offload(call.size, chains.prompt, renderer, call, context_length)
        budget = call.max_tokens
        if budget is None:  # as the engine's own OpenAI routes: the context left, within their default
            left = max(context_length - len(prompt.ids), 1)
            budget = min(left, (self.defaults or {}).get("max_tokens") or left)
        sampling = Sampling(budget, call.temperature, call.top_p, tuple(call.stop or ()), call.sampling,
                            call.top_logprobs, constraints.constraint(call, self._ready()[1])).defaulted(self.defaults or {})
        if call.n == 1:
            return await self._sample(session_id, chains, prompt, call, sampling, emit)
        # n > 1 (not streamed): each choice a sample of its own, with its own rid (and seed), each
        # recorded; any choice may be the one the harness goes on with, so each starts its own chain
        outcomes = await asyncio.gather(*(
            self._sample(session_id, chains, prompt if i == 0 else dataclasses.replace(prompt, chain=None),
                         dataclasses.replace(call, id=f"{call.id}-{i}"), _reseeded(sampling, i), emit)
            for i in range(call.n)))
        outcomes[0].choices = list(outcomes[1:])
        return outcomes[0]

    async def _sample(
        self, session_id: str, chains: Chains, prompt: _Prompt, call: Call, sampling: Sampling,
        emit: Callable[[str | ToolCall], Awaitable[None]],
    ) -> Outcome:
        (sampled, url, reply), retried = await self.router.attempt(
            session_id, lambda client: self._generate(client, prompt.ids, sampling, call, emit)
        )
        outcome = self._outcome(call, prompt.ids, sampled, url, reply)
        if sampled.prompt_ids is not None and sampled.prompt_ids != prompt.ids:
            raise EngineError(502, f"engine at {url} sampled from other prompt ids than it was sent", True)
        outcome.meta.update(rid=call.id, mode="tito", chain=chains.record(prompt, call, outcome),
                            sampling=sampling.record(), constrained=constraints.marks(call, sampling.constraint))
        if prompt.kwargs:
            outcome.meta["template_kwargs"] = prompt.kwargs
        if prompt.chain is None:
            outcome.meta["new_chain"] = prompt.why
        if retried:
            outcome.meta["retried"] = retried
        return outcome

    async def _generate(
        self, client: EngineClient, ids: list[int], sampling: Sampling, call: Call,
        emit: Callable[[str | ToolCall], Awaitable[None]],
    ) -> tuple[Sampled, str, tuple[str | None, list[ToolCall]]]:
        """The engine's sampled reply, its URL and the reply's (content, tool calls); when
        streaming, content and calls are emitted as they are read."""
        _, parser, _ = self._ready()
        # streamed from the engine also when the harness does not stream, where the kind's events
        # carry the version that sampled their tokens (a call may go on across a weight update)
        from_stream = call.stream or self.engine.VERSIONED_EVENTS
        path, body = self.engine.generate(ids, sampling, from_stream, call.id)
        generation, version = self.engine.Generation(), self.router.version(client.base_url)
        if call.tool_choice == "none":  # the reply is content, whatever it holds
            parser = NO_CALLS
        if not call.stream:
            with aborted.checked(client.base_url):
                if from_stream:
                    try:
                        async with contextlib.aclosing(client.stream_json(path, body)) as events:
                            text = "".join([generation.feed(event) async for event in events])
                    except EngineError as e:  # nothing reached the harness: another engine may answer
                        e.started = False
                        raise
                else:
                    text = generation.feed(await client.post_json(path, body))
            sampled = aborted.check(generation.result, version, client.base_url)
            content, calls = parser.parse(text, call.tools)
            return sampled, client.base_url, (content, [_tool_call(n, a) for n, a in calls][:1 if call.one_call else None])
        reader = CallReader(parser, call.tools)
        pieces: list[str] = []
        tool_calls: list[ToolCall] = []
        # closed at once when the call is cancelled (not when the generator is collected)
        async with contextlib.aclosing(client.stream_json(path, body)) as events:
            async for event in events:
                with aborted.checked(client.base_url):
                    piece, calls = reader.feed(generation.feed(event))
                parts: list[str | ToolCall] = [piece, *(_tool_call(n, a) for n, a in calls)]
                for part in parts:
                    if call.one_call and tool_calls and isinstance(part, ToolCall):
                        continue  # parallel tool calls off: the first call only
                    if part:
                        await emit(part)
                        if isinstance(part, str):
                            pieces.append(part)
                        else:
                            tool_calls.append(part)
        sampled = aborted.check(generation.result, version, client.base_url)
        rest = reader.finish()
        if rest:
            await emit(rest)
            pieces.append(rest)
        return sampled, client.base_url, ("".join(pieces) or None, tool_calls)

    def _outcome(
        self, call: Call, prompt_ids: list[int], sampled: Sampled, url: str,
        reply: tuple[str | None, list[ToolCall]],
    ) -> Outcome:
        content, calls = reply
        finish_reason = "length" if sampled.finish == "length" else "stop"
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return Outcome(
            rid=call.id, content=content, tool_calls=calls,
            finish_reason=finish_reason, prompt_ids=prompt_ids, output_ids=sampled.ids,
            output_logprobs=sampled.logprobs, weight_version=sampled.weight_version or "",
            engine_url=url, cached_tokens=sampled.cached_tokens,
            token_texts=[self._ready()[0].token_text(i) for i in sampled.ids] if call.logprobs else None,
            top_logprobs=sampled.top_logprobs, token_versions=sampled.token_versions,
        )


def _reseeded(sampling: Sampling, i: int) -> Sampling:
    """The sampling of choice `i` of n: its seed, when one was given, is the seed + i."""
    if "seed" not in sampling.controls:
        return sampling
    return dataclasses.replace(sampling, controls=dict(sampling.controls, seed=sampling.controls["seed"] + i))


def _tool_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(f"call_{new_id()[8:]}", name, arguments)  # 24 digits, as OpenAI's
