"""Tokenizer + ChatML chat template of the scripted engine.

`ChatFormat` loads an HF-format tokenizer folder (default: the committed scripted assets) and
renders conversations with the folder's `chat_template` exactly as transformers would (Jinja2
sandbox, trim_blocks/lstrip_blocks, a `tojson` that keeps key order and non-ASCII text).

Contract (the prefix-extension invariant): if the engine samples `encode(R) + [im_end_id]` after a
prompt P rendered with `add_generation_prompt=True`, then rendering the conversation extended with
the assistant message the OpenAI API returns for R (its content, or the tool calls
`proxy.tool_parsers.parse_tool_calls(R)` finds, arguments as a JSON string) tokenizes to
`encode(P) + encode(R) + [im_end_id] + ...`, token for token, provided R is canonical: no leading
whitespace, and tool calls written as the template writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

ASSET_DIR = Path(__file__).parent / "assets"


def _byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level alphabet: each printable stand-in character -> its byte."""
    direct = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    direct += range(ord("®"), 256)
    shifted = [b for b in range(256) if b not in direct]
    table = {chr(b): b for b in direct}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


class ChatFormat:
    """Encode/decode token ids and render chat prompts for one tokenizer folder."""

    def __init__(self, folder: Path = ASSET_DIR) -> None:
        self.folder = Path(folder)
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        config = json.loads((self.folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
        self._template = env.from_string(config["chat_template"])
        self._added = self.tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in self._added.items() if t.special)
        im_end_id = self.tokenizer.token_to_id("<|im_end|>")
        assert im_end_id is not None, f"{self.folder}: the tokenizer has no <|im_end|>"  # a ChatML one
        self.im_end_id: int = im_end_id
        self.eos_ids = frozenset({self.im_end_id, self.tokenizer.token_to_id("<|endoftext|>")})
        self.vocab_size = self.tokenizer.get_vocab_size()
        self._bytes = _byte_decoder()

    def encode(self, text: str) -> list[int]:
        """Token ids of text; added tokens in the text become their single ids."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ids; the non-special added tokens (`<tool_call>`...) are always kept."""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw UTF-8 bytes one token stands for (a token may hold part of a character)."""
        added = self._added.get(token_id)
        if added is not None:
            return added.content.encode()
        token = self.tokenizer.id_to_token(token_id)
        assert token is not None, f"token {token_id} is not in the vocabulary"  # ids come from it
        return bytes(self._bytes[c] for c in token)

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for OpenAI-style messages (and tools), rendered by the template."""
        return self._template.render(
            messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt
        )
