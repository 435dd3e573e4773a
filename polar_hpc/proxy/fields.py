"""Every request field of each API the proxy serves: honoured, refused, or accepted with no effect.

`CHAT`, `RESPONSES` and `ANTHROPIC` map each top-level field of the API (as its owner documents it,
plus the engines' own sampling extensions harnesses send to OpenAI-compatible servers) to a `Field`:
- `honoured`: the adapter reads it into the `calls.Call` (its `how` says what it becomes);
- `no effect`: accepted and left unused, only where the API itself documents it changes nothing
  the model samples (ids for abuse monitoring, tags, storage and caching hints);
- `refused`: a 400 in the API's error shape naming the field, unless its value is one of `accept`
  (the API's own default, which asks for nothing the proxy lacks).
A field the table does not name is refused too ("unknown field"), so nothing is silently dropped.
`check(table, body)` applies the table to a body (a null value counts as absent, as the APIs treat
it). docs/proxy.md shows the tables; a test holds them to this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar_hpc.proxy.calls import BadRequest

HONOURED, NO_EFFECT, REFUSED = "honoured", "no effect", "refused"


@dataclass(frozen=True)
class Field:
    effect: str  # HONOURED | NO_EFFECT | REFUSED
    how: str  # one line for the docs' table
    accept: tuple[Any, ...] = ()  # refused fields: values accepted all the same


def _h(how: str) -> Field:
    return Field(HONOURED, how)


def _n(how: str) -> Field:
    return Field(NO_EFFECT, how)


def _r(how: str, *accept: Any) -> Field:
    return Field(REFUSED, how, accept)


_SAMPLING = {  # the same meaning in every API (engine sampling parameters)
    "temperature": _h("engine `temperature`"),
    "top_p": _h("engine `top_p`"),
    "top_k": _h("engine `top_k` (an engine extension, as vLLM and SGLang take it)"),
    "min_p": _h("engine `min_p` (an engine extension)"),
    "repetition_penalty": _h("engine `repetition_penalty` (an engine extension)"),
    "stream": _h("answered as the API's events while tokens are sampled"),
    "model": _h("answered by the run's model (`proxy.strict_model`: another name is 404)"),
    "metadata": _n("tags for the owner's dashboard; nothing is stored"),
    "service_tier": _n("the processing tier; the proxy has one"),
}
_OPENAI = {
    **_SAMPLING,
    "seed": _h("engine seed (SGLang `sampling_seed`, vLLM `seed`): the same seed samples the same ids"),
    "parallel_tool_calls": _h("`false`: the harness gets the reply's first tool call only"),
    "top_logprobs": _h("the engine's top alternatives at each sampled token (`logprobs` asked)"),
    "user": _n("an end-user id for abuse monitoring"),
    "safety_identifier": _n("an end-user id for abuse monitoring"),
    "prompt_cache_key": _n("a cache-routing hint; the engine's prefix cache needs none"),
    "prompt_cache_retention": _n("a cache-retention hint"),
    "prompt_cache_options": _n("cache breakpoints; the engine's prefix cache needs none"),
    "store": _n("whether the owner stores the output; the proxy stores nothing (stateless)"),
    "moderation": _r("no moderation runs here"),
}

CHAT: dict[str, Field] = {
    **_OPENAI,
    "stream_options": _h("`include_usage`: a usage chunk before `[DONE]`"),
    "messages": _h("rendered by the model's chat template (tito) or the engine's (passthrough); "
                   "image, audio and file parts are refused"),
    "tools": _h("`function` tools, rendered into the prompt; `strict: true` constrains a call's "
                "arguments to its schema; other tool types are refused"),
    "tool_choice": _h("`auto`; `none` (no call is parsed); `required` and a named function: "
                      "decoding constrained to tool calls by the engine"),
    "response_format": _h("`text`; `json_object` and `json_schema`: decoding constrained by the engine"),
    "max_completion_tokens": _h("engine max new tokens"),
    "max_tokens": _h("engine max new tokens (when `max_completion_tokens` is not given)"),
    "stop": _h("engine stop strings"),
    "presence_penalty": _h("engine `presence_penalty`"),
    "frequency_penalty": _h("engine `frequency_penalty`"),
    "logit_bias": _h("engine `logit_bias` (vLLM, SGLang); an engine without it answers 400"),
    "logprobs": _h("each sampled token's logprob, as the engine returned it"),
    "n": _h("tito: each choice a sample of its own (its own engine request; a seed + i), each recorded "
            "as a call; at most 16, not streamed; passthrough refuses n > 1"),
    "audio": _r("no audio output"),
    "modalities": _r("text output only", ["text"]),
    "prediction": _r("no predicted outputs"),
    "verbosity": _r("no verbosity control", "medium"),
    "web_search_options": _r("no web search"),
    "functions": _r("deprecated: send `tools`"),
    "function_call": _r("deprecated: send `tool_choice`"),
    "reasoning_effort": _h("the chat template's `reasoning_effort` where it reads one; `none` also "
                           "`enable_thinking: false`; refused where the template cannot express it"),
}

RESPONSES: dict[str, Field] = {
    **_OPENAI,
    "input": _h("messages, `function_call` (with a `namespace`: `NAMESPACE.NAME`) and `function_call_output` "
                "items (`reasoning` items are "
                "skipped); image and file parts are refused"),
    "instructions": _h("a system message first"),
    "stream_options": _n("`include_obfuscation`: padding of streamed events; none is added"),
    "tools": _h("`function` tools (`strict: true` constrains a call's arguments); `namespace` groups of "
                "them, rendered as `NAMESPACE.NAME` tools, their calls answered with `namespace`; other "
                "tool types are refused"),
    "tool_choice": _h("`auto`; `none`; `required` and `{type: function, name}`: decoding constrained "
                      "to tool calls by the engine"),
    "text": _h("`format`: `text`; `json_object` and `json_schema` constrained by the engine; "
               "`verbosity` other than `medium` refused"),
    "max_output_tokens": _h("engine max new tokens"),
    "include": _h("`message.output_text.logprobs`: each sampled token's logprob in the `output_text` part; "
                  "`reasoning.encrypted_content` (no reasoning items are returned, so none to include); "
                  "other values refused"),
    "top_logprobs": _h("the engine's top alternatives at each sampled token, in the `output_text` part's "
                       "`logprobs` (streamed: in `output_text.done`)"),
    "truncation": _r("the input is never truncated", "disabled"),
    "previous_response_id": _r("stateless: send the whole input"),
    "conversation": _r("stateless: send the whole input"),
    "background": _r("answered in the foreground only", False),
    "prompt": _r("no stored prompts"),
    "reasoning": _h("`effort` as Chat's `reasoning_effort`; `summary`, `context` and `mode` only at their "
                    "defaults (`auto`, `standard`): no reasoning items are returned"),
    "client_metadata": _n("the client's own ids (Codex sends its thread and turn); nothing is stored"),
    "max_tool_calls": _r("no built-in tools"),
    "context_management": _r("no server-side context management"),
    "access_programs": _r("no access programs"),
    "image": _r("no image generation"),
}

ANTHROPIC: dict[str, Field] = {
    **_SAMPLING,
    "messages": _h("text, `tool_use` and `tool_result` blocks (`thinking` blocks are skipped); "
                   "image and document blocks are refused"),
    "system": _h("a system message first"),
    "max_tokens": _h("engine max new tokens"),
    "stop_sequences": _h("engine stop strings"),
    "tools": _h("custom tools (`input_schema`; `strict: true` constrains a call's input); server "
                "tools are refused"),
    "tool_choice": _h("`auto`; `none`; `any` and `{type: tool, name}`: decoding constrained to tool "
                      "calls by the engine; `disable_parallel_tool_use`: the first call only"),
    "output_config": _h("`format` (`json_schema`): decoding constrained by the engine; `effort` other than the "
                        "default `high` refused"),
    "cache_control": _n("a prompt-caching marker; the engine's prefix cache needs none"),
    "inference_geo": _n("where the owner runs inference"),
    "thinking": _h("`enabled`: the chat template's `thinking_budget` (and `enable_thinking: true`), refused "
                   "where it reads no budget; `disabled`: `enable_thinking: false` where it reads one; "
                   "`adaptive`: as without the field; `display` `omitted` only"),
    "context_management": _r("no context editing; an edit that clears no thinking (`keep: all`) asks for nothing",
                             {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
    "container": _r("no code-execution containers"),
    "diagnostics": _r("no cache diagnostics"),
    "speed": _r("one speed", "standard"),
    "user_profile_id": _r("no user profiles"),
    "workspace_id": _r("no workspaces"),
}

TABLES = {"openai_chat": CHAT, "openai_responses": RESPONSES, "anthropic_messages": ANTHROPIC}


def check(table: dict[str, Field], body: dict[str, Any]) -> None:
    """BadRequest naming the first field of `body` the table refuses or does not know."""
    for key, value in body.items():
        if value is None:
            continue
        field = table.get(key)
        if field is None:
            raise BadRequest(f"unknown field {key!r}: this proxy does not support it", key)
        if field.effect == REFUSED and value not in field.accept:
            raise BadRequest(f"{key!r} is not supported: {field.how}", key)
