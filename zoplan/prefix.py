"""Prefix tuning over a frozen base: the shapes the planner prices and the executor trains.

With `tuning` "prefix" (zoplan.workload.Workload) the base model is frozen and
read-only; each decoder block's attention gets `prefix_tokens` extra keys and values
(Li & Liang, arXiv 2101.00190), trained directly without a reparametrisation, as in
MeZO's prefix runs (arXiv 2305.17333, its appendix; its code's `--prefix_tuning
--num_prefix 5 --no_reparam --prefix_init_by_real_act`, lr 1e-3 / 1e-2, eps 1e-1). As PEFT
defines them (peft PrefixTuningConfig, prefix_projection False), the prefix is a key
cache the attention sees before the input: the input's tokens sit at positions P..P+L-1
and attend to the P prefix keys and to the input's own causally.

A block's trained tensors, in the executor's flat layout and z order (tensor index i of
block b, zoexec.maths.zo): the prefix keys, then the prefix values, each
[prefix_tokens, kv_dim] (kv_dim = key/value heads x head dim: grouped-query attention
keeps fewer key/value heads than query heads).
"""

from __future__ import annotations

from zoplan.models import ModelSpec

DEFAULT_PREFIX_TOKENS = 5      # MeZO's prefix runs (--num_prefix 5)
MAX_PREFIX_TOKENS = 4096
PREFIX_BYTES = 4               # the prefix is kept, perturbed and updated in fp32


def prefix_tensor_numels(model: ModelSpec, *, tokens: int) -> list[int]:
    """Element counts of one block's prefix tensors (keys, values)."""
    return [tokens * model.kv_dim, tokens * model.kv_dim]


def prefix_params(model: ModelSpec, *, tokens: int) -> int:
    """Prefix parameters of one block."""
    return sum(prefix_tensor_numels(model, tokens=tokens))


def prefix_flops_per_token(model: ModelSpec, *, tokens: int) -> float:
    """Forward FLOPs per input token of one block's prefix: each query scores `tokens`
    more keys and weighs as many more values, 2 x 2 x tokens x attn_dim (the attention
    term of ModelSpec's forward FLOPs, over the prefix's keys)."""
    return 4.0 * tokens * model.attn_dim
