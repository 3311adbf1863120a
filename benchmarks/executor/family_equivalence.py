"""Largest |difference| between zoexec's block-wise logits and transformers' own forward
of the same weights, for each catalogue tiny-* model in fp32 and bf16 (seeded init plus
noise, 2 rows of 24 tokens). docs/models.md quotes what it prints.

    .venv/bin/python benchmarks/executor/family_equivalence.py
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from zoexec.model.export import hf_tensors
from zoexec.model.families import bind_block
from zoexec.store.loading import build_parts
from zoplan.models import get_model

MODELS = ("tiny-opt", "tiny-llama", "tiny-qwen3", "tiny-qwen2", "tiny-mistral", "tiny-gemma",
          "tiny-gemma2", "tiny-gpt2", "tiny-gptneox")


def max_difference(name: str, precision: str) -> float:
    spec = get_model(name)
    parts, flats = build_parts(spec, seed=1, param_dtype=precision, compute_dtype=precision)
    gen = torch.Generator().manual_seed(0)
    for flat in flats:
        flat.add_((torch.randn(flat.shape, generator=gen) * 0.05).to(flat.dtype))
    hf = AutoModelForCausalLM.from_config(parts.config, dtype=parts.dtype,
                                          attn_implementation=parts.config._attn_implementation)
    hf.load_state_dict(dict(hf_tensors(parts, flats)), strict=False)
    ids = torch.randint(0, spec.vocab, (2, 24), generator=gen)
    with torch.no_grad():
        hidden, ctx = parts.embed(ids)
        for flat in flats:
            bind_block(parts, flat.to(parts.dtype, copy=True))
            hidden = parts.block_forward(hidden, ctx)
        return (parts.logits(hidden).float() - hf.eval()(ids).logits.float()).abs().max().item()


def main() -> None:
    for name in MODELS:
        print(f"{name:14} " + "  ".join(f"{p} {max_difference(name, p):.3g}" for p in ("fp32", "bf16")))


if __name__ == "__main__":
    main()
