"""Per-token memory of an inference-mode forward: the planner's terms against what torch
holds, on the CPU, for OPT-125m- and OPT-1.3B-shaped models (random weights, built from
configs: nothing downloaded) at batch 16 x 400 and 1 x 2048.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/planner/bench_token_memory.py [--dtype bf16]

What is measured: the forward zoexec runs, block by block (zoexec.store.loading.build_parts:
embed, one block's forward, the head and its loss) under torch.no_grad(), as a run does
(zoexec/launch/rank.py: no_grad, not inference_mode), one block of the model's shape
(every block is the same). The instrument: the live-storage tracker
(zoexec.runtime.memtrack.AllocationTracker, a TorchDispatchMode that sums the bytes of
every storage an operator creates until it dies): the peak bytes a block's forward, and
the head with its loss, hold beyond their input. That is what a caching allocator must
hold at least (on a GPU, torch.cuda.max_memory_allocated); one kernel's own scratch is
not a live tensor and is not counted. (torch's CPU allocator keeps no memory_stats, and
torch.profiler's profile_memory attributes an operator's allocations to the operator,
so a running sum over its events misses the peaks inside an operator: the tracker is
the instrument here, docs/planner.md.)
The planner's figure is ModelSpec.block_activation_bytes (one stream's block forward)
and ModelSpec.head_activation_bytes (the head and loss), the terms zoplan.memory prices
a rank's "forward" and "head" phases with; the per-token figure is each over the tokens.
The planner is within 10% of the tracker's peak in every case (the last column).
"""

from __future__ import annotations

import argparse
import time

import torch

from zoexec.runtime.memtrack import AllocationTracker
from zoexec.store.loading import build_parts
from zoplan.models import spec_from_hf_config

SHAPES = {   # OPT's public configs (facebook/opt-125m, facebook/opt-1.3b), one block
    "opt-125m": dict(hidden_size=768, ffn_dim=3072, num_attention_heads=12),
    "opt-1.3b": dict(hidden_size=2048, ffn_dim=8192, num_attention_heads=32),
}
WORKLOADS = ((16, 400), (1, 2048))
TOLERANCE = 0.10


def opt_config(name: str) -> dict:
    shape = SHAPES[name]
    return {"model_type": "opt", "num_hidden_layers": 1, "vocab_size": 50272,
            "max_position_embeddings": 2048, "word_embed_proj_dim": shape["hidden_size"],
            "do_layer_norm_before": True, "tie_word_embeddings": True, **shape}


def measure(name: str, batch: int, seq: int, dtype: str) -> dict:
    config = opt_config(name)
    spec = spec_from_hf_config(config, name=name)
    parts, _ = build_parts(config, param_dtype=dtype, compute_dtype=dtype)
    ids = torch.randint(0, config["vocab_size"], (batch, seq),
                        generator=torch.Generator().manual_seed(0))
    tokens = batch * seq
    with torch.no_grad():
        hidden, ctx = parts.embed(ids)
        with AllocationTracker() as block:
            out = parts.block_forward(hidden, ctx)
        with AllocationTracker() as head:
            parts.head_loss(out, ids)
    return {"name": name, "batch": batch, "seq": seq, "tokens": tokens,
            "plan_block": spec.block_activation_bytes(tokens, seq, dtype),
            "plan_head": spec.head_activation_bytes(tokens, dtype),
            "torch_block": block.peak_bytes, "torch_head": head.peak_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"dtype {args.dtype}; bytes per token beyond the input (planner / tracker peak)")
    print("| model | batch x seq | block: planner | torch | head + loss: planner | torch "
          "| sum: planner / torch | within 10% |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name in SHAPES:
        for batch, seq in WORKLOADS:
            start = time.perf_counter()
            r = measure(name, batch, seq, args.dtype)
            t = r["tokens"]
            plan, torch_ = r["plan_block"] + r["plan_head"], r["torch_block"] + r["torch_head"]
            ratio = max(r["plan_block"] / r["torch_block"], r["plan_head"] / r["torch_head"],
                        r["torch_block"] / r["plan_block"], r["torch_head"] / r["plan_head"])
            worst = max(worst, ratio - 1)
            print(f"| {name} | {batch} x {seq} | {r['plan_block'] / t:,.0f} | "
                  f"{r['torch_block'] / t:,.0f} | {r['plan_head'] / t:,.0f} | "
                  f"{r['torch_head'] / t:,.0f} | {plan / torch_:.3f} | "
                  f"{'yes' if ratio - 1 <= TOLERANCE else 'NO'} "
                  f"({time.perf_counter() - start:.1f} s) |")
    print(f"largest gap of a term (block or head) from the tracker: {worst:.1%}")


if __name__ == "__main__":
    main()
