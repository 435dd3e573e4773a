"""POST /v1/chat/completions of the scripted engine: OpenAI Chat Completions over the model.

Renders messages + tools with the ChatML template, generates like /generate (the final
`<|im_end|>` is sampled and counted), parses hermes tool calls when tools are offered. Beyond
OpenAI: `return_token_ids` adds `prompt_token_ids` and `response_token_ids` to the choice (in a
stream: to the chunk carrying finish_reason), `choices[0].matched_stop` is SGLang's, and the
top-level `metadata.weight_version` is the engine's (in a stream: on the finish chunk). A
generation aborted by /pause_generation ends with finish_reason "abort" and the text so far.
`logprobs.content` aligns 1:1 with response_token_ids; in a stream each token's entry comes in its
own chunk. Only n=1; asking for top_logprobs alternatives, a logit bias or constrained decoding
(tool_choice required or named, strict tools, a JSON response_format) is refused (400).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import jinja2
from aiohttp import web

from polar_hpc.engines.scripted.http import (
    MODEL, get_bool, get_int, get_stop, read_json, sse,
)
from polar_hpc.engines.scripted.model import BadRequest, Generation, SamplingParams, ScriptedModel
from polar_hpc.engines.scripted.weights import decode
from polar_hpc.proxy.tool_parsers import parse_tool_calls


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    model = request.app[MODEL]
    body = await read_json(request)
    messages, tools = _messages(body), _tools(body)
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    max_tokens = get_int(body, "max_completion_tokens", None, minimum=1)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", None, minimum=1)
    if get_int(body, "top_logprobs", 0):
        raise BadRequest("the scripted engine has no alternatives to return (top_logprobs)", "top_logprobs")
    _refuse_constraints(body)
    with_logprobs, with_ids = get_bool(body, "logprobs"), get_bool(body, "return_token_ids")
    stream, options = get_bool(body, "stream"), body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    try:
        prompt_ids = model.fmt.encode(model.fmt.render(messages, tools))
    except (jinja2.TemplateError, TypeError, ValueError) as e:  # e.g. a tool call without a name
        raise BadRequest(f"cannot render the messages: {e}", "messages") from None
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    params = SamplingParams(max_new_tokens=max_tokens, stop=get_stop(body))
    gen = model.generate("/v1/chat/completions", rid, prompt_ids, params, started)
    content, calls = parse_tool_calls(gen.text) if tools else (gen.text, [])
    tool_calls = [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": call}
        for call in calls
    ]
    finish = gen.finish_reason["type"]  # "stop" | "length"
    choice_end: dict[str, Any] = {
        "finish_reason": "tool_calls" if calls and finish == "stop" else finish,
        "matched_stop": gen.finish_reason.get("matched"),
    }
    if with_ids:
        choice_end.update(prompt_token_ids=gen.prompt_ids, response_token_ids=gen.output_ids)
    head = {"id": rid, "created": int(time.time()), "model": model.model_name}
    reply = _Reply(model, gen, content, tool_calls, choice_end, head, with_ids)
    if stream:
        return await sse(request, _chunks(request, reply, with_logprobs, include_usage))
    k = await decode(request, gen, len(gen.output_ids))
    if k < len(gen.output_ids):
        reply = reply.aborted(k)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    logprobs = None
    if with_logprobs:
        logprobs = {"content": [reply.logprob(i) for i in range(k)]}
    choice = {"index": 0, "message": message, "logprobs": logprobs, **reply.choice_end}
    return web.json_response({
        **head, "object": "chat.completion", "choices": [choice], "usage": reply.usage(),
        "metadata": reply.metadata(),
    })


@dataclass(frozen=True)
class _Reply:
    model: ScriptedModel
    gen: Generation
    content: str | None
    tool_calls: list[dict[str, Any]]
    choice_end: dict[str, Any]  # finish_reason, matched_stop (+ token ids)
    head: dict[str, Any]  # id, created, model
    with_ids: bool

    def aborted(self, k: int) -> _Reply:
        """The reply of a generation aborted after k tokens."""
        end: dict[str, Any] = {"finish_reason": "abort", "matched_stop": None}
        if self.with_ids:
            end.update(prompt_token_ids=self.gen.prompt_ids, response_token_ids=self.gen.output_ids[:k])
        return _Reply(self.model, self.gen, self.gen.texts[k], [], end, self.head, self.with_ids)

    def usage(self) -> dict[str, Any]:
        prompt, completion = len(self.gen.prompt_ids), len(self.gen.output_ids)
        return {
            "prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.gen.cached_tokens},
        }

    def metadata(self) -> dict[str, Any]:
        return {"weight_version": self.model.weight_version}

    def logprob(self, i: int) -> dict[str, Any]:
        token, fmt = self.gen.output_ids[i], self.model.fmt
        return {
            "token": fmt.decode([token]), "logprob": self.gen.logprobs[i],
            "bytes": list(fmt.token_bytes(token)), "top_logprobs": [],
        }


async def _chunks(
    request: web.Request, reply: _Reply, with_logprobs: bool, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """chat.completion.chunk events: role, one per token (content delta, logprobs), tool calls,
    finish (+ token ids, metadata), usage if asked."""
    head = {**reply.head, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], top: dict[str, Any] | None = None, **choice: Any) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **choice}
        return {**head, "choices": [choice], **(top or {})}

    yield chunk({"role": "assistant", "content": ""})
    sent, gen = "", reply.gen
    for k in range(1, len(gen.output_ids) + 1):
        if await decode(request, gen, k) < k:
            yield chunk({}, {"metadata": reply.metadata()}, **reply.aborted(k - 1).choice_end)
            return
        visible = os.path.commonprefix([gen.texts[k], reply.content or ""])
        if visible != sent or with_logprobs:
            entry = {"content": [reply.logprob(k - 1)]} if with_logprobs else None
            yield chunk({"content": visible[len(sent):]}, logprobs=entry)
            sent = visible
    if reply.tool_calls:
        yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(reply.tool_calls)]})
    yield chunk({}, {"metadata": reply.metadata()}, **reply.choice_end)
    if include_usage:
        yield {**head, "choices": [], "usage": reply.usage()}


def _refuse_constraints(body: dict[str, Any]) -> None:
    """What it cannot honour (its replies come from rules, not a distribution it could constrain)."""
    choice, form = body.get("tool_choice"), body.get("response_format")
    strict = any(isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("strict")
                 for t in body.get("tools") or [])
    for key, asked in (("tool_choice", choice not in (None, "auto", "none")), ("tools", strict),
                       ("response_format", isinstance(form, dict) and form.get("type") != "text"),
                       ("logit_bias", bool(body.get("logit_bias")))):
        if asked:
            raise BadRequest(f"the scripted engine cannot constrain or bias decoding ({key!r})", key)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'", "messages")
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools the prompt offers (none when tool_choice is "none")."""
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise BadRequest("'tools' must be a list of objects", "tools")
    return None if body.get("tool_choice") == "none" else (tools or None)
