"""`passthrough` capture mode: the engine's OpenAI Chat route renders, samples and parses tools.

`Passthrough(router, model, engine, tokenizer)`: `await answer(session_id, call, emit)` sends the call as a
Chat Completions body (the harness's own body for `openai_chat`), not streamed, with prompt ids,
sampled ids and logprobs asked for (the engine kind's client's `chat`, `engines.capture`), emits
the whole content at once (the engines cannot stream token ids on that route) and returns the
`Outcome` (its `meta` with the Chat sampling fields sent and `constraints.marks`: the engine's chat
route decodes under what the body asks); `EngineError` (502) if capture fields are missing,
`aborted.Aborted` if the engine aborted the call. Other APIs' calls become Chat bodies with their
tool choice, response format and sampling controls in Chat's fields. A call's reasoning settings
go as the body's `chat_template_kwargs` (`reasoning.template_kwargs`, read off the model's chat
template: from the `tokenizer` folder, else the engine's, loaded by the first call that asks for
reasoning; the harness's own `reasoning_effort` is not forwarded), recorded in `meta`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from polar_hpc.proxy import aborted, constraints
from polar_hpc.proxy.calls import BadRequest, Call, Outcome, ToolCall
from polar_hpc.proxy.chat_template import pick, read_templates
from polar_hpc.proxy.engine_client import EngineError
from polar_hpc.proxy.reasoning import template_kwargs
from polar_hpc.proxy.routing import Router


class Passthrough:
    def __init__(self, router: Router, model: str, engine: ModuleType, tokenizer: str | None = None) -> None:
        self.router, self.model, self.engine, self.tokenizer = router, model, engine, tokenizer
        self._templates: dict[str, str] | None = None

    async def warm(self) -> None:
        pass

    def forget(self, session_id: str) -> None:
        pass

    async def answer(
        self, session_id: str, call: Call, emit: Callable[[str], Awaitable[None]]
    ) -> Outcome:
        if call.n > 1:
            raise BadRequest("n > 1 is captured in tito mode only (each choice a sample of its own)", "n")
        kwargs = template_kwargs(call.reasoning, pick(await self._read_templates(session_id), call.tools)) \
            if call.reasoning is not None else {}
        path, body = self.engine.chat(chat_body(call, self.model, kwargs))

        async def ask(client):
            version = self.router.version(client.base_url)
            answer = await client.post_json(path, body)
            return aborted.check(lambda: self.engine.chat_answer(answer), version, client.base_url), client.base_url

        (s, url), retried = await self.router.attempt(session_id, ask)
        outcome = Outcome(
            rid=s.rid, content=s.content, tool_calls=[ToolCall(*c) for c in s.tool_calls],
            finish_reason=s.finish, prompt_ids=s.prompt_ids or [], output_ids=s.ids,
            output_logprobs=s.logprobs, weight_version=s.weight_version or "", engine_url=url,
            cached_tokens=s.cached_tokens, token_texts=s.token_texts, top_logprobs=s.top_logprobs,
        )
        outcome.meta.update(rid=s.rid, mode="passthrough", sampling={k: body[k] for k in SAMPLING if k in body},
                            constrained=constraints.marks(call, None))
        if kwargs:
            outcome.meta["template_kwargs"] = kwargs
        if retried:
            outcome.meta["retried"] = retried
        if outcome.content:
            await emit(outcome.content)
        return outcome

    async def _read_templates(self, session_id: str) -> dict[str, str]:
        """The model's chat templates (from `tokenizer`, else the folder the engine names)."""
        if self._templates is None:
            folder = self.tokenizer
            if folder is None:
                (folder, _), _ = await self.router.attempt(
                    session_id, lambda client: self.engine.model_facts(client.get_json))
            if not folder:
                raise EngineError(502, "the engine names no tokenizer folder to read the chat template's "
                                  "reasoning settings from; set the topology's proxy.tokenizer")
            try:
                self._templates = await asyncio.to_thread(read_templates, Path(folder))
            except ValueError as e:
                raise EngineError(502, str(e)) from None
        return self._templates


def chat_body(call: Call, model: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI Chat body of a call, naming the run's model, not streamed, with the chat template
    variables `kwargs` (the call's reasoning settings)."""
    if call.chat_body is not None:
        body = {k: v for k, v in call.chat_body.items() if k not in ("stream_options", "reasoning_effort")}
    else:
        body = {"messages": call.messages}
        if call.tools:
            body["tools"] = call.tools
        for key in ("max_tokens", "temperature", "top_p"):
            if getattr(call, key) is not None:
                body[key] = getattr(call, key)
        if call.stop:
            body["stop"] = call.stop
        body.update(call.sampling)
        if call.top_logprobs:
            body["top_logprobs"] = call.top_logprobs
        if call.tool_choice != "auto":
            choice = call.tool_choice
            body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function", "function": choice}
        if call.one_call:
            body["parallel_tool_calls"] = False
        if call.response_format is not None:
            f = call.response_format
            body["response_format"] = f if f["type"] == "json_object" else {
                "type": "json_schema", "json_schema": {"name": "answer", "schema": f["schema"]}}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    body.update(model=model, stream=False)
    return body


# the Chat fields that say how the engine samples: the record's `meta["sampling"]`
SAMPLING = ("max_completion_tokens", "max_tokens", "temperature", "top_p", "stop", "seed", "top_k", "min_p",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "top_logprobs", "n")
