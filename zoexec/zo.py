"""Zeroth-order maths: seeded perturbation z, perturb, deferred update, projected gradient.

Pure functions on flat tensors; nothing here knows about ranks, layouts or streams.

z addressing (the contract every rank relies on):
  z for step seed `s`, block `b`, tensor `i` of the block (block_specs order), chunk `c`
  (elements [c*Z_CHUNK, (c+1)*Z_CHUNK) of that tensor, flattened) is drawn with
  `normal_` from a torch.Generator seeded by `mix_seed(s, b, i, c)`, a splitmix64 hash
  (stable across processes and Python versions, unlike `hash()`). Decoder blocks use
  b = 0..L-1; the resident parts (embeddings, final norm, LM head) use
  b = RESIDENT_BLOCK (-1) with the tensor order of models.resident_specs. So any rank can
  regenerate any block's z alone, and which slice of the flat buffer a rank looks at never
  changes z. The generator runs on the device of `out` (CPU: mt19937; CUDA: Philox), so
  z, and hence a run, is reproducible on the same device type, not across CPU and CUDA.
  z is drawn in the requested dtype (fp32 by default); all ranks of a run use one dtype.

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

from zoplan.execrules import Z_CHUNK, balance, chunk_bounds

RESIDENT_BLOCK = -1
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


def _chunk_jobs(seed: int, block: int, specs: Sequence) -> list[tuple[int, int, int]]:
    """The chunk jobs of every tensor of a block, in the flat buffer's coordinates."""
    jobs = []
    for index, spec in enumerate(specs):
        offset, numel = _spec_fields(spec)
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
            dtype: torch.dtype = torch.float32, num_threads: int | None = None) -> torch.Tensor:
    """The flat z of one block (length = end of the last spec), written into `out` if given.

    `specs` are TensorSpecs (or (offset, numel) pairs) in the block's tensor order.
    `num_threads` defaults to torch.get_num_threads(); the result never depends on it.
    """
    jobs = _chunk_jobs(seed, block, specs)
    total = max((stop for _, _, stop in jobs), default=0)
    if out is None:
        out = torch.empty(total, dtype=dtype)
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


def projected_grad(loss_plus: float, loss_minus: float, eps: float) -> float:
    """g = (l+ - l-) / (2 eps): the directional derivative estimate along z."""
    return (float(loss_plus) - float(loss_minus)) / (2.0 * eps)
