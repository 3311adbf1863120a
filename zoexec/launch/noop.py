"""A setting that would do nothing on this model, refused before the first step.

MeZO perturbs every weight by eps z (z ~ N(0, 1)) and takes the loss difference. In
floating point, theta + eps z rounds back to theta when |eps z| is under half a unit in
the last place of theta (an ulp of x is 2^(floor(log2 |x|) - p) for a format with p
fraction bits: 23 in fp32, 10 in fp16, 7 in bf16; IEEE 754-2008, section 3.4). Below
that the perturbed model IS the model: every projected gradient g is 0 and the run
ends "done" with the input weights (issue 41: --eps 1e-30). The check samples each
block's weights, takes the typical |z| as the median of a standard normal's |z|
(0.6745), and refuses the run when the perturbation vanishes for most weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from zoplan.errors import ZoError

FRACTION_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
TYPICAL_Z = 0.6745          # the median of |z| for z ~ N(0, 1)
SAMPLE_PER_BLOCK = 1 << 12  # weights sampled from each block (evenly strided): 32 KiB of
                            # fp64 a block, so the check adds no phase peak a plan prices
MOST = 0.5                  # refused when the perturbation vanishes for more than this share


def half_ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half a unit in the last place of |x| in `dtype`, for positive `magnitude`."""
    exponent = torch.floor(torch.log2(magnitude))
    return torch.exp2(exponent - FRACTION_BITS[dtype] - 1)


def sample_weights(flats: Iterable[torch.Tensor]) -> torch.Tensor:
    """|w| of about SAMPLE_PER_BLOCK evenly strided weights of each flat block, fp64."""
    parts = []
    for flat in flats:
        stride = max(1, flat.numel() // SAMPLE_PER_BLOCK)
        parts.append(flat[::stride].detach().to(torch.float64).abs())
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def vanishing_eps(eps: float, magnitudes: torch.Tensor, dtype: torch.dtype) -> str | None:
    """Why --eps `eps` would leave most weights (`magnitudes`: sampled |w|) unchanged in
    `dtype` (the line), or None when it perturbs them."""
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.numel() == 0 or dtype not in FRACTION_BITS:
        return None
    vanished = float((half_ulp(nonzero, dtype) > eps * TYPICAL_Z).double().mean())
    if vanished <= MOST:
        return None
    median = float(nonzero.median())
    floor = float(half_ulp(torch.tensor(median, dtype=torch.float64), dtype)) / TYPICAL_Z
    name = NAMES.get(dtype, str(dtype).removeprefix("torch."))
    return (f"--eps {eps:g} vanishes in the model's {name} weights: theta + eps z rounds back "
            f"to theta for {vanished:.0%} of them (median |theta| {median:.3g}), so every "
            f"projected gradient would be 0 and the run would change nothing; give --eps "
            f"{_up(floor)} or more (MeZO's usual value is 1e-3)")


def _up(value: float) -> str:
    """`value` rounded up to one significant digit: '2e-09'."""
    exponent = math.floor(math.log10(value))
    return f"{math.ceil(value / 10 ** exponent) * 10 ** exponent:.0e}"


def check_eps(cfg: Any, store: Any) -> None:
    """ZoError before the first step when cfg's --eps vanishes on the node's weights in
    the coarser of the param and compute precisions (full fine-tuning: the blocks
    perturbed are the store's)."""
    if cfg.workload.frozen_base:   # LoRA, prefix: the perturbed adapters start at zero
        return
    from zoexec.model.families import torch_dtype

    sample = sample_weights(store.weights(b) for b in range(store.num_blocks))
    dtypes = (torch_dtype(cfg.workload.param_dtype), torch_dtype(cfg.workload.compute_dtype))
    coarser = min(dtypes, key=lambda d: FRACTION_BITS.get(d, 99))   # where the sum is rounded
    problem = vanishing_eps(cfg.optim.eps, sample, coarser)
    if problem:
        raise ZoError(problem)
