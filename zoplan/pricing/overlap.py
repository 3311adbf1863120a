"""What a GPU's streams share: the SMs and HBM between the compute stream and the
collective stream.

A memory-bound kernel on the collective stream (the slice update, the all-gather's NCCL
kernels) beside the compute stream's GEMMs and passes slows both: each runs
compute.overlap_slowdown (k) slower for the share of its time the other stream is busy
(docs/sources.md, "stream interference"). Per block and rank, with C the compute
stream's work and L the collective stream's: compute tasks x (1 + k min(1, L / C)), the
slice update and the all-gather x (1 + k min(1, C / L)). The copy engines' PCIe traffic
(tens of GB/s against HBM's thousands) is not counted.
"""

from __future__ import annotations

from zoplan.hardware import HardwareProfile


def overlap_slowdown(profile: HardwareProfile) -> float:
    """How much a GEMM and a memory-bound kernel on another stream slow each other
    while both run (compute.overlap_slowdown; 0 where absent and on CPU profiles)."""
    if profile.is_cpu:
        return 0.0
    k: float = profile.compute.get("overlap_slowdown", 0.0)
    return k


def stream_factors(*, compute_s: float, collective_s: float, k: float) -> tuple[float, float]:
    """(compute stream, collective stream) time factors of one rank's block tasks when
    the two streams share the GPU: `compute_s` and `collective_s` of work per block on
    each (1, 1 without sharing)."""
    if k <= 0 or compute_s <= 0 or collective_s <= 0:
        return 1.0, 1.0
    return (1.0 + k * min(1.0, collective_s / compute_s),
            1.0 + k * min(1.0, compute_s / collective_s))
