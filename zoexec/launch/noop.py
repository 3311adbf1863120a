"""A setting that would do nothing on this model, refused before the first step.

MeZO perturbs every weight by eps z (z ~ N(0, 1)) and takes the loss difference. In
floating point, theta + eps z rounds back to theta when |eps z| is under half a unit in
the last place of theta (an ulp of x is 2^(floor(log2 |x|) - p) for a format with p
fraction bits: 23 in fp32, 10 in fp16, 7 in bf16; IEEE 754-2008, section 3.4). Below
that the perturbed model IS the model: every projected gradient g is 0 and the run
ends "done" with the input weights (issue 41: --eps 1e-30). The check samples each
block's weights, takes the typical |z| as the median of a standard normal's |z|
(0.6745), and refuses the run when the perturbation vanishes for most weights.

The update theta - lr g z vanishes the same way, with g the projected gradient, unknown
before the first step. g = (L+ - L-) / (2 eps) with losses at least 0, and a language
model's cross-entropy starts near ln(vocab) (an untrained model's), so |g| above
ln(vocab) / (2 eps) is not expected: an update that vanishes even at that |g| changes
nothing. With round to nearest (fp32 weights, --update master's fp32 masters,
--update plain's 16-bit weights) the run is refused; with stochastic rounding (16-bit
weights, the update computed in fp32 and rounded at random, exact in expectation) a
16-bit half ulp loses nothing on average, so only an update that vanishes in the fp32
arithmetic itself is named, and only as a warning. (At a typical |g| of 1 far smaller
updates are lost per step with --update plain: zoexec.model.precision.LostUpdates
warns after the first update with the share it measured.)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable
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


def g_bound(vocab: int, eps: float) -> float:
    """The largest |g| expected: a loss difference of ln(vocab) (an untrained model's
    cross-entropy) over 2 eps."""
    return math.log(max(vocab, 2)) / (2 * eps)


def g_is_bounded(eps: float, magnitudes: torch.Tensor) -> bool:
    """Whether g_bound holds: a perturbation (eps |z|) below the weights' median
    magnitude keeps the loss difference near an untrained model's cross-entropy; a
    larger one can make it anything (even not finite: the first step says so), and then
    no |g| bounds an update that vanishes."""
    nonzero = magnitudes[magnitudes > 0]
    return nonzero.numel() == 0 or eps * TYPICAL_Z <= float(nonzero.median())


def vanishing_lr(lr: float, g: float, magnitudes: torch.Tensor, dtype: torch.dtype, *,
                 update: str) -> str | None:
    """Why --lr `lr` would leave most weights (`magnitudes`: sampled |w|, kept in `dtype`,
    updated by `update`) unchanged even at |g| `g` (the line), or None when it moves them."""
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.numel() == 0 or dtype not in FRACTION_BITS or lr <= 0:
        return None
    step = lr * g * TYPICAL_Z
    vanished = float((half_ulp(nonzero, dtype) > step).double().mean())
    if vanished <= MOST:
        return None
    median = float(nonzero.median())
    floor = float(half_ulp(torch.tensor(median, dtype=torch.float64), dtype)) / (g * TYPICAL_Z)
    name = NAMES.get(dtype, str(dtype).removeprefix("torch."))
    how = ("computed in fp32 before the stochastic rounding" if update == "stochastic"
           else f"rounded to nearest in {name}")
    return (f"--lr {lr:g} vanishes in the model's weights: theta - lr g z, {how}, rounds back "
            f"to theta for {vanished:.0%} of them (median |theta| {median:.3g}) even at |g| "
            f"{g:.3g} (ln(vocab) / 2 eps), so no update would change the model; give --lr "
            f"{_up(floor)} or more")


def warn_line(line: str) -> None:
    """A warning line on stderr (rank 0's)."""
    print(line, file=sys.stderr, flush=True)


def check_noop(cfg: Any, store: Any, *, warn: Callable[[str], None]) -> None:
    """Before the first step of a full fine-tuning run (LoRA, prefix: the perturbed
    adapters start at zero), on one sample of the node's weights (the store's blocks):
    an --eps that would change nothing (check_eps), then an --lr (check_lr)."""
    if cfg.workload.frozen_base:
        return
    sample = sample_weights(store.weights(b) for b in range(store.num_blocks))
    check_eps(cfg, sample)
    check_lr(cfg, sample, warn=warn)


def check_lr(cfg: Any, sample: torch.Tensor, *, warn: Callable[[str], None]) -> None:
    """ZoError before the first step when cfg's --lr vanishes on the weights (`sample`:
    sample_weights of them) with round to nearest (the weights kept in fp32, or in 16
    bits by --update plain); `warn(line)` when it vanishes in the fp32 arithmetic of
    --update stochastic."""
    if cfg.optim.lr <= 0:
        return
    from zoexec.model.families import torch_dtype

    update = cfg.workload.update
    kept = torch_dtype(cfg.workload.param_dtype) if update == "plain" else torch.float32
    if not g_is_bounded(cfg.optim.eps, sample):
        return
    problem = vanishing_lr(cfg.optim.lr, g_bound(cfg.model_spec.vocab, cfg.optim.eps), sample,
                           kept, update=update)
    if problem and update == "stochastic":
        warn(f"zoexec: warning: {problem}")
    elif problem:
        raise ZoError(problem)


def check_eps(cfg: Any, sample: torch.Tensor) -> None:
    """ZoError before the first step when cfg's --eps vanishes on the weights (`sample`:
    sample_weights of them) in the coarser of the param and compute precisions."""
    from zoexec.model.families import torch_dtype

    dtypes = (torch_dtype(cfg.workload.param_dtype), torch_dtype(cfg.workload.compute_dtype))
    coarser = min(dtypes, key=lambda d: FRACTION_BITS.get(d, 99))   # where the sum is rounded
    problem = vanishing_eps(cfg.optim.eps, sample, coarser)
    if problem:
        raise ZoError(problem)
