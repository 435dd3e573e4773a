"""The dashboard decodes a scripted run's tokens with the scripted engine's own tokenizer."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from polar_hpc.observe.tokens import run_tokenizer


def test_a_scripted_run_finds_the_scripted_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "topology.yaml").write_text("engine: {kind: scripted}\n")
    folder = run_tokenizer(tmp_path)
    assert folder is not None
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.decode(tok.encode("<|im_start|>assistant\nhi").ids, skip_special_tokens=False) == "<|im_start|>assistant\nhi"
