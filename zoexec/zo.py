"""Zeroth-order maths: seeded perturbation z, perturb, deferred update, projected gradient.

Pure functions on flat tensors; nothing here knows about ranks, layouts or streams.

z addressing (the contract every rank relies on):
  On the CPU, z for step seed `s`, block `b`, tensor `i` of the block (block_specs
  order), chunk `c` (elements [c*Z_CHUNK, (c+1)*Z_CHUNK) of that tensor, flattened) is
  drawn with `normal_` from a torch.Generator seeded by `mix_seed(s, b, i, c)`, a
  splitmix64 hash (stable across processes and Python versions, unlike `hash()`). On
  CUDA the whole tensor is one draw seeded by `mix_seed(s, b, i)`: one launch per tensor
  instead of one per chunk (zoplan.execrules.z_draw_calls), which is what a GPU wants.
  Decoder blocks use b = 0..L-1; the resident parts (embeddings, final norm, LM head)
  use b = RESIDENT_BLOCK (-1) with the tensor order of models.resident_specs. So any rank
  can regenerate any block's z alone, and which slice of the flat buffer a rank looks at
  never changes z. The generator runs on the device of `out` (CPU: mt19937; CUDA:
  Philox, whose draws depend on the launch configuration, i.e. on the GPU model), so z,
  and hence a run, is reproducible on the same device type and GPU model, not across
  them. z is drawn in the requested dtype (fp32 by default); all ranks of a run use one.

Stochastic rounding (update "stochastic", docs/precision.md): the update is computed in
fp32 and rounded into the 16-bit store up or down with probabilities that make the
stored value's expectation exact; its uniform noise is addressed like z, by
mix_seed(s, b, i, c, SR_TAG), so every rank that holds a block rounds it alike.

Cost: z dominates a CPU step. torch's CPU normal_ (mt19937) is serial per generator,
so the per-chunk seeding is what lets several threads draw one block (torch releases
the GIL; chunks are spread largest-first over torch.get_num_threads() threads).
perturb_into and apply_update are one pass each (figures: docs/measurements.md,
benchmarks/zo_maths_bench.py).

z generations per step: the schedule of ZO2/DistZO2 as run here generates z TWICE per
block per step (once for the deferred update of step t-1, once to build the perturbed
weights of step t, which are written into a separate working buffer as
theta + eps*z and theta - eps*z, so no restore is needed). Plain MeZO and ZO2's public
code generate it FOUR times (+eps, -2eps, +eps restore, update); reference.py does that.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from zoplan.execrules import SR_SCRATCH, Z_CHUNK, balance, chunk_bounds, sr_chunk

RESIDENT_BLOCK = -1
SR_TAG = 0x5352   # "SR": the stochastic-rounding noise's own seed stream
_MASK64 = (1 << 64) - 1
_POOL: ThreadPoolExecutor | None = None
_POOL_KEY: tuple[int, int] | None = None


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (negative ones allowed): chained splitmix64."""
    h = 0x5A4F5A4F5A4F5A4F
    for part in parts:
        h = _splitmix64(h ^ (int(part) & _MASK64))
    return h >> 1


def step_seed(base_seed: int, step: int) -> int:
    """The seed of training step `step` (0-based) of a run started with `base_seed`."""
    return mix_seed(base_seed, step)


def _spec_fields(spec) -> tuple[int, int]:
    """(offset, numel) of a TensorSpec or of a plain (offset, numel) pair."""
    if isinstance(spec, tuple):
        return int(spec[0]), int(spec[1])
    return int(spec.offset), int(spec.numel)


def _tensor_jobs(seed: int, block: int, index: int, offset: int,
                 numel: int) -> list[tuple[int, int, int]]:
    """(chunk seed, start, stop) of each chunk of tensor `index`, placed at `offset`."""
    return [(mix_seed(seed, block, index, chunk), offset + start, offset + stop)
            for chunk, (start, stop) in enumerate(chunk_bounds(numel, Z_CHUNK))]


def _chunk_jobs(seed: int, block: int, specs: Sequence, *,
                per_tensor: bool = False) -> list[tuple[int, int, int]]:
    """The draws of every tensor of a block, in the flat buffer's coordinates: one per
    Z_CHUNK chunk, or with `per_tensor` (CUDA) one per tensor."""
    jobs = []
    for index, spec in enumerate(specs):
        offset, numel = _spec_fields(spec)
        if per_tensor:
            jobs.append((mix_seed(seed, block, index), offset, offset + numel))
        else:
            jobs.extend(_tensor_jobs(seed, block, index, offset, numel))
    return jobs


def _default_threads() -> int:
    return max(1, min(torch.get_num_threads(), os.cpu_count() or 1))


def _pool(num_threads: int) -> ThreadPoolExecutor:
    """A process-wide pool of z threads (rebuilt after a fork: threads do not survive it)."""
    global _POOL, _POOL_KEY
    key = (num_threads, os.getpid())
    if _POOL is None or _POOL_KEY != key:
        if _POOL is not None and _POOL_KEY[1] == key[1]:
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="zo-z")
        _POOL_KEY = key
    return _POOL


def _fill(out: torch.Tensor, jobs: list[tuple[int, int, int]]) -> None:
    gen = torch.Generator(device=out.device)
    for chunk_seed, start, stop in jobs:
        gen.manual_seed(chunk_seed)
        out[start:stop].normal_(generator=gen)


def z_block(seed: int, block: int, specs: Sequence, *, out: torch.Tensor | None = None,
            dtype: torch.dtype = torch.float32, num_threads: int | None = None,
            per_tensor: bool | None = None) -> torch.Tensor:
    """The flat z of one block (length = end of the last spec), written into `out` if given.

    `specs` are TensorSpecs (or (offset, numel) pairs) in the block's tensor order.
    `num_threads` defaults to torch.get_num_threads(); the result never depends on it.
    `per_tensor` (default: on CUDA) draws each tensor in one call, seeded per tensor.
    """
    if out is None:
        total = max((_spec_fields(s)[0] + _spec_fields(s)[1] for s in specs), default=0)
        out = torch.empty(total, dtype=dtype)
    if per_tensor is None:
        per_tensor = out.device.type == "cuda"
    jobs = _chunk_jobs(seed, block, specs, per_tensor=per_tensor)
    total = max((stop for _, _, stop in jobs), default=0)
    assert out.dim() == 1 and out.numel() >= total, (tuple(out.shape), total)
    threads = min(num_threads or _default_threads(), len(jobs))
    if threads <= 1 or out.device.type != "cpu":
        _fill(out, jobs)
        return out
    list(_pool(threads).map(lambda part: _fill(out, part), _balance(jobs, threads)))
    return out


def _balance(jobs: list[tuple[int, int, int]], parts: int) -> list[list[tuple[int, int, int]]]:
    """Largest chunk first onto the least loaded thread (zoplan.execrules.balance; the
    result never depends on it)."""
    return [[jobs[i] for i in group]
            for group in balance([stop - start for _, start, stop in jobs], parts)]


def z_tensor(seed: int, block: int, index: int, shape: Iterable[int], *,
             dtype: torch.dtype = torch.float32,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """z of tensor `index` of `block` alone (the same values as its part of z_block)."""
    shape = tuple(shape)
    out = torch.empty(shape, dtype=dtype, device=device)
    _fill(out.view(-1), _tensor_jobs(seed, block, index, 0, out.numel()))
    return out


def perturb_into(out: torch.Tensor, theta: torch.Tensor, z: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """out = theta + scale * z in one pass (out may have another dtype than theta)."""
    return torch.add(theta, z, alpha=scale, out=out)


def decay_ranges(specs: Sequence) -> list[tuple[int, int]]:
    """Merged [start, stop) ranges of the flat buffer where weight decay applies."""
    ranges: list[tuple[int, int]] = []
    for spec in specs:
        if not spec.decay:
            continue
        start, stop = spec.offset, spec.offset + spec.numel
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], stop)
        else:
            ranges.append((start, stop))
    return ranges


def apply_update(theta: torch.Tensor, z: torch.Tensor, *, lr: float, g: float,
                 weight_decay: float, decay_mask_or_specs) -> torch.Tensor:
    """theta -= lr * (g*z + wd*theta), in place, wd only where decay applies.

    `decay_mask_or_specs`: a list of TensorSpec (flat theta), a bool tensor shaped like
    theta, or one bool for the whole tensor. Written as theta *= (1 - lr*wd) on the
    decayed ranges, then theta += (-lr*g) * z: no temporaries.
    """
    if weight_decay and lr:
        shrink = 1.0 - lr * weight_decay
        spec = decay_mask_or_specs
        if isinstance(spec, bool):
            if spec:
                theta.mul_(shrink)
        elif isinstance(spec, torch.Tensor):
            theta.mul_(torch.where(spec, shrink, 1.0).to(theta.dtype))
        else:
            for start, stop in decay_ranges(spec):
                theta[start:stop].mul_(shrink)
    if g and lr:
        theta.add_(z, alpha=-lr * g)
    return theta


def apply_update_stochastic(theta: torch.Tensor, z: torch.Tensor, *, lr: float, g: float,
                            weight_decay: float, specs: Sequence, seed: int, block: int,
                            scratch: list[torch.Tensor] | None = None) -> torch.Tensor:
    """theta -= lr * (g*z + wd*theta) computed in fp32 and rounded stochastically into
    the 16-bit `theta` (flat, in place): each element moves to one of its two nearest
    16-bit neighbours, up with probability equal to the fraction of the distance, so
    E[stored] = the exact fp32 result. The noise of chunk c of tensor i is drawn from
    mix_seed(seed, block, i, c, SR_TAG) (zoplan.execrules.sr_chunk elements a chunk), so
    every rank that holds the block rounds it identically whatever its slice.

    `scratch`: SR_SCRATCH fp32 tensors of at least one chunk (allocated if None)."""
    assert theta.dtype in DROPPED_BITS, theta.dtype
    if not lr or not (g or weight_decay):
        return theta
    chunk = sr_chunk(theta.device.type)
    if scratch is None:
        size = min(chunk, max((s.numel for s in specs), default=0))
        scratch = [torch.empty(size, dtype=torch.float32, device=theta.device)
                   for _ in range(SR_SCRATCH)]
    gen = torch.Generator(device=theta.device)
    shrink = 1.0 - lr * weight_decay
    for index, spec in enumerate(specs):
        for part, (start, stop) in enumerate(chunk_bounds(spec.numel, chunk)):
            lo, hi = spec.offset + start, spec.offset + stop
            exact, noise = (buf[:hi - lo] for buf in scratch[:2])
            exact.copy_(theta[lo:hi])
            if weight_decay and spec.decay:
                exact.mul_(shrink)
            if g:
                exact.add_(z[lo:hi], alpha=-lr * g)
            gen.manual_seed(mix_seed(seed, block, index, part, SR_TAG))
            round_stochastic_(theta[lo:hi], exact, noise.view(torch.int32), gen)
    return theta


# Bits of an fp32 mantissa a 16-bit format drops: bf16 is the top half of an fp32; fp16
# keeps 10 of its 23 mantissa bits (in fp16's normal range, |w| >= 2**-14).
DROPPED_BITS = {torch.bfloat16: 16, torch.float16: 13}


def round_stochastic_(out: torch.Tensor, exact: torch.Tensor, noise: torch.Tensor,
                      gen: torch.Generator) -> torch.Tensor:
    """Stochastic rounding of fp32 `exact` into the 16-bit `out`, on the bits: adding a
    uniform integer below 2**k to the fp32 bits and dropping their k low bits rounds the
    magnitude up with probability equal to the dropped fraction (sign-magnitude:
    negative values alike), so E[out] = exact. Five element-wise kernels; `exact` and
    the int32 `noise` are overwritten. bf16: exact for every finite value. fp16: exact
    in fp16's normal range; below 2**-14, where fp16's spacing is a fixed 2**-24
    (6e-8), the truncated value is then rounded to nearest by the cast."""
    dropped = DROPPED_BITS[out.dtype]
    bits = exact.view(torch.int32)
    noise.random_(0, 1 << dropped, generator=gen)
    bits.add_(noise)
    if out.dtype == torch.bfloat16:
        bits.bitwise_right_shift_(16)          # arithmetic: the sign bits come along
        out.view(torch.int16).copy_(bits)      # the low half now: the fp32's top half
    else:
        bits.bitwise_and_(-(1 << dropped))     # clear the dropped bits
        out.copy_(exact)                       # representable in fp16: the cast is exact
    return out


def projected_grad(loss_plus: float, loss_minus: float, eps: float) -> float:
    """g = (l+ - l-) / (2 eps): the directional derivative estimate along z."""
    return (float(loss_plus) - float(loss_minus)) / (2.0 * eps)
