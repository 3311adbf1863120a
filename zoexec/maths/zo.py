"""Zeroth-order maths: seeded perturbation z, perturb, deferred update, projected gradient.

Pure functions on flat tensors; nothing here knows about ranks, layouts or streams.

z addressing (the contract every rank relies on):
  z for step seed `s`, block `b`, tensor `i` of the block (block_specs order), chunk `c`
  (elements [c*C, (c+1)*C) of that tensor, flattened) is drawn with `normal_` from a
  torch.Generator seeded by `mix_seed(s, b, i, c)`, a splitmix64 hash (stable across
  processes and Python versions, unlike `hash()`). The chunk C is the device's
  (zoplan.execrules.z_chunk): Z_CHUNK = 2**20 on the CPU, Z_CHUNK_CUDA = 2**24 on CUDA
  (one launch per chunk, zoplan.execrules.z_draw_calls: what a GPU wants). Decoder
  blocks use b = 0..L-1; the resident parts (embeddings, final norm, LM head) use
  b = RESIDENT_BLOCK (-1) with the tensor order of models.resident_specs. So any rank
  can regenerate any block's z alone, and which slice of the flat buffer a rank looks at
  never changes z. A chunk is always drawn whole (a generator's draws depend on the
  length drawn: mt19937's normal_ fills in groups, Philox's on the launch
  configuration), so z_range, z of any flat range of a block (the update on the slice),
  draws every chunk it touches and keeps the part in the range: at most one chunk more
  than the range at each end. The generator runs on the device of `out` (CPU:
  mt19937; CUDA: Philox, whose draws depend on the launch configuration, i.e. on the GPU
  model), so z, and hence a run, is reproducible on the same device type and GPU model,
  not across them. z is drawn in the requested dtype (fp32 by default); all ranks of a
  run use one.

Stochastic rounding (update "stochastic", docs/precision.md): the update is computed in
fp32 and rounded into the 16-bit store up or down with probabilities that make the
stored value's expectation exact; its uniform noise is addressed like z, by
mix_seed(s, b, i, c, SR_TAG), so every rank that holds a block rounds it alike, and an
update of a flat range (apply_update_stochastic's `start`) rounds exactly as the whole
block's update does.

Updates of a range: apply_update and apply_update_stochastic take `start`, the block
offset of the flat range they are given, so a slice owner updates its slice to the
bits the whole block's update gives (docs: the update on the slice). Element-wise
arithmetic does not depend on where a call starts, with one exception handled here:
torch's CPU kernels compute the last elements of a call that do not fill a vector with
scalar code, which for 16-bit `theta += alpha * z` rounds differently; those adds run
in pieces cut at block offsets every ADD_GRID elements and at 64-element alignment
(zoplan.memory.ALIGN_ELEMENTS: slices start there), so the whole block and a slice cut
the same elements the same way.

Cost: z dominates a CPU step. torch's CPU normal_ (mt19937) is serial per generator,
so the per-chunk seeding is what lets several threads draw one block (torch releases
the GIL; chunks are spread largest-first over torch.get_num_threads() threads).
perturb_into and apply_update are one pass each (figures: docs/measurements.md,
benchmarks/executor/zo_maths_bench.py).

z generations per step: the schedule of ZO2/DistZO2 as run here generates z TWICE per
block per step (once for the deferred update of step t-1, once to build the perturbed
weights of step t, which are written into a separate working buffer as
theta + eps*z and theta - eps*z, so no restore is needed); with the update on the slice
(Layout.slice_update, k slices) each rank draws z of its 1/k of the block for the
update: 1 + 1/k. Plain MeZO and ZO2's public code generate it FOUR times (+eps, -2eps,
+eps restore, update); reference.py does that.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import torch

from zoplan.execrules import SR_SCRATCH, Z_CHUNK, Z_CHUNK_CUDA, balance, chunk_bounds, sr_chunk

RESIDENT_BLOCK = -1
SR_TAG = 0x5352   # "SR": the stochastic-rounding noise's own seed stream
ALIGN = 64              # zoplan.memory.ALIGN_ELEMENTS: where slices and shares start
ADD_GRID = 1 << 15      # CPU 16-bit adds: pieces of at most this (torch's grain: one thread)
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


def _spec_fields(spec: Any) -> tuple[int, int]:
    """(offset, numel) of a TensorSpec or of a plain (offset, numel) pair."""
    if isinstance(spec, tuple):
        return int(spec[0]), int(spec[1])
    return int(spec.offset), int(spec.numel)


def _chunk_of(device: torch.device | str) -> int:
    """z's chunk on this device (zoplan.execrules.z_chunk; looked up at call time)."""
    return Z_CHUNK_CUDA if torch.device(device).type == "cuda" else Z_CHUNK


def _tensor_jobs(seed: int, block: int, index: int, offset: int, numel: int, *,
                 chunk: int | None = None, start: int = 0,
                 stop: int | None = None) -> list[tuple[int, int, int]]:
    """(chunk seed, start, stop) of each chunk of tensor `index`, placed at `offset`,
    that overlaps the flat range [start, stop)."""
    stop = offset + numel if stop is None else stop
    return [(mix_seed(seed, block, index, c), offset + a, offset + b)
            for c, (a, b) in enumerate(chunk_bounds(numel, chunk or Z_CHUNK))
            if offset + a < stop and offset + b > start]


def _chunk_jobs(seed: int, block: int, specs: Sequence[Any], *, chunk: int | None = None,
                start: int = 0, stop: int | None = None) -> list[tuple[int, int, int]]:
    """The chunk draws of a block's tensors, in the flat buffer's coordinates (every
    chunk that overlaps [start, stop), default all): `chunk` elements each (default
    Z_CHUNK, the CPU's)."""
    jobs: list[tuple[int, int, int]] = []
    for index, spec in enumerate(specs):
        offset, numel = _spec_fields(spec)
        if offset < (offset + numel if stop is None else stop) and offset + numel > start:
            jobs.extend(_tensor_jobs(seed, block, index, offset, numel, chunk=chunk,
                                     start=start, stop=stop))
    return jobs


def _default_threads() -> int:
    return max(1, min(int(torch.get_num_threads()), os.cpu_count() or 1))


def _pool(num_threads: int) -> ThreadPoolExecutor:
    """A process-wide pool of z threads (rebuilt after a fork: threads do not survive it)."""
    global _POOL, _POOL_KEY
    key = (num_threads, os.getpid())
    if _POOL is None or _POOL_KEY != key:
        if _POOL is not None and cast(tuple[int, int], _POOL_KEY)[1] == key[1]:   # set with _POOL
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="zo-z")
        _POOL_KEY = key
    return _POOL


def _fill(out: torch.Tensor, jobs: list[tuple[int, int, int]], *, base: int = 0,
          lo: int | None = None, hi: int | None = None,
          scratch: torch.Tensor | None = None) -> None:
    """Draw each job's chunk into out[start - base:stop - base]; a chunk that reaches
    outside [lo, hi) is drawn whole into `scratch` (or a temporary) and only its part
    inside is kept."""
    gen = torch.Generator(device=out.device)
    for chunk_seed, start, stop in jobs:
        gen.manual_seed(chunk_seed)
        if (lo is None or start >= lo) and (hi is None or stop <= hi):
            out[start - base:stop - base].normal_(generator=gen)
            continue
        whole = (scratch[:stop - start] if scratch is not None
                 else torch.empty(stop - start, dtype=out.dtype, device=out.device))
        whole.normal_(generator=gen)
        a, b = max(start, cast(int, lo)), min(stop, cast(int, hi))   # a cut: z_range gives both
        out[a - base:b - base].copy_(whole[a - start:b - start])


def _draw(out: torch.Tensor, jobs: list[tuple[int, int, int]], num_threads: int | None, **cut: Any) -> None:
    """Run the draws: on the CPU spread over threads (largest first), else in order."""
    threads = min(num_threads or _default_threads(), len(jobs))
    if threads <= 1 or out.device.type != "cpu":
        _fill(out, jobs, **cut)
        return
    list(_pool(threads).map(lambda part: _fill(out, part, **cut), _balance(jobs, threads)))


def z_block(seed: int, block: int, specs: Sequence[Any], *, out: torch.Tensor | None = None,
            dtype: torch.dtype = torch.float32, num_threads: int | None = None,
            chunk: int | None = None) -> torch.Tensor:
    """The flat z of one block (length = end of the last spec), written into `out` if given.

    `specs` are TensorSpecs (or (offset, numel) pairs) in the block's tensor order.
    `num_threads` defaults to torch.get_num_threads(); the result never depends on it.
    `chunk`: elements per seeded chunk (default: the device's, zoplan.execrules.z_chunk).
    """
    if out is None:
        total = max((_spec_fields(s)[0] + _spec_fields(s)[1] for s in specs), default=0)
        out = torch.empty(total, dtype=dtype)
    jobs = _chunk_jobs(seed, block, specs, chunk=chunk or _chunk_of(out.device))
    total = max((stop for _, _, stop in jobs), default=0)
    assert out.dim() == 1 and out.numel() >= total, (tuple(out.shape), total)
    _draw(out, jobs, num_threads)
    return out


def z_range(seed: int, block: int, specs: Sequence[Any], start: int, stop: int, *,
            out: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
            num_threads: int | None = None, chunk: int | None = None,
            scratch: torch.Tensor | None = None) -> torch.Tensor:
    """z of the flat range [start, stop) of a block: exactly z_block(...)[start:stop],
    written into `out` (stop - start elements; allocated if None). Only the chunks that
    overlap the range are drawn, whole; the (at most two) that it cuts are drawn into
    `scratch` (one chunk of out's dtype; temporaries if None, which lets the CPU's
    threads draw them too) and cut. Parts of the range outside every spec are left
    as they are (the padding of a slice)."""
    if out is None:
        out = torch.empty(max(0, stop - start), dtype=dtype)
    assert out.dim() == 1 and out.numel() >= stop - start, (tuple(out.shape), start, stop)
    if stop <= start:
        return out
    jobs = _chunk_jobs(seed, block, specs, chunk=chunk or _chunk_of(out.device),
                       start=start, stop=stop)
    cut = dict(base=start, lo=start, hi=stop)
    if scratch is not None:   # the cut chunks share it: drawn here, in order
        edges = [j for j in jobs if j[1] < start or j[2] > stop]
        _fill(out, edges, scratch=scratch, **cut)
        jobs = [j for j in jobs if j not in edges]
    _draw(out, jobs, num_threads, **cut)
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
    _fill(out.view(-1), _tensor_jobs(seed, block, index, 0, out.numel(),
                                     chunk=_chunk_of(out.device)))
    return out


def perturb_into(out: torch.Tensor, theta: torch.Tensor, z: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """out = theta + scale * z in one pass (out may have another dtype than theta)."""
    return torch.add(theta, z, alpha=scale, out=out)


def decay_ranges(specs: Sequence[Any]) -> list[tuple[int, int]]:
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


def _clip(ranges: Iterable[tuple[int, int]], start: int, stop: int) -> list[tuple[int, int]]:
    """Block ranges cut to [start, stop) and moved to that range's coordinates."""
    return [(max(a, start) - start, min(b, stop) - start) for a, b in ranges
            if a < stop and b > start]


def apply_update(theta: torch.Tensor, z: torch.Tensor, *, lr: float, g: float,
                 weight_decay: float, decay_mask_or_specs: bool | torch.Tensor | Sequence[Any], start: int = 0) -> torch.Tensor:
    """theta -= lr * (g*z + wd*theta), in place, wd only where decay applies.

    `decay_mask_or_specs`: a list of TensorSpec (flat theta), a bool tensor shaped like
    theta, or one bool for the whole tensor. Written as theta *= (1 - lr*wd) on the
    decayed ranges, then theta += (-lr*g) * z: no temporaries. With specs, `theta` and
    `z` may be the flat range [start, start + len) of the block (the update on the
    slice): the result is bit for bit that range of the whole block's update.
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
            for lo, hi in _clip(decay_ranges(spec), start, start + theta.numel()):
                theta[lo:hi].mul_(shrink)
    if g and lr:
        _add_scaled_(theta, z, -lr * g, start=start)
    return theta


def _add_scaled_(theta: torch.Tensor, z: torch.Tensor, alpha: float, *, start: int) -> None:
    """theta += alpha * z; 16-bit theta on the CPU in the pieces the module docstring
    describes (cut at block offsets k * ADD_GRID and at ALIGN), elsewhere in one call."""
    if theta.device.type != "cpu" or theta.dtype not in DROPPED_BITS or theta.dim() != 1:
        theta.add_(z, alpha=alpha)
        return
    stop = start + theta.numel()
    cuts = {start, stop, min(stop, -(-start // ALIGN) * ALIGN)}
    cuts.update(range(-(-start // ADD_GRID) * ADD_GRID, stop, ADD_GRID))
    points = sorted(cuts)
    for lo, hi in zip(points, points[1:]):
        theta[lo - start:hi - start].add_(z[lo - start:hi - start], alpha=alpha)


def apply_update_stochastic(theta: torch.Tensor, z: torch.Tensor, *, lr: float, g: float,
                            weight_decay: float, specs: Sequence[Any], seed: int, block: int,
                            scratch: list[torch.Tensor] | None = None,
                            start: int = 0) -> torch.Tensor:
    """theta -= lr * (g*z + wd*theta) computed in fp32 and rounded stochastically into
    the 16-bit `theta` (flat, in place): each element moves to one of its two nearest
    16-bit neighbours, up with probability equal to the fraction of the distance, so
    E[stored] = the exact fp32 result. The noise of chunk c of tensor i is drawn from
    mix_seed(seed, block, i, c, SR_TAG) (zoplan.execrules.sr_chunk elements a chunk), so
    every rank that holds the block rounds it identically whatever its slice.

    `theta` and `z` may be the flat range [start, start + len) of the block (the update
    on the slice): each chunk's noise is drawn whole and the range's part of it used,
    so the range gets exactly the bits of the whole block's update.
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
    stop = start + theta.numel()
    for index, spec in enumerate(specs):
        if spec.offset >= stop or spec.offset + spec.numel <= start:
            continue
        for part, (a, b) in enumerate(chunk_bounds(spec.numel, chunk)):
            first, last = spec.offset + a, spec.offset + b       # the chunk in the block
            lo, hi = max(first, start), min(last, stop)           # its part in the range
            if lo >= hi:
                continue
            exact = scratch[0][:hi - lo]
            exact.copy_(theta[lo - start:hi - start])
            if weight_decay and spec.decay:
                exact.mul_(shrink)
            if g:
                exact.add_(z[lo - start:hi - start], alpha=-lr * g)
            noise = scratch[1][:last - first].view(torch.int32)
            gen.manual_seed(mix_seed(seed, block, index, part, SR_TAG))
            draw_rounding_noise_(noise, theta.dtype, gen)
            round_bits_(theta[lo - start:hi - start], exact, noise[lo - first:hi - first])
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
    draw_rounding_noise_(noise, out.dtype, gen)
    return round_bits_(out, exact, noise)


def draw_rounding_noise_(noise: torch.Tensor, dtype: torch.dtype,
                         gen: torch.Generator) -> torch.Tensor:
    """The int32 `noise` of stochastic rounding into `dtype`: uniform below 2**k, k the
    bits of an fp32 `dtype` drops (drawn for a whole chunk: see the module docstring)."""
    return noise.random_(0, 1 << DROPPED_BITS[dtype], generator=gen)


def round_bits_(out: torch.Tensor, exact: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The rounding itself, given the drawn `noise` (round_stochastic_)."""
    dropped = DROPPED_BITS[out.dtype]
    bits = exact.view(torch.int32)
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
