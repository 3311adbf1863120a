"""LoRA over a frozen base: the shapes the planner prices and the executor trains.

With `tuning` "lora" (zoplan.workload.Workload) the base model is frozen and read-only;
each decoder block gets, for every target linear module (by its short name, e.g.
q_proj), two adapter matrices as PEFT defines them (Hu et al., arXiv 2106.09685;
peft.tuners.lora.LoraLayer): A [r, in] and B [out, r], and the module computes
y = W x + (alpha / r) * B (A x). Only the adapters are perturbed and updated (MeZO's
LoRA runs, arXiv 2305.17333 section 4 and its appendix: r 8, alpha 16 on the attention
query and value projections, lr 5e-5 / 1e-4, eps 1e-2).

The adapter tensors of a block, in the order the executor lays them out (and draws z
for: tensor index i of block b, zoexec.maths.zo): for each target module in the
block's module order, lora_A then lora_B.
"""

from __future__ import annotations

from zoplan.models import ModelSpec
from zoplan.names import TUNINGS as TUNINGS  # declared there (prefix: zoplan.prefix)

DEFAULT_LORA_R = 8            # MeZO's LoRA runs (and PEFT's default r)
DEFAULT_LORA_ALPHA = 16       # MeZO's LoRA runs
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")   # the attention query and value projections
MAX_LORA_R = 4096
ADAPTER_BYTES = 4             # adapters are kept, perturbed and updated in fp32


def linear_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear module of a decoder block, by its
    short name, in the HF module order of the family."""
    h, f, a, kv = model.hidden, model.ffn, model.attn_dim, model.kv_dim
    if model.family == "opt":
        return {"k_proj": (h, h), "v_proj": (h, h), "q_proj": (h, h), "out_proj": (h, h),
                "fc1": (h, f), "fc2": (f, h)}
    return {"q_proj": (h, a), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (a, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


def check_targets(model: ModelSpec, targets: tuple[str, ...]) -> None:
    """ValueError naming a target that is no linear module of the model's blocks."""
    known = linear_shapes(model)
    unknown = [t for t in targets if t not in known]
    if unknown:
        raise ValueError(f"lora_targets {', '.join(unknown)}: not a linear module of a "
                         f"{model.family} block (one of {', '.join(known)})")


def adapter_tensor_numels(model: ModelSpec, *, r: int, targets: tuple[str, ...]) -> list[int]:
    """Element counts of one block's adapter tensors (A then B per target, block order)."""
    out = []
    for name, (fan_in, fan_out) in linear_shapes(model).items():
        if name in targets:
            out += [r * fan_in, fan_out * r]
    return out


def adapter_params(model: ModelSpec, *, r: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters of one block."""
    return sum(adapter_tensor_numels(model, r=r, targets=targets))


def adapter_flops_per_token(model: ModelSpec, *, r: int, targets: tuple[str, ...]) -> float:
    """Forward FLOPs per token of one block's adapters: B (A x) is two GEMMs, 2 per
    weight (the scaling and the add are element-wise: left out)."""
    return 2.0 * adapter_params(model, r=r, targets=targets)
