"""The CPU path of the profiler: gloo ranks sharing this host, exactly as zoexec runs
them (its copy, collective, forward and z routines, its thread rule and host settings).

- one rank alone with all cores: copies between a /dev/shm block store and a rank's
  buffer, block forwards over the grid (with speed probes between passes), the update
  task and z draws, the speed check;
- `ranks` spawned gloo ranks at once (cores // ranks threads each): copies, gloo
  all-gathers and the loss all-reduce, the update task, and paired samples of all
  ranks at once and rank 0 alone for a GEMM-bound forward, a memory-bound forward and
  a z draw (-> the rank scalings and the jitter the planner side fits).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
import torch.distributed as dist

from zoexec.profiler.blocks import build_block, forward_grid, forward_point, zo_costs, zo_steps
from zoexec.profiler.collectives import allgather_sweep, allreduce_small, collective_samples
from zoexec.profiler.probe import SPEED_CHECKS, SpeedProbe, merge_probes
from zoexec.profiler.ranks import rendezvous, spawn_ranks, write_rank_result
from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import Guard, gbps, rank_samples, summarize, time_samples
from zoexec.runtime.hostenv import keep_freed_memory
from zoexec.store.blocks import unnamed_store
from zoplan.execrules import threads_per_rank, z_makespan

Sample = Callable[..., list[float]]   # rank_samples with its dist and guard: wall times (s)


def shm_store(numel: int) -> torch.Tensor:
    """A flat fp32 tensor of ones mapped from a file in the store's folder, as a run's
    block store is (zoexec.store.blocks.unnamed_store)."""
    return unnamed_store(numel, torch.float32, prefix="zoplan-profile").fill_(1.0)


class RoundRobinStore:
    """A /dev/shm store of several block-sized pieces and one rank buffer; each copy
    takes the next piece, so the store is read cold as in a run whose store is larger
    than the caches (a 16 MiB buffer copied again and again would stay in cache)."""

    def __init__(self, piece_bytes: int, *, store_bytes: int) -> None:
        self.numel = piece_bytes // 4
        self.pieces = max(2, store_bytes // piece_bytes)
        self.store = shm_store(self.numel * self.pieces)
        self.buf = torch.zeros(self.numel)
        self.next = 0

    def _piece(self) -> torch.Tensor:
        self.next = (self.next + 1) % self.pieces
        return self.store[self.next * self.numel:(self.next + 1) * self.numel]

    def h2d(self) -> None:
        self.buf.copy_(self._piece(), non_blocking=True)

    def d2h(self) -> None:
        self._piece().copy_(self.buf, non_blocking=True)


def cpu_copy(num_bytes: int, *, repeats: int, store_bytes: int) -> dict[str, Any]:
    """h2d (store -> rank buffer) and d2h (rank buffer -> store) copies of one rank,
    with zoexec's call (Tensor.copy_ on a /dev/shm mapping)."""
    rr = RoundRobinStore(num_bytes, store_bytes=store_bytes)
    h2d = summarize(time_samples(rr.h2d, repeats=repeats))
    d2h = summarize(time_samples(rr.d2h, repeats=repeats))
    return {"bytes": num_bytes, "store_bytes": rr.numel * 4 * rr.pieces, "h2d": h2d,
            "d2h": d2h, "h2d_gbps": gbps(num_bytes, h2d["median_s"]),
            "d2h_gbps": gbps(num_bytes, d2h["median_s"])}


def measure_cpu(settings: Settings, tick: Callable[[str], None],
                stage: Callable[[str], float | None] = lambda name: None) -> dict[str, Any]:
    """Everything the CPU profile needs (one rank here, then `ranks` spawned ranks);
    `stage(name)` starts a stage of the time budget (zoexec.profiler.budget) and
    returns its deadline."""
    keep_freed_memory()   # as zoexec's CPU ranks do
    torch.set_num_threads(threads_per_rank(settings.cores, 1))
    m: dict[str, Any] = {"threads_alone": torch.get_num_threads()}
    stage("copies")
    m["copy_alone"] = [cpu_copy(size, repeats=settings.repeats, store_bytes=settings.store_bytes)
                       for size in settings.copy_sweep]
    tick(f"copy, one rank: {m['copy_alone'][-1]['h2d_gbps']:.1f} GB/s")
    stage("forwards")
    probe = SpeedProbe()
    probes: list[dict[str, Any]] = []
    m["forward_alone"] = forward_grid(settings, dtype="fp32", device="cpu", tick=tick,
                                      between=lambda: probes.append(probe.sample()))
    stage("zo")
    m["zo_alone"] = zo_costs(settings, device="cpu")
    tick(f"zo update task: {m['zo_alone']['ns_per_param']:.2f} ns/param")
    stage("speed check")
    m["speed_check"] = merge_probes(probe.check(), probes)
    deadline = stage("ranks")
    m["ranks"] = spawn_cpu_ranks(settings, deadline=deadline) if settings.ranks > 1 else None
    stage("done")
    tick(f"{settings.ranks} gloo ranks at once")
    return m


def spawn_cpu_ranks(settings: Settings, *, deadline: float | None = None) -> dict[str, Any]:
    """Run `_cpu_rank` on settings.ranks gloo processes; returns the per-rank results."""
    ranks = spawn_ranks(_cpu_rank, settings, what=f"with {settings.ranks} gloo ranks",
                        deadline=deadline)
    return {"threads_per_rank": cast(dict[str, Any], ranks[0])["threads"], "per_rank": ranks}   # every rank writes one


def _cpu_rank(rank: int, settings: Settings, tmp: str, deadline: float | None = None) -> None:
    """One spawned rank: concurrent copies, gloo collectives, concurrent forward and zo;
    disturbed samples are retaken until `deadline` (the time budget's)."""
    keep_freed_memory()   # as zoexec's CPU ranks do
    threads = threads_per_rank(settings.cores, settings.ranks)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=rendezvous(tmp), rank=rank,
                            world_size=settings.ranks)
    guard = Guard(os.getppid(), retries=settings.retries, deadline=deadline)
    sample = partial(rank_samples, dist=dist, guard=guard)
    try:
        with torch.no_grad():   # not inference_mode: the z threads would not inherit it
            out: dict[str, Any] = {"rank": rank, "threads": threads}
            out.update(_rank_copies(settings, sample))
            after_last = partial(collective_samples, dist=dist)
            out["allgather"] = allgather_sweep(settings, dist, device="cpu", sample=after_last)
            out["allreduce"] = allreduce_small(dist, device="cpu", sample=after_last)
            out.update(_rank_compute(settings, dist, sample, late=partial(_all_late, dist, guard)))
            out["rejected"] = guard.rejected
            out["samples"], out["disturbed_kept"] = guard.samples, guard.disturbed_kept
        write_rank_result(tmp, rank, out)
    finally:
        dist.destroy_process_group()


def _rank_copies(settings: Settings, sample: Sample) -> dict[str, Any]:
    rr = RoundRobinStore(settings.copy_bytes, store_bytes=settings.store_bytes // settings.ranks)
    h2d = sample(rr.h2d, repeats=settings.repeats)
    d2h = sample(rr.d2h, repeats=settings.repeats)
    return {"copy_bytes": settings.copy_bytes, "h2d": summarize(h2d), "d2h": summarize(d2h)}


def _all_late(dist: Any, guard: Guard) -> bool:
    """Has any rank passed the time budget's deadline? (collective: every rank asks)"""
    flag = torch.tensor([0.0 if guard.in_time() else 1.0])
    dist.all_reduce(flag)
    return bool(flag.item())


def _rank_compute(settings: Settings, dist: Any, sample: Sample, *, late: Callable[[], bool]) -> dict[str, Any]:
    """The update task with all ranks at once, and paired samples of a block forward
    and a z draw: all ranks at once (cores // ranks threads each), then rank 0 alone
    with all cores while the others wait, in turn, so a machine whose speed drifts
    between minutes slows both sides of each pair alike (-> the rank scalings)."""
    family, hidden, batch, seq = settings.reference_shape
    dist.barrier()
    parts = build_block(hidden, seq, dtype="fp32", device="cpu", family=family)
    ids = torch.randint(0, 64, (batch, seq))
    hid, ctx = parts.embed(ids)
    steps, n = zo_steps(settings.zo_hidden, device="cpu")
    numels = steps.pop("numels")
    task = summarize(sample(steps["task"], repeats=settings.repeats))
    threads = torch.get_num_threads()
    fwd = _paired(lambda: parts.block_forward(hid, ctx), dist, settings, threads, late=late)
    mem = SPEED_CHECKS["memory"]   # a memory-bound forward: attention, element-wise work
    small = build_block(mem["hidden"], mem["seq"], dtype="fp32", device="cpu")
    m_hid, m_ctx = small.embed(torch.randint(0, 64, (mem["batch"], mem["seq"])))
    fwd_mem = _paired(lambda: small.block_forward(m_hid, m_ctx), dist, settings, threads,
                      late=late)
    z = _paired(steps["z"], dist, settings, threads, late=late)
    return {"forward": {"family": family, "hidden": hidden, "batch": batch, "seq": seq,
                        **fwd},
            "forward_memory": {**forward_point(mem["hidden"], mem["batch"], mem["seq"], {},
                                               dtype_bytes=4), **fwd_mem},
            "zo": {"ns_per_param": task["median_s"] / n * 1e9, "task": task},
            "z": {"hidden": settings.zo_hidden, **z, "threads_together": threads,
                  "threads_alone": settings.cores,
                  "busiest_together": z_makespan(numels, threads)[0],
                  "busiest_alone": z_makespan(numels, settings.cores)[0]}}


# Pairs of _paired, at least: the rank scalings are medians of per-pair ratios, and the
# machine's speed can change between the two halves of a pair (docs/measurements.md).
# Past the time budget's deadline, PAIRS_LATE pairs are enough.
PAIRS_MIN, PAIRS_LATE = 7, 3


def _paired(fn: Callable[[], Any], dist: Any, settings: Settings, threads: int, *,
            late: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Samples of `fn` on all ranks at once and on rank 0 alone with all cores, in
    turn (one warm-up pair, then max(repeats, PAIRS_MIN) pairs, PAIRS_LATE once `late()`,
    a collective, says the deadline has passed); rank 0's samples count (every rank
    runs the same work)."""
    together: list[float] = []
    alone: list[float] = []
    rank = dist.get_rank()
    for index in range(max(settings.repeats, PAIRS_MIN) + 1):
        if index > PAIRS_LATE and late():
            break
        dist.barrier()
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
        dist.barrier()
        if rank == 0:
            torch.set_num_threads(settings.cores)
            fn()   # untimed: the z thread pool is rebuilt for the new thread count
            start = time.perf_counter()
            fn()
            alone_s = time.perf_counter() - start
            torch.set_num_threads(threads)
            fn()
        dist.barrier()
        if index:
            together.append(wall)
            if rank == 0:
                alone.append(alone_s)
    out: dict[str, Any] = {"together": summarize(together)}
    if alone:
        out["alone"] = summarize(alone)
        out["ratios"] = [t / a for t, a in zip(together, alone)]
    return out
