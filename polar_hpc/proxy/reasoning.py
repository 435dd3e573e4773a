"""Reasoning settings, passed to the model's chat template where its source reads them.

The API adapters put each API's reasoning field into the `calls.Call` as one `calls.Reasoning`: Chat's
`reasoning_effort` and Responses' `reasoning.effort` as `effort` (OpenAI's levels: none, minimal,
low, medium, high, xhigh, max); Anthropic's `thinking` as `think` (`enabled`: True with its
`budget_tokens`; `disabled`: False; `adaptive`, the model deciding, asks nothing).
`template_kwargs(asked, template)` is the variables the chat template is rendered with (tito: by
the proxy; passthrough: sent as the engine's `chat_template_kwargs`), chosen by the names the
template's source reads (`chat_template.variables`), as transformers' `apply_chat_template(**kwargs)`
passes them:
- `reasoning_effort` (gpt-oss): the effort level as given;
- `enable_thinking` (Qwen3 and others with a thinking switch): false for effort `none` or disabled
  thinking, true for enabled thinking;
- `thinking_budget` (Seed-OSS): the budget in tokens of enabled thinking.
What the template cannot express is a BadRequest naming the harness's field: an effort level but
`none` without `reasoning_effort` in the template, effort `none` with neither variable, a thinking
budget without `thinking_budget`. Disabled thinking on a template with no switch asks for nothing:
it is Anthropic's default, and such a template has no thinking to turn off.
"""

from __future__ import annotations

from typing import Any

from polar_hpc.proxy.calls import BadRequest, Reasoning
from polar_hpc.proxy.chat_template import variables

EFFORT, SWITCH, BUDGET = "reasoning_effort", "enable_thinking", "thinking_budget"


def template_kwargs(asked: Reasoning | None, template: str) -> dict[str, Any]:
    """The chat template's variables that honour `asked` ({} when nothing is asked), or BadRequest."""
    if asked is None:
        return {}
    reads = variables(template)
    if asked.effort is not None:
        out: dict[str, Any] = {EFFORT: asked.effort} if EFFORT in reads else {}
        if asked.effort == "none" and SWITCH in reads:
            out[SWITCH] = False
        if not out:
            raise BadRequest(f"{asked.field} {asked.effort!r}: the model's chat template takes "
                             + ("no effort levels, only thinking off (enable_thinking): send 'none' or leave it out"
                                if SWITCH in reads else "no reasoning setting (it reads neither reasoning_effort "
                                "nor enable_thinking)"), asked.field)
        return out
    if asked.think is False:
        return {SWITCH: False} if SWITCH in reads else {}
    if asked.think is True:
        if BUDGET not in reads:
            raise BadRequest(f"{asked.field}.budget_tokens: the model's chat template takes no thinking budget "
                             "(it reads no thinking_budget); send {type: adaptive} to let the model think as "
                             "it would, or {type: disabled}", f"{asked.field}.budget_tokens")
        return {BUDGET: asked.budget, **({SWITCH: True} if SWITCH in reads else {})}
    return {}
