"""Build the tiny model: `python -m polar_hpc.engines.tiny OUT_DIR` (in a Python with torch and
transformers, e.g. the vLLM venv: `$POLAR_VLLM_PYTHON -m polar_hpc.engines.tiny OUT_DIR`).

OUT_DIR becomes an HF model folder vLLM serves: `config.json`, `model.safetensors`,
`generation_config.json`, `tokenizer.json`, `tokenizer_config.json` (with `template.CHAT_TEMPLATE`).
The tokenizer (`tokenizer.py`) is the scripted engine's byte-level BPE plus `<think>` (4096) and `</think>` (4097).
The model is a Qwen2ForCausalLM (hidden 128, 2 layers, 4 heads of dim 32, float32, tied
embeddings), trained from a fixed seed with Adam on torch's one thread, then sharpened (see
`train`) until every taught token is near certain, on `conversation.lessons()`: the calculator
example's conversations, so that `examples/calculator/agent.py` answers "What is 17 * 23 + 4?"
with a calculator call and then 395, and mini-swe-agent (examples/calculator/mini.yaml) runs
`echo $((17 * 23 + 4))`, answers 395 and submits, at temperature 1 too. Same source, same bytes: the output is deterministic.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads: 2 busy cores oversubscribe

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from polar_hpc.engines.tiny.conversation import lessons
from polar_hpc.engines.tiny.template import CHAT_TEMPLATE
from polar_hpc.engines.tiny.tokenizer import write_tokenizer

THINK_TOKENS = ["<think>", "</think>"]
SEED = 0
STEPS = 150
LR = 3e-3
SHARPEN = 4.0


def examples(out: Path) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) sequences: each lesson's prompt and reply, labels -100 but on the reply's
    tokens; a lesson whose ids start another's (an earlier turn of the same conversation) is
    taught inside that one."""
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    found: list[tuple[list[int], list[int]]] = []
    for messages, tools, reply in lessons():
        prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                               add_generation_prompt=True)
        p = tokenizer.encode(prompt, add_special_tokens=False)
        r = tokenizer.encode(reply, add_special_tokens=False)
        found.append((p + r, [-100] * len(p) + r))
    kept: list[tuple[list[int], list[int]]] = []
    for ids, labels in sorted(found, key=lambda e: -len(e[0])):
        longer = next((k for k in kept if k[0][: len(ids)] == ids), None)
        if longer is None:
            kept.append((ids, labels))
        else:
            longer[1][: len(ids)] = [a if b == -100 else b for a, b in zip(longer[1], labels)]
    return kept


def train(model: Qwen2ForCausalLM, data: list[tuple[list[int], list[int]]]) -> float:
    """Adam on the taught tokens only (the head runs on those alone); then the final norm is
    scaled by SHARPEN, which is sampling the trained model at temperature 1/SHARPEN. Returns the
    largest -log p of a taught token then (about the chance that sampling misses it)."""
    width = max(len(ids) for ids, _ in data)
    ids = torch.tensor([i + [0] * (width - len(i)) for i, _ in data])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in data])
    labels = torch.tensor([lab[1:] + [-100] * (width - len(lab) + 1) for _, lab in data])
    taught = labels != -100
    targets = labels[taught].unsqueeze(-1)

    def logprobs(dtype: torch.dtype = torch.float32) -> torch.Tensor:
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[taught]
        return torch.log_softmax(model.lm_head(hidden).to(dtype), -1).gather(-1, targets)

    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    for _ in range(STEPS):
        loss = -logprobs().mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(SHARPEN)
        return -logprobs(torch.float64).min().item()


def _untyped(**kwargs: Any) -> dict[str, Any]:
    """Config keys the typed signature of another transformers release may not list (passed on as is)."""
    return kwargs


def build(out: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    write_tokenizer(out, CHAT_TEMPLATE, THINK_TOKENS)
    vocab = len(Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab())
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=2,
        **_untyped(head_dim=32, torch_dtype="float32"),
    )
    model = Qwen2ForCausalLM(config)
    miss = train(model, examples(out))
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=2).save_pretrained(out)
    print(f"tiny model: {sum(p.numel() for p in model.parameters())} parameters, {STEPS} steps, "
          f"largest miss per taught token {miss:.1e}, {time.monotonic() - started:.1f} s")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m polar_hpc.engines.tiny OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    # Built aside and renamed in, so a folder that exists is a whole model.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        build(Path(tmp) / "model")
        if out.exists():
            print(f"{out} exists; not replaced", file=sys.stderr)
            return 2
        os.rename(Path(tmp) / "model", out)
    return 0
