"""Tokenizer folders made from the scripted engine's byte-level BPE, with added tokens and a chat
template of our choosing (the tiny model's, and the template tests' model families).

`write_tokenizer(out, chat_template, added, special, eos)` writes `tokenizer.json` and
`tokenizer_config.json` (HF format) to `out`: the scripted tokenizer's 4096 ids, then `added`
(plain added tokens, as Qwen's `<think>`) and `special` (special tokens, as Llama-3's headers)
in that order; `eos` is the end-of-turn token. Text is normalized and pre-tokenized as Qwen2's
tokenizer does (NFC, Qwen2's split pattern), since transformers loads a folder whose config.json
says `qwen2` with that tokenizer class: the ids are the same whether or not config.json is there.
Needs only `tokenizers`, not torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers

from polar_hpc.engines.scripted.build_tokenizer import ASSET_DIR

SOURCE = ASSET_DIR
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def write_tokenizer(out: Path, chat_template: str, added: Sequence[str] = (), special: Sequence[str] = (),
                    eos: str = "<|im_end|>") -> None:
    tokenizer = Tokenizer.from_file(str(SOURCE / "tokenizer.json"))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = json.loads((SOURCE / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                 "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    config["additional_special_tokens"] = [*config["additional_special_tokens"], *special]
    config["eos_token"] = eos
    config["chat_template"] = chat_template
    text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(text, encoding="utf-8")
