"""The CUDA path of the profiler (one rank per GPU, GPUs 0..ranks-1 of this machine):
H2D / D2H per GPU alone from a page-locked tmpfs mapping, as runs copy from their
store (and from cudaHostAlloc buffers, for comparison), both directions at once (per-direction rates), pairs of
GPUs at once, all GPUs at once one way and both ways; device-to-device and GPU-to-GPU
copies; block forwards over the grid in bf16, TF32 and fp32, z draws and the zo passes
on GPU 0; NCCL all-gathers and the small all-reduce on spawned ranks, timed from the
last rank's arrival; the NVLink matrix of `nvidia-smi topo -m`. The planner side turns
these into pcie.switch_groups and duplex figures, the host ceiling, fabric groups, the
compute fit and the z model."""

from __future__ import annotations

import re
import statistics
import subprocess
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
import torch.distributed as dist

from zoexec.profiler.blocks import forward_grid, gpu_zo_costs
from zoexec.profiler.collectives import allgather_sweep, allreduce_small, collective_samples
from zoexec.profiler.ranks import rendezvous, spawn_ranks, write_rank_result
from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import gbps, summarize, time_samples
from zoexec.runtime.pinning import pin_tensor, unpin_host_memory
from zoexec.store.blocks import unnamed_store

# a timed copy: (destination, source, its stream, device, direction, registered host side)
CopyJob = tuple[torch.Tensor, torch.Tensor, Any, int, str, bool]
COPY_PIECES = 8   # a copy is timed piece by piece (CUDA events): rates while all copies run


def host_buffer(num_bytes: int, host: str) -> tuple[torch.Tensor, bool]:
    """(a host buffer, whether it is a registered store mapping). "store": a file on
    the block store's tmpfs (shmfiles.shm_dir()), mapped shared and
    page-locked with cudaHostRegister as a run's store is (zoexec.runtime.pinning);
    "alloc": cudaHostAlloc memory (torch's pin_memory). A mapping that cannot be
    registered falls back to "alloc" (the caller records which it got)."""
    if host == "store":
        flat = unnamed_store(num_bytes, torch.uint8, prefix="zoexec-profile")
        if pin_tensor(flat, who="zoplan profile"):
            return flat, True
    return _alloc_pinned(num_bytes), False


def _alloc_pinned(num_bytes: int) -> torch.Tensor:
    return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)


def _cuda_copy_jobs(devices: list[int], num_bytes: int, directions: tuple[str, ...],
                    host: str = "store") -> list[CopyJob]:
    """One host buffer (host_buffer), one device buffer and one stream per (device,
    direction)."""
    jobs: list[CopyJob] = []
    for dev in devices:
        for direction in directions:
            buf, registered = host_buffer(num_bytes, host)
            gpu = torch.empty(num_bytes, dtype=torch.uint8, device=f"cuda:{dev}")
            dst, src = (gpu, buf) if direction == "h2d" else (buf, gpu)
            jobs.append((dst, src, torch.cuda.Stream(device=dev), dev, direction, registered))
    return jobs


def overlap_rates(piece_bytes: int, ends_ms: list[list[float]]) -> list[float]:
    """GB/s of each of a GPU's copies while all of them ran: ends_ms[j][k] is when piece
    k of copy j ended, in ms after their common start. The window closes when the first
    copy ends (after it, the others would run faster); each copy's rate counts the
    pieces it finished inside it (at least its first)."""
    window = min(ends[-1] for ends in ends_ms)
    out: list[float] = []
    for ends in ends_ms:
        k = max([i for i, t in enumerate(ends) if t <= window * (1 + 1e-9)] or [0])
        out.append(piece_bytes * (k + 1) / (ends[k] * 1e-3) / 1e9 if ends[k] > 0 else 0.0)
    return out


def cuda_copy(devices: list[int], num_bytes: int, directions: tuple[str, ...],
              repeats: int, host: str = "store") -> dict[str, Any]:
    """Copies on several GPUs / directions launched together, each on its own stream
    and timed piece by piece with CUDA events: each copy's GB/s while all copies of its
    GPU still ran (overlap_rates; with both directions on a GPU: the per-direction rates
    under duplex), medians over the repeats; total_gbps = their sum. The wall time of
    the whole set is kept too. `host`: where the host side lives (host_buffer): the
    registered store mapping by default, as in a run."""
    jobs = _cuda_copy_jobs(devices, num_bytes, directions, host)
    try:
        return _timed_copies(jobs, devices, num_bytes, directions, repeats)
    finally:
        for job in jobs:
            if job[5]:
                unpin_host_memory(job[0] if job[4] == "d2h" else job[1])


def _timed_copies(jobs: list[CopyJob], devices: list[int], num_bytes: int,
                  directions: tuple[str, ...], repeats: int) -> dict[str, Any]:
    """cuda_copy's timing of prepared jobs."""
    piece = num_bytes // COPY_PIECES
    marks: list[tuple[dict[int, Any], list[list[Any]]]] = []

    def run() -> None:
        starts: dict[int, Any] = {}
        for dev in devices:
            starts[dev] = torch.cuda.Event(enable_timing=True)
            starts[dev].record(torch.cuda.current_stream(dev))
        ends: list[list[Any]] = []
        for dst, src, stream, dev, *_ in jobs:
            stream.wait_event(starts[dev])
            events: list[Any] = []
            with torch.cuda.stream(stream):
                for k in range(COPY_PIECES):
                    dst[k * piece:(k + 1) * piece].copy_(src[k * piece:(k + 1) * piece],
                                                         non_blocking=True)
                    events.append(torch.cuda.Event(enable_timing=True))
                    events[-1].record(stream)
            ends.append(events)
        for _, _, stream, *_ in jobs:
            stream.synchronize()
        marks.append((starts, ends))
    stats = summarize(time_samples(run, repeats=repeats))
    rates: list[list[float]] = [[] for _ in jobs]
    for starts, ends in marks[1:]:   # the first run warms up
        for dev in devices:
            mine = [j for j, job in enumerate(jobs) if job[3] == dev]
            times = [[starts[dev].elapsed_time(ev) for ev in ends[j]] for j in mine]
            for j, rate in zip(mine, overlap_rates(piece, times)):
                rates[j].append(rate)
    per_job: list[dict[str, Any]] = [
        {"device": job[3], "direction": job[4], "gbps": statistics.median(r) if r else 0.0}
        for job, r in zip(jobs, rates)]
    by_dir = {d: statistics.median(j["gbps"] for j in per_job if j["direction"] == d)
              for d in directions}
    return {"devices": devices, "directions": list(directions), "bytes": num_bytes,
            "host": "store" if all(job[5] for job in jobs) else "alloc",
            "per_copy_gbps": statistics.median(j["gbps"] for j in per_job),
            "per_direction_gbps": by_dir, "per_job": per_job,
            "total_gbps": sum(j["gbps"] for j in per_job),
            "wall_gbps": gbps(num_bytes * len(jobs), stats["median_s"]), **stats}


def nvlink_matrix(n: int) -> list[list[str]] | None:
    """The GPU x GPU part of `nvidia-smi topo -m` (entries like NV12, PIX, SYS) for CUDA
    devices 0..n-1, or None. nvidia-smi lists PHYSICAL GPUs: the rows and columns read
    are those of the GPUs CUDA_VISIBLE_DEVICES maps to devices 0..n-1. Where it names
    GPUs by UUID (GPU-..., MIG-...) they cannot be matched to topo -m's indices: None."""
    from zoexec.runtime.devicemap import topo_gpu_matrix, visible_env, visible_physical

    physical = visible_physical(visible_env(), n)
    if physical is None:
        return None
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return topo_gpu_matrix(re.sub(r"\x1b\[[0-9;]*m", "", text), physical)   # no colours


def measure_cuda(settings: Settings, tick: Callable[[str], None],
                 stage: Callable[[str], float | None] = lambda name: None) -> dict[str, Any]:
    """Everything the CUDA profile needs, GPUs 0..ranks-1 of this machine; `stage(name)`
    starts a stage of the time budget (zoexec.profiler.budget)."""
    n, size, reps = settings.ranks, settings.copy_bytes, settings.repeats
    stage("copies")
    m: dict[str, Any] = {"devices": [torch.cuda.get_device_name(i) for i in range(n)],
               "memory": [list(torch.cuda.mem_get_info(i)) for i in range(n)]}
    m["h2d"] = [cuda_copy([i], size, ("h2d",), reps) for i in range(n)]
    m["d2h"] = [cuda_copy([i], size, ("d2h",), reps) for i in range(n)]
    m["duplex"] = [cuda_copy([i], size, ("h2d", "d2h"), reps) for i in range(n)]
    m["h2d_alloc"] = cuda_copy([0], size, ("h2d",), reps, host="alloc")   # for comparison
    m["d2h_alloc"] = cuda_copy([0], size, ("d2h",), reps, host="alloc")
    m["sweep"] = [cuda_copy([0], s, ("h2d",), reps) for s in settings.copy_sweep]
    dup = m["duplex"][0]["per_direction_gbps"]
    tick(f"host copies, GPU alone: {m['h2d'][0]['per_copy_gbps']:.1f} GB/s H2D; both ways "
         f"at once {dup['h2d']:.1f} H2D + {dup['d2h']:.1f} D2H")
    m["pairs"] = {f"{i},{j}": cuda_copy([i, j], size, ("h2d",), reps)
                  for i in range(n) for j in range(i + 1, n)}
    m["all"] = cuda_copy(list(range(n)), size, ("h2d",), reps)
    m["all_duplex"] = cuda_copy(list(range(n)), size, ("h2d", "d2h"), reps)
    tick(f"host copies, all {n} GPUs: {m['all']['total_gbps']:.1f} GB/s H2D, "
         f"{m['all_duplex']['total_gbps']:.1f} GB/s both ways")
    m.update(_cuda_device_copies(settings))
    stage("forwards")
    m["forward_alone"] = _forward_grids(settings, tick)
    stage("zo")
    m["zo_alone"] = gpu_zo_costs(settings, device="cuda:0", sync=torch.cuda.synchronize)
    draws = m["zo_alone"]["z_draws"]
    tick(f"z draws: {draws[0]['median_s'] * 1e3:.2f} ms ({draws[0]['tensors']} tensors), "
         f"{draws[-1]['median_s'] * 1e3:.2f} ms ({draws[-1]['tensors']} tensors)")
    stage("collectives")
    m["topology"] = nvlink_matrix(n)
    m["nccl"] = spawn_nccl_ranks(settings) if n > 1 else None
    stage("done")
    tick("NCCL collectives" if n > 1 else "one GPU: no collectives")
    return m


def _forward_grids(settings: Settings, tick: Callable[[str], None]) -> list[dict[str, Any]]:
    """Block forwards on GPU 0 per GEMM precision (settings.forward_dtypes): bf16, fp32
    with TF32 allowed ("tf32") and fp32 without; TF32 is restored afterwards."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    points: list[dict[str, Any]] = []
    try:
        for precision, shapes in settings.forward_dtypes.items():
            matmul.allow_tf32 = precision == "tf32"
            dtype = "bf16" if precision == "bf16" else "fp32"
            points += forward_grid(settings, dtype=dtype, device="cuda:0",
                                   sync=torch.cuda.synchronize, tick=tick, shapes=shapes,
                                   precision=precision)
    finally:
        matmul.allow_tf32 = saved
    return points


def _cuda_device_copies(settings: Settings) -> dict[str, Any]:
    """GPU memory bandwidth (D2D on GPU 0) and GPU0 -> GPU1 copy."""
    size, reps = settings.copy_bytes, settings.repeats
    a = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    b = torch.empty_like(a)
    d2d = summarize(time_samples(lambda: b.copy_(a), repeats=reps, sync=torch.cuda.synchronize))
    out = {"d2d": {"bytes": size, "gbps": gbps(2 * size, d2d["median_s"]), **d2d}}
    if settings.ranks > 1:
        c = torch.empty(size, dtype=torch.uint8, device="cuda:1")
        both = lambda: [torch.cuda.synchronize(i) for i in (0, 1)]  # noqa: E731
        p2p = summarize(time_samples(lambda: c.copy_(a), repeats=reps, sync=both))
        out["p2p"] = {"bytes": size, "gbps": gbps(size, p2p["median_s"]),
                      "peer_access": bool(torch.cuda.can_device_access_peer(0, 1)), **p2p}
    return out


def spawn_nccl_ranks(settings: Settings) -> dict[str, Any]:
    """NCCL collectives on settings.ranks GPUs; rank 0's results."""
    return cast(dict[str, Any], spawn_ranks(_nccl_rank, settings, what=f"NCCL with {settings.ranks} GPUs")[0])   # rank 0 writes one


def _nccl_rank(rank: int, settings: Settings, tmp: str, deadline: float | None = None) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=rendezvous(tmp), rank=rank,
                            world_size=settings.ranks, device_id=torch.device("cuda", rank))
    try:
        device = f"cuda:{rank}"
        after_last = partial(collective_samples, dist=dist, sync=torch.cuda.synchronize,
                             device=device)
        out = {"allgather": allgather_sweep(settings, dist, device=device, sample=after_last),
               "allreduce": allreduce_small(dist, device=device, sample=after_last)}
        if rank == 0:
            write_rank_result(tmp, rank, out)
    finally:
        dist.destroy_process_group()
