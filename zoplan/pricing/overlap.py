"""What a GPU's streams share: the SMs and HBM between the compute stream and the
collective stream.

A kernel on the collective stream (the slice update's z and update passes, the
all-gather's NCCL kernels) beside the compute stream's GEMMs and passes slows both
while both run (docs/sources.md, "stream interference"), and not alike: a GEMM holds
the SMs its tiles fill, so the memory-bound kernels beside it wait for what it leaves,
while the GEMM loses little. The H200 measured it (scripts/gpu_check.sh, its overlap
stage: docs/sources.md `gpu-check-h200`): z + update passes beside a forward +154%, the
forward beside them +4.7%. Three figures, each the slowdown for the share of a task's
time the other stream is busy:
- k_gemm (compute.overlap_gemm_slowdown): the compute stream beside the slice update;
- k_side (compute.overlap_side_slowdown): the slice update beside the compute stream;
- k (compute.overlap_slowdown): an all-gather (and the fence) beside the compute
  stream and the compute stream beside it, one figure both ways (no measurement of
  NCCL's kernels beside GEMMs here); the other two default to it.
Per block and rank, with C the compute stream's work, S the slice update's and G the
collective stream's other work (L = S + G): compute tasks x (1 + min(1, L / C) (k_gemm S
+ k G) / L), the slice update x (1 + k_side min(1, C / L)), the all-gather x (1 + k
min(1, C / L)). The copy engines' PCIe traffic (tens of GB/s against HBM's thousands)
is not counted: an H2D copy beside a forward slowed neither by 2% on the H200.
"""

from __future__ import annotations

from typing import NamedTuple

from zoplan.hardware import HardwareProfile
from zoplan.pricing.figures import or_


class Interference(NamedTuple):
    """The slowdowns of stream interference (module docstring), 0 where none."""

    k: float        # NCCL's kernels and the compute stream, either way
    k_gemm: float   # the compute stream beside the slice update
    k_side: float   # the slice update beside the compute stream


NONE = Interference(0.0, 0.0, 0.0)


def interference(profile: HardwareProfile) -> Interference:
    """The profile's stream-interference figures (compute.overlap_slowdown, and
    overlap_gemm_slowdown / overlap_side_slowdown, each that one where absent; none on
    CPU profiles, whose ranks run one task at a time)."""
    if profile.is_cpu:
        return NONE
    c = profile.figures().compute
    k = or_(c.overlap_slowdown, 0.0)
    k_gemm = or_(c.overlap_gemm_slowdown, k)
    k_side = or_(c.overlap_side_slowdown, k)
    return Interference(k, k_gemm, k_side)


def stream_factors(*, compute_s: float, slice_s: float, other_s: float,
                   k: Interference) -> tuple[float, float, float]:
    """(compute stream, slice update, all-gather) time factors of one rank's block tasks
    when the two streams share the GPU: `compute_s` of work per block on the compute
    stream, `slice_s` (the slice update) and `other_s` (the all-gather and fence) on the
    collective stream ((1, 1, 1) without sharing)."""
    collective_s = slice_s + other_s
    if compute_s <= 0 or collective_s <= 0 or k == NONE:
        return 1.0, 1.0, 1.0
    beside_compute = min(1.0, compute_s / collective_s)
    k_compute = (k.k_gemm * slice_s + k.k * other_s) / collective_s
    return (1.0 + k_compute * min(1.0, collective_s / compute_s),
            1.0 + k.k_side * beside_compute, 1.0 + k.k * beside_compute)


class SharedTimes(NamedTuple):
    """A rank's block tasks while the two streams share the GPU (shared_gpu_times)."""

    forward_s: float
    update_s: float
    resident_update_s: float
    slice_update_s: tuple[float, ...]
    allgather_slowdown_s: float       # what the all-gather takes beyond its time alone
    factors: tuple[float, float, float]   # stream_factors: compute, slice update, all-gather


def shared_gpu_times(*, forward_s: float, update_s: float, resident_update_s: float,
                     slice_update_s: tuple[float, ...], gather_s: float,
                     compute_stream_s: float, slice_s: float, other_s: float,
                     k: Interference) -> SharedTimes | None:
    """The block tasks slowed by the streams sharing the GPU: the compute stream's tasks
    (forward, update, resident update) by its factor, the slice updates by theirs, and
    the all-gather's transfer (`gather_s`, its time alone less the latency) by its own
    (stream_factors of `compute_stream_s`, `slice_s` and `other_s`, one rank's work per
    block on each stream). None where nothing slows (no interference, an idle stream)."""
    comp, side, coll = stream_factors(compute_s=compute_stream_s, slice_s=slice_s,
                                      other_s=other_s, k=k)
    if comp == side == coll == 1.0:
        return None
    return SharedTimes(forward_s=forward_s * comp, update_s=update_s * comp,
                       resident_update_s=resident_update_s * comp,
                       slice_update_s=tuple(s * side for s in slice_update_s),
                       allgather_slowdown_s=gather_s * (coll - 1.0), factors=(comp, side, coll))
