"""`passthrough` capture mode: the engine's OpenAI Chat route renders, samples and parses tools.

`Passthrough(router, model)`: `await answer(session_id, call, emit)` POSTs the call as a Chat
Completions body (the harness's own body for `openai_chat`) with `stream: false`,
`return_token_ids` and `logprobs` (SGLang >= 0.5.17 answers `choices[0].prompt_token_ids` /
`response_token_ids`), emits the whole content at once (the engine cannot stream token ids on
that route) and returns the `Outcome`; `EngineError` (502) if capture fields are missing,
`aborted.Aborted` if the engine aborted the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from polar_hpc.proxy import aborted
from polar_hpc.proxy.calls import Call, Outcome, ToolCall
from polar_hpc.proxy.engine_client import EngineError
from polar_hpc.proxy.routing import Router

ENGINE_PATH = "/v1/chat/completions"


class Passthrough:
    def __init__(self, router: Router, model: str) -> None:
        self.router, self.model = router, model

    async def warm(self) -> None:
        pass

    def forget(self, session_id: str) -> None:
        pass

    async def answer(
        self, session_id: str, call: Call, emit: Callable[[str], Awaitable[None]]
    ) -> Outcome:
        body = engine_request(call, self.model)

        async def ask(client):
            answer = await client.post_json(ENGINE_PATH, body)
            aborted.check_chat(answer)
            return answer, client.base_url

        (answer, url), retried = await self.router.attempt(session_id, ask)
        outcome = capture(answer, url)
        outcome.meta["mode"] = "passthrough"
        if retried:
            outcome.meta["retried"] = retried
        if outcome.content:
            await emit(outcome.content)
        return outcome


def engine_request(call: Call, model: str) -> dict[str, Any]:
    if call.chat_body is not None:
        body = {k: v for k, v in call.chat_body.items() if k != "stream_options"}
    else:
        body = {"messages": call.messages}
        if call.tools:
            body["tools"] = call.tools
        for key in ("max_tokens", "temperature", "top_p"):
            if getattr(call, key) is not None:
                body[key] = getattr(call, key)
        if call.stop:
            body["stop"] = call.stop
    body.update(model=model, stream=False, return_token_ids=True, logprobs=True)
    return body


def capture(answer: dict[str, Any], url: str) -> Outcome:
    try:
        choice = answer["choices"][0]
        message = choice["message"]
        entries = choice["logprobs"]["content"]
        outcome = Outcome(
            rid=str(answer["id"]),
            content=message.get("content"),
            tool_calls=[
                ToolCall(str(c["id"]), str(c["function"]["name"]), str(c["function"]["arguments"]))
                for c in message.get("tool_calls") or []
            ],
            finish_reason=msgspec.convert(choice["finish_reason"], str),
            prompt_ids=msgspec.convert(choice["prompt_token_ids"], list[int]),
            output_ids=msgspec.convert(choice["response_token_ids"], list[int]),
            output_logprobs=[msgspec.convert(e["logprob"], float) for e in entries],
            weight_version=msgspec.convert(answer["metadata"]["weight_version"], str),
            engine_url=url,
            cached_tokens=int(((answer.get("usage") or {}).get("prompt_tokens_details") or {})
                              .get("cached_tokens") or 0),
            token_texts=[str(e.get("token", "")) for e in entries],
        )
    except (KeyError, IndexError, TypeError, ValueError, msgspec.ValidationError) as e:
        problem = f"{type(e).__name__}: {e}"
        raise EngineError(502, f"engine answer lacks capture fields ({problem})") from None
    n_logprobs, n_ids = len(outcome.output_logprobs), len(outcome.output_ids)
    if n_logprobs != n_ids:
        raise EngineError(502, f"engine returned {n_logprobs} logprobs for {n_ids} tokens")
    outcome.meta["rid"] = outcome.rid
    return outcome
