"""Collectives as a run calls them, timed: `all_gather_flat` over sizes and the loss
all-reduce (two float64 scalars), on gloo ranks (CPU) or NCCL ranks (CUDA), both timed
from the last rank's arrival (collective_samples)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch

from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import summarize, time_samples
from zoexec.runtime.groups import all_gather_flat

ALLREDUCE_ITERS = 30          # the loss all-reduce is ~100 us: many samples are cheap


STAGGER_S = 0.002   # how late the last rank enters a timed collective (collective_samples)


class Sampler(Protocol):
    """Durations (s) of `repeats` runs of a collective after `warmup` untimed ones:
    collective_samples or time_samples with the rest of their arguments given."""

    def __call__(self, fn: Callable[[], object], /, *, repeats: int, warmup: int) -> list[float]: ...


def collective_samples(fn: Callable[[], Any], *, dist: Any, repeats: int, warmup: int = 1,
                       sync: Callable[[], Any] | None = None,
                       device: torch.device | str = "cpu") -> list[float]:   # dist: torch.distributed
    """Durations of a collective `fn` of ranks on one host, each from the moment the last
    rank entered it to this rank's return: what `zoplan calibrate` counts as a run's
    collective (the time a rank spends there before the last one arrives is waiting).
    As in a run, the ranks do not arrive together: after a barrier, one rank (each in
    turn) enters STAGGER_S after the others, which are then blocked in the collective.
    Ranks on one host share the monotonic clock of time.perf_counter (Linux:
    CLOCK_MONOTONIC). NCCL ranks pass `sync` (torch.cuda.synchronize: the collective
    returns when it is queued, it is done when the device is) and their `device` (the
    entry times are exchanged by a MAX all-reduce, which NCCL runs on device tensors)."""
    latest = torch.zeros(1, dtype=torch.float64, device=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    for index in range(warmup + repeats):
        dist.barrier()
        if sync:
            sync()
        if index % world == rank:
            time.sleep(STAGGER_S)
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        end = time.perf_counter()
        latest.fill_(start)
        dist.all_reduce(latest, op=dist.ReduceOp.MAX)
        if index >= warmup:
            out.append(max(end - latest.item(), 1e-7))
    return out


def _barrier_sampler(dist: Any, sync: Callable[[], Any] | None = None) -> Sampler:
    """Samples after a barrier (the default; both paths of the profiler pass
    collective_samples instead)."""
    return partial(time_samples, before=dist.barrier, sync=sync)


def allgather_sweep(settings: Settings, dist: Any, *, device: torch.device | str,
                    sample: Sampler | None = None) -> list[dict[str, Any]]:
    """zoexec.runtime.groups.all_gather_flat (zoexec's call) over the world for each
    total size."""
    world = dist.get_world_size()
    cuda = str(device).startswith("cuda")
    sample = sample or _barrier_sampler(dist, torch.cuda.synchronize if cuda else None)
    out = []
    for size in settings.gather_sizes:
        piece = max(1, size // 4 // world)
        inp = torch.ones(piece, device=device)
        res = torch.empty(piece * world, device=device)
        samples = sample(lambda: all_gather_flat(res, inp, group=None, async_op=False),
                         repeats=settings.repeats,
                         warmup=2)
        out.append({"bytes": piece * world * 4, **summarize(samples)})
    return out


def allreduce_small(dist: Any, *, device: torch.device | str,
                    sample: Sampler | None = None) -> dict[str, Any]:
    """The loss all-reduce of zoexec's step: two float64 scalars over the world."""
    vec = torch.zeros(2, dtype=torch.float64, device=device)
    cuda = str(device).startswith("cuda")
    sample = sample or _barrier_sampler(dist, torch.cuda.synchronize if cuda else None)
    return summarize(sample(lambda: dist.all_reduce(vec), repeats=ALLREDUCE_ITERS, warmup=3))
