"""Facts of the executor that the planner prices: the torch-free rules both halves import.

- threads per rank: a host's cores shared by its local ranks (zoexec sets it, the
  planner prices z and GEMMs with it, `zoplan profile` measures with it);
- z chunking and balancing: z is drawn in independently seeded chunks of each tensor,
  Z_CHUNK elements on the CPU (spread over a rank's threads largest first: zoexec.maths.zo
  draws it so, the planner computes the busiest thread the same way) and Z_CHUNK_CUDA
  on CUDA (one generator launch each); a draw of a flat range of a block (the update on
  the slice) draws every chunk it touches whole (z_range_draws);
- run lengths: how many steps a traced run takes by default, and how many make a run
  of a given length (zoexec's default, `zoplan calibrate`'s advice, the benchmarks);
- speed probes: how often a traced CPU run probes the machine between steps;
- the write-back fence: when a block's write-back must wait for the node's other ranks
  to have read it (fence_needed).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zoplan.layout import Layout


# ---- threads ---------------------------------------------------------------------------------
def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(cores: int, local_ranks: int) -> int:
    """The host's cores shared by its local ranks, at least one each."""
    return max(1, cores // local_ranks)


# ---- the write-back fence ---------------------------------------------------------------------
def fence_needed(layout: Layout) -> bool:
    """Whether a block's write-back (d2h) must wait until every local rank has read it:
    several local ranks share the node's store and a slice group does not span them
    (the slice group's all-gather orders the reads before the writes otherwise). CUDA
    ranks fence with a node all-reduce of a token after their h2d (zoexec's
    Trainer._fence, a task the planner prices); CPU ranks wait on read stamps in shared
    memory instead (zoexec.store.fence), no collective."""
    return 1 < layout.local_ranks and layout.slices < layout.local_ranks


# ---- how z's chunks are spread over a rank's threads -----------------------------------------
Z_CHUNK = 1 << 20        # CPU: elements per independently seeded chunk (part of the z definition)
Z_CHUNK_CUDA = 1 << 24   # CUDA: the same, larger (one Philox launch per chunk; a chunk is
                         # drawn whole, so a range draw costs at most a chunk more at each end)


def z_chunk(device_kind: str) -> int:
    """Elements per z chunk on this kind of device (zoexec.maths.zo's addressing)."""
    return Z_CHUNK_CUDA if device_kind == "cuda" else Z_CHUNK


def chunk_bounds(numel: int, chunk: int | None = None) -> list[tuple[int, int]]:
    """[start, stop) of each z chunk (Z_CHUNK elements) of a tensor of `numel` elements."""
    chunk = chunk or Z_CHUNK
    return [(start, min(start + chunk, numel)) for start in range(0, numel, chunk)]


def balance(sizes: list[int], parts: int) -> list[list[int]]:
    """Indices of `sizes` per thread: largest first onto the least loaded thread (ties:
    the earlier item, then the lower thread), so a block's z work is spread the same way
    on every rank and the planner can compute its longest thread."""
    loads = [0] * parts
    groups: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = loads.index(min(loads))
        groups[k].append(index)
        loads[k] += sizes[index]
    return groups


def z_makespan(tensor_numels: list[int], threads: int) -> tuple[int, int]:
    """(elements, chunks) of the busiest thread when a block's z is drawn with
    `threads` threads (zoexec.maths.zo.z_block's rule)."""
    sizes = [stop - start for numel in tensor_numels for start, stop in chunk_bounds(numel)]
    threads = max(1, min(threads, len(sizes)))
    groups = balance(sizes, threads)
    busiest = max(groups, key=lambda g: sum(sizes[i] for i in g))
    return sum(sizes[i] for i in busiest), len(busiest)


def z_draw_calls(tensor_numels: list[int], device_kind: str) -> int:
    """Generator calls (kernel launches on CUDA) of one z draw over these tensors: one
    per chunk of z_chunk(device_kind) elements of each tensor (CUDA: Philox, 2**24 a
    launch; CPU: mt19937 is serial per generator, 2**20 a chunk, the chunks spread over
    a rank's threads)."""
    chunk = z_chunk(device_kind)
    return sum(-(-n // chunk) for n in tensor_numels)   # len(chunk_bounds(n, chunk))


def z_range_draws(tensor_numels: list[int], start: int, stop: int,
                  device_kind: str) -> list[int]:
    """Sizes of the chunk draws that z of the flat range [start, stop) of a block costs
    (its tensors laid end to end in this order, zoexec.maths.zo.z_range): every chunk that
    overlaps the range, whole (a chunk cannot be drawn from its middle)."""
    chunk, offset = z_chunk(device_kind), 0
    sizes: list[int] = []
    if stop <= start:
        return sizes
    for numel in tensor_numels:
        if offset < stop and offset + numel > start:
            sizes += [b - a for a, b in chunk_bounds(numel, chunk)
                      if offset + a < stop and offset + b > start]
        offset += numel
    return sizes


# Stochastic rounding (update "stochastic") works chunk by chunk in fp32 scratch: a chunk is
# Z_CHUNK elements on the CPU and SR_CHUNK_CUDA on CUDA (fewer launches; its noise is seeded
# per (step seed, block, tensor, chunk) like z). Scratch: SR_SCRATCH fp32 arrays of a chunk.
# An update of a flat range (the update on the slice) rounds the chunks it touches, drawing
# the noise of each whole (so it rounds exactly as the whole block's update does).
SR_CHUNK_CUDA = 1 << 25
SR_SCRATCH = 2


def sr_chunk(device_kind: str) -> int:
    return SR_CHUNK_CUDA if device_kind == "cuda" else Z_CHUNK


def z_uses_pool(tensor_numels: list[int], threads: int) -> bool:
    """Whether z_block hands a draw's chunks to its thread pool (more than one thread
    and more than one chunk); one thread draws them itself."""
    return min(threads, sum(len(chunk_bounds(n)) for n in tensor_numels)) > 1


# ---- run lengths -----------------------------------------------------------------------------
STEADY_RUN_S = 20.0   # a run this long averages a drifting machine's speeds (docs/measurements.md)
TRACE_RUN_S = 25.0    # a traced run's default length: STEADY_RUN_S with a margin for plans
                      # that predict a little slower than they run
DEFAULT_STEPS = 10    # --steps when not given and not traced


def steps_for_seconds(step_s: float, seconds: float = STEADY_RUN_S, *, skip: int = 1) -> int:
    """--steps for a run whose steps after the first `skip` (which calibrate leaves
    out) last `seconds` at `step_s` each (0 for a step of no time)."""
    return math.ceil(seconds / step_s) + skip if step_s > 0 else 0


def default_steps(step_s: float, *, traced: bool) -> int:
    """--steps when not given: DEFAULT_STEPS, or with --trace enough of the plan's
    predicted steps (`step_s`) for TRACE_RUN_S (and the first, which calibrate skips),
    at least DEFAULT_STEPS: a trace is for `zoplan calibrate`, and a short run's median
    is the speed of one moment of a machine whose speed wanders."""
    if not traced:
        return DEFAULT_STEPS
    return max(DEFAULT_STEPS, steps_for_seconds(step_s, TRACE_RUN_S))


# ---- speed probes ----------------------------------------------------------------------------
PROBE_EVERY_S = 3.0   # a traced CPU run probes the machine's speed about this often


def probe_every(step_s: float) -> int:
    """Steps between speed probes: about PROBE_EVERY_S of the plan's predicted steps."""
    return max(1, round(PROBE_EVERY_S / step_s)) if step_s > 0 else 1
SPEED_CHECK_KINDS = ("gemm", "memory", "z")   # what a speed check and a probe time
                                              # (zoexec.profiler.probe.SPEED_CHECKS)
