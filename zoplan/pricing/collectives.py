"""Collectives: the all-gather's bus bandwidth by message size, a collective's fixed
latency inside a node, the scalar all-reduce (the loss exchange, and on CUDA the
write-back fence's token) and its inter-node part.

The all-gather's rate is NCCL's bus bandwidth convention: a member sends and receives
(s - 1) / s of the message, in time bytes x (s - 1) / s / busbw (NVIDIA nccl-tests,
doc/PERFORMANCE.md); the table collective.allgather_busbw gives busbw by total message
size, log-interpolated (zoplan.sim.links builds the flows).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.pricing.units import GBPS, US


def interpolate_log(table: list[Any], x: float) -> float:
    """Piecewise-linear interpolation of y over log(x); clamped at the ends."""
    xs = [float(p[0]) for p in table]
    ys = [float(p[1]) for p in table]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    lx0, lx1 = math.log(xs[i - 1]), math.log(xs[i])
    t = (math.log(x) - lx0) / (lx1 - lx0)
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def allgather_busbw_gbps(profile: HardwareProfile, message_bytes: float) -> float:
    """Bus bandwidth of an all-gather whose total output is `message_bytes`
    (collective.allgather_busbw)."""
    return interpolate_log(list(profile.figures().collective.allgather_busbw), message_bytes)


def allgather_s(profile: HardwareProfile, block_bytes: float, slices: int) -> float:
    """One all-gather of a block of `block_bytes` over `slices` ranks alone: the
    latency, then each rank receiving the (slices - 1) / slices it lacks at the
    table's bus bandwidth for that size (the NCCL tests' bus bandwidth convention)."""
    return (collective_latency_s(profile) + block_bytes * (slices - 1) / slices
            / (allgather_busbw_gbps(profile, block_bytes) * GBPS))


def allgather_busbw_factor(profile: HardwareProfile, *, predicted_s: float,
                           measured_s: float) -> float | None:
    """allgather_s inverted: the factor on every bandwidth of collective.allgather_busbw
    that makes an all-gather predicted to take `predicted_s` take `measured_s` (the
    latency stays; the rest scales as 1 / bandwidth). None where either time is
    within the latency: then the latency is what to refit."""
    latency = collective_latency_s(profile)
    if measured_s <= latency or predicted_s <= latency:
        return None
    return (predicted_s - latency) / (measured_s - latency)


def collective_latency_s(profile: HardwareProfile) -> float:
    """Fixed cost of one collective inside a node (collective.latency_us)."""
    latency = profile.figures().collective.latency_us
    return latency * US


def allreduce_small_s(profile: HardwareProfile) -> float:
    """A scalar all-reduce inside a node (collective.allreduce_small_us): the loss
    exchange, and on CUDA the write-back fence's token."""
    small = profile.figures().collective.allreduce_small_us
    return small * US


def internode_allreduce_s(profile: HardwareProfile, nodes: int) -> float:
    """Inter-node part of the scalar all-reduce: latency-bound recursive doubling,
    ceil(log2(nodes)) rounds of one network latency each (Thakur, Rabenseifner and
    Gropp, "Optimization of Collective Communication Operations in MPICH", 2005)."""
    if nodes <= 1:
        return 0.0
    latency = profile.figures().network.latency_us
    return latency * US * math.ceil(math.log2(nodes))
