"""tito on real chat templates: tokenizer folders built offline in the style of three model
families, each with a template we wrote in that family's style (Qwen2.5: ChatML, tools in the system
turn, hermes calls; Qwen3: the tiny model's, with `<think>` reasoning dropped from earlier queries'
replies; Llama-3: header ids, `<|eot_id|>`, tool results as `ipython`), and a multi-turn tool session
driven through tito's `Renderer` and `Chains` as the proxy drives them: each call's prompt, then the
reply the model samples (what the template renders for it, so a well-trained model's tokens), then
the harness re-sending it all with the next tool result or user turn. The records go through the
`prefix_merge` builder: one trace per session where the template allows it, every merged prompt
exactly the template's rendering; where the template rewrites the past (Qwen3 drops earlier
queries' reasoning), a new chain, with tito's reason and the builder's."""

from __future__ import annotations

import json

import pytest

from polar_hpc.engines.tiny.template import CHAT_TEMPLATE as QWEN3_TEMPLATE
from polar_hpc.engines.tiny.tokenizer import write_tokenizer
from polar_hpc.proxy.calls import Call, Outcome, ToolCall, assistant_message
from polar_hpc.proxy.tito import Chains, Renderer
from polar_hpc.trajectory.builders import build
from polar_hpc.wire import CallRecord
from proxy.helpers import CALCULATOR

TOOLS = [{"type": "function", "function": CALCULATOR}]

QWEN25_TEMPLATE = r"""{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}
{%- else -%}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' -}}{%- endif -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
{{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) or (m.role == 'assistant' and not m.tool_calls) -%}
{{- '<|im_start|>' + m.role + '\n' + (m.content or '') + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant' -}}
{%- if m.content -%}{{- '\n' + m.content -}}{%- endif -%}
{%- for tc in m.tool_calls -%}
{%- set fn = tc.function if tc.function is defined else tc -%}
{{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

LLAMA3_TEMPLATE = r"""{{- '<|begin_of_text|>' -}}
{%- if messages[0].role == 'system' -%}
{%- set system = messages[0].content | trim -%}{%- set messages = messages[1:] -%}
{%- else -%}{%- set system = '' -%}{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools is not none -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' + system + '<|eot_id|>' -}}
{%- for m in messages -%}
{%- if m.role == 'user' and loop.first and tools is not none -%}
{{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
{{- 'Given the following functions, please respond with a JSON for a function call with its proper ' -}}
{{- 'arguments that best answers the given prompt.\n\n' -}}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' -}}
{{- 'Do not use variables.\n\n' -}}
{%- for tool in tools -%}{{- tool | tojson(indent=4) + '\n\n' -}}{%- endfor -%}
{{- m.content | trim + '<|eot_id|>' -}}
{%- elif m.role == 'assistant' and m.tool_calls -%}
{%- set fn = m.tool_calls[0].function -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{{- '{"name": "' + fn.name + '", "parameters": ' + (fn.arguments | tojson) + '}<|eot_id|>' -}}
{%- elif m.role in ['tool', 'ipython'] -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + m.content + '<|eot_id|>' -}}
{%- else -%}
{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + (m.content or '') | trim + '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""

FAMILIES = {
    "qwen2.5": dict(chat_template=QWEN25_TEMPLATE),
    "qwen3": dict(chat_template=QWEN3_TEMPLATE, added=["<think>", "</think>"]),
    "llama3": dict(chat_template=LLAMA3_TEMPLATE, eos="<|eot_id|>", special=[
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
        "<|python_tag|>"]),
}


def tool_call(i: int, expression: str) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}


def session(reasoning: bool) -> list[dict]:
    """Two user queries, the first solved in two tool steps; with `reasoning`, every reply reasons
    (as a field, or as a <think> block in the content, both as harnesses send it back)."""
    def think(text: str) -> dict:
        return {"reasoning_content": text} if reasoning else {}

    first_step = {"role": "assistant", "content": "", **think("First 2 + 3."), "tool_calls": [tool_call(1, "2 + 3")]}
    second_step = {"role": "assistant", "content": "<think>\nNow 5 * 4.\n</think>\n\n" if reasoning else "",
                   "tool_calls": [tool_call(2, "5 * 4")]}
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is (2 + 3) * 4?"},
        first_step,
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        second_step,
        {"role": "tool", "tool_call_id": "call_2", "content": "20"},
        {"role": "assistant", "content": "It is 20.", **think("Done.")},
        {"role": "user", "content": "And plus one?"},
        {"role": "assistant", "content": "", **think("Add one."), "tool_calls": [tool_call(3, "20 + 1")]},
        {"role": "tool", "tool_call_id": "call_3", "content": "21"},
        {"role": "assistant", "content": "It is 21."},
    ]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Renderer]:
    folder = tmp_path_factory.mktemp(request.param)
    write_tokenizer(folder, **FAMILIES[request.param])
    return request.param, Renderer(folder)


def sampled(r: Renderer, messages: list[dict], k: int) -> list[int]:
    """The ids a model following the template samples for reply `messages[k]`: the template's text
    for it (as rendered when it is the last turn), through its end token."""
    before, through = r.text(messages[:k], TOOLS, True), r.text(messages[: k + 1], TOOLS, False)
    assert through.startswith(before)
    ids = r.encode(through[len(before):])
    end = next(i for i, t in enumerate(ids) if t in r.eos_ids)
    return ids[: end + 1]


CONTEXT = 32768  # the engine's context length: far above these sessions


def run_session(r: Renderer, messages: list[dict]) -> tuple[list[CallRecord], list[list[int]]]:
    """Each assistant turn of `messages` as one call through tito's chains; the records and, for
    each call, its prompt as the template renders it."""
    chains, records, rendered = Chains(), [], []
    for k in (i for i, m in enumerate(messages) if m["role"] == "assistant"):
        call = Call(messages=messages[:k], tools=TOOLS)
        prompt = chains.prompt(r, call, CONTEXT)
        reply = messages[k]
        output = sampled(r, messages, k)
        calls = [ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in reply.get("tool_calls", [])]
        outcome = Outcome(call.id, reply["content"], calls, "tool_calls" if calls else "stop", prompt.ids, output,
                          [-0.5] * len(output), "v0", "http://engine")
        meta = {"mode": "tito", "chain": chains.record(prompt, call, outcome)}
        if prompt.chain is None:
            meta["new_chain"] = prompt.why
        records.append(CallRecord(
            session_id="s", call_index=len(records), api="openai_chat",
            request={"messages": call.messages, "tools": TOOLS},
            response={"choices": [{"message": assistant_message(outcome)}]}, prompt_ids=prompt.ids,
            output_ids=output, output_logprobs=outcome.output_logprobs, finish_reason=outcome.finish_reason,
            weight_version="v0", engine_url="http://engine", stream=False, t_start=0.0, t_end=0.0, meta=meta))
        rendered.append(r.encode(r.text(call.messages, TOOLS, True)))
    return records, rendered


def test_templates_render_in_their_family_style(family):
    name, r = family
    text = r.text(session(True), TOOLS, False)
    marks = {"qwen2.5": ["<|im_start|>system\n", '<tool_call>\n{"name": "calculator"', "<tool_response>\n5\n"],
             "qwen3": ["<think>\nAdd one.\n</think>\n\n<tool_call>", "<tool_response>\n21\n"],
             "llama3": ["<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>",
                        '{"name": "calculator", "parameters": {"expression": "2 + 3"}}<|eot_id|>']}[name]
    for mark in marks:
        assert mark in text, (name, mark)
    assert ("First 2 + 3." in text) is False  # an earlier query's reasoning: only Qwen3 renders any
    assert [r.tokenizer.id_to_token(i) for i in sorted(r.eos_ids)] == [FAMILIES[name].get("eos", "<|im_end|>")]


@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
def test_tool_session_merges_into_one_trace_or_records_why_not(family, reasoning):
    name, r = family
    records, rendered = run_session(r, session(reasoning))
    traces, metadata = build(records, "prefix_merge")
    assert len(records) == 5 and metadata["calls"] == 5
    for record, template_ids in zip(records, rendered):
        if record.call_index and "new_chain" not in record.meta:
            # merged: the chain's exact ids, then the template's glue, which is the template's rendering
            assert record.prompt_ids == template_ids, (name, record.call_index)
    if reasoning and name == "qwen3":
        # the second query's first call: the template drops the first query's reasoning
        assert len(traces) == 2 and metadata["chains"] == 2
        restart = records[3]
        assert restart.meta["new_chain"] == "template renders chain 0's history differently"
        assert restart.prompt_ids == rendered[3]
        assert metadata["history_restarts"] == ["call 3: template renders chain 0's history differently"]
        assert metadata["chain_breaks"] == [f"call 3: {_divergence(records[2], records[3])}"]
        assert "new_chain" not in records[4].meta  # and the new chain goes on merging
        return
    assert len(traces) == 1 and metadata["chains"] == 1 and metadata["chain_breaks"] == []
    assert "history_restarts" not in metadata
    trace = traces[0]
    assert (trace.prompt_ids.tolist() + trace.response_ids.tolist()) == rendered[-1] + records[-1].output_ids
    assert sum(trace.loss_mask) == sum(len(rec.output_ids) for rec in records)


def test_a_lone_reasoning_reply_dropped_by_the_template_starts_a_new_chain(tmp_path):
    """Qwen3: one reasoning reply, then a new query. Re-rendered, that reply loses its reasoning, so
    the chain's ids (which hold it) no longer start the template's rendering: a new chain, with the
    reason, rather than a prompt the template would never produce."""
    write_tokenizer(tmp_path, **FAMILIES["qwen3"])
    r = Renderer(tmp_path)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."},
    ]
    records, rendered = run_session(r, messages)
    assert records[1].meta["new_chain"] == "template renders chain 0's last reply differently"
    assert records[1].prompt_ids == rendered[1]
    assert "Greet back." not in r.decode(records[1].prompt_ids)
    assert len(build(records, "prefix_merge")[0]) == 2


def _divergence(previous: CallRecord, record: CallRecord) -> str:
    sequence = previous.prompt_ids + previous.output_ids
    at = next(i for i, (a, b) in enumerate(zip(sequence, record.prompt_ids)) if a != b)
    return f"prompt diverges from chain 0 at token {at}"
