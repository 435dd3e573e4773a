"""The tiny model's chat template: Qwen3's layout, written here.

ChatML turns; tools listed in the system turn; hermes tool calls (`<tool_call>` JSON
`</tool_call>`) in assistant turns; tool results as `<tool_response>` blocks in a user turn;
reasoning as `<think>\\n…\\n</think>\\n\\n` before an assistant turn's content. As Qwen3 does,
an assistant turn keeps its reasoning only after the last real user query (the reasoning of
earlier queries' replies is dropped), so a conversation renders as a prefix of its continuation
within one query, not across queries. Reasoning comes from `reasoning_content` or `reasoning`
(vLLM's field), else from a `<think>` block at the start of the content.
"""

from polar_hpc.engines.scripted.build_tokenizer import TEXT_MACRO

CHAT_TEMPLATE = TEXT_MACRO + r"""{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and ' -}}
{{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=messages | length - 1, searching=true) -%}
{%- for m in messages[::-1] -%}
{%- set i = messages | length - 1 - loop.index0 -%}
{%- if ns.searching and m.role == 'user' -%}
{%- set c = text(m.content) -%}
{%- if not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) -%}
{%- set ns.searching = false -%}{%- set ns.last_query = i -%}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
{%- set content = text(m.content) -%}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{%- if m.reasoning_content is string -%}{%- set reasoning = m.reasoning_content -%}
{%- elif m.reasoning is string -%}{%- set reasoning = m.reasoning -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1] -%}
{%- else -%}{%- set reasoning = '' -%}
{%- endif -%}
{%- set reasoning = reasoning.strip('\n') -%}
{%- set content = content.lstrip('\n') -%}
{{- '<|im_start|>assistant\n' -}}
{%- if loop.index0 > ns.last_query and reasoning -%}
{{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
{%- endif -%}
{{- content -}}
{%- for tc in (m.tool_calls or []) -%}
{%- set fn = tc.function if tc.function is defined else tc -%}
{%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
{%- if fn.arguments is string -%}{{- fn.arguments -}}
{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
