"""Build the scripted engine's tokenizer: `python -m polar_hpc.engines.scripted.build_tokenizer [OUT_DIR]`.

Trains a small byte-level BPE (HF `tokenizers`, vocabulary of 4096 ids) on a corpus generated here
from a fixed seed (English-ish words, numbers, arithmetic, JSON tool calls, code), and writes
`tokenizer.json` + `tokenizer_config.json` (HF format, with the ChatML chat template) to OUT_DIR,
by default `polar_hpc/engines/scripted/assets/`. The output is byte-for-byte deterministic; the
generated files are committed, so this only needs rerunning when the corpus or template changes.

Ids: 0 `<|endoftext|>`, 1 `<|im_start|>`, 2 `<|im_end|>` (special); 4092 `<tool_call>`,
4093 `</tool_call>`, 4094 `<tool_response>`, 4095 `</tool_response>` (added, not special).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ASSET_DIR = Path(__file__).parent / "assets"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 4096

# ChatML with hermes-style tool calls. Rendered with trim_blocks/lstrip_blocks (as transformers
# does) and a `tojson` that keeps key order and non-ASCII text.
# `text(content)`: a message's text, from a string or a list of text parts (shared with engines.tiny)
TEXT_MACRO = r"""{%- macro text(c) -%}
{%- if c is string -%}{{- c -}}
{%- elif c is iterable -%}
{%- for p in c -%}{%- if p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
"""
CHAT_TEMPLATE = TEXT_MACRO + r"""{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to help with the request.\n' -}}
{{- 'The function signatures are within <tools></tools>:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nTo call a function, reply with one JSON object per call within ' -}}
{{- '<tool_call></tool_call> tags:\n<tool_call>\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(m.content) + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- elif m.role == 'assistant' -%}
{%- set content = text(m.content) -%}
{{- '<|im_start|>assistant\n' + content -}}
{%- for tc in (m.tool_calls or []) -%}
{%- set fn = tc.function if tc.function is defined else tc -%}
{%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
{%- if fn.arguments is string -%}{{- fn.arguments -}}
{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + text(m.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

WORDS = """
the a an and or but if then else when while for to of in on at by with from into over under
is are was were be been being have has had do does did can could will would should may might
must shall not no yes all any each every some many few more most other such only own same so
than too very just also now here there where why how what which who whom whose this that these
those it its they them their we us our you your he him his she her i me my mine one two three
four five six seven eight nine ten hundred thousand million first second third last next number
answer question result value sum total product difference quotient remainder equal equals plus
minus times divided multiply add subtract compute calculate evaluate expression function tool
call response request message user assistant system model agent task step plan check verify
test run file read write open close list show print return error output input data text word
line code command shell python script server client engine token prompt sample reward policy
train training trace batch shard version weight update time second minute hour day today work
help please thanks thank sure okay great good bad new old big small long short high low right
left true false null none empty full start stop end begin finish done ready wait try again
people world life way thing place part case point group problem fact hand eye house home water
room mother area money story month lot study book job night game idea body city name team
make know think take see come want look use find give tell feel become leave put mean keep let
seem turn need move live believe hold bring happen provide sit stand lose pay meet include
continue set learn change lead understand watch follow create speak spend grow offer remember
consider appear buy serve die send expect build stay fall cut reach kill remain suggest raise
""".split()

NAMES = ["calculator", "get_weather", "search", "read_file", "write_file", "run_shell", "lookup"]
KEYS = ["expression", "city", "query", "path", "content", "command", "units", "limit", "id"]
CODE = [
    "def {f}({a}, {b}):\n    return {a} {op} {b}\n",
    "for {a} in range({n}):\n    print({a})\n",
    "if {a} > {n}:\n    {b} = {a} - {n}\nelse:\n    {b} = 0\n",
    "import json\n\ndata = json.loads({a})\nprint(data[\"{k}\"])\n",
    "class {F}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n",
    "$ ls -la /tmp/{a}\n$ cat {a}.txt | grep {b}\n",
    "{a} = [{n}, {m}, {n} {op} {m}]\nassert len({a}) == 3\n",
    "const {a} = await fetch(`/api/{k}?id={n}`);\nif (!{a}.ok) throw new Error(\"{b}\");\n",
]


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return str(rng.randint(0, 100))
    if kind < 0.85:
        return str(rng.randint(100, 100000))
    return f"{rng.uniform(0, 1000):.{rng.randint(1, 3)}f}"


def _expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 1 or rng.random() < 0.5:
        return _number(rng)
    left, right = _expression(rng, depth + 1), _expression(rng, depth + 1)
    expr = f"{left} {rng.choice('+-*/')} {right}"
    return f"({expr})" if depth and rng.random() < 0.5 else expr


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), _number(rng))
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!", ":", ","])


def _tool_json(rng: random.Random) -> str:
    name = rng.choice(NAMES)
    if name == "calculator":
        arguments = {"expression": _expression(rng)}
    else:
        arguments = {k: rng.choice([_number(rng), rng.choice(WORDS)]) for k in rng.sample(KEYS, 2)}
    if rng.random() < 0.5:
        return json.dumps({"name": name, "arguments": arguments})
    properties = {k: {"type": "string", "description": _sentence(rng)} for k in arguments}
    schema = {"type": "object", "properties": properties, "required": list(arguments)}
    function = {"name": name, "description": _sentence(rng), "parameters": schema}
    return json.dumps({"type": "function", "function": function})


def _code(rng: random.Random) -> str:
    a, b = rng.sample(WORDS[60:200], 2)
    return rng.choice(CODE).format(
        f=rng.choice(WORDS) + "_" + rng.choice(WORDS), F=rng.choice(WORDS).capitalize(),
        a=a, b=b, k=rng.choice(KEYS), n=_number(rng), m=_number(rng), op=rng.choice("+-*/"),
    )


def corpus(lines: int = 30000, seed: int = 0) -> list[str]:
    """The deterministic training corpus: `lines` mixed snippets from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.40:
            out.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 3))))
        elif kind < 0.60:
            expr = _expression(rng)
            out.append(rng.choice([f"What is {expr}?", f"The answer is {_number(rng)}.", expr]))
        elif kind < 0.80:
            out.append(_tool_json(rng))
        else:
            out.append(_code(rng))
    return out


def build(out_dir: Path = ASSET_DIR) -> None:
    """Train the tokenizer and write tokenizer.json + tokenizer_config.json into out_dir."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"got {tokenizer.get_vocab_size()} ids, expected {VOCAB_SIZE}")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    decoder = {
        str(i): {
            "content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
            "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special,
        }
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 8192,
        "chat_template": CHAT_TEMPLATE,
    }
    text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    (out_dir / "tokenizer_config.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else ASSET_DIR)
