"""The CUDA path of the profiler (one rank per GPU, GPUs 0..ranks-1 of this machine):
pinned H2D / D2H per GPU alone, both directions at once, pairs of GPUs at once and all
GPUs at once; device-to-device and GPU-to-GPU copies; block forwards over the grid in
bf16 and the update task on GPU 0; NCCL all-gathers and the small all-reduce on spawned
ranks; the NVLink matrix of `nvidia-smi topo -m`. The planner side turns these into
pcie.switch_groups, the host ceiling, fabric groups and the compute fit."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import torch
import torch.distributed as dist

from zoexec.profiler.blocks import forward_grid, zo_costs
from zoexec.profiler.collectives import allgather_sweep, allreduce_small
from zoexec.profiler.ranks import rendezvous, spawn_ranks, write_rank_result
from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import gbps, summarize, time_samples


def _cuda_copy_jobs(devices: list[int], num_bytes: int, directions: tuple[str, ...]):
    """One pinned host buffer, one device buffer and one stream per (device, direction)."""
    jobs = []
    for dev in devices:
        for direction in directions:
            host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
            gpu = torch.empty(num_bytes, dtype=torch.uint8, device=f"cuda:{dev}")
            dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
            jobs.append((dst, src, torch.cuda.Stream(device=dev)))
    return jobs


def cuda_copy(devices: list[int], num_bytes: int, directions: tuple[str, ...],
              repeats: int) -> dict:
    """Copies on several GPUs / directions launched together; per-copy GB/s = bytes over
    the wall time of the whole set (they run side by side)."""
    jobs = _cuda_copy_jobs(devices, num_bytes, directions)

    def run() -> None:
        for dst, src, stream in jobs:
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
        for _, _, stream in jobs:
            stream.synchronize()
    stats = summarize(time_samples(run, repeats=repeats))
    return {"devices": devices, "directions": list(directions), "bytes": num_bytes,
            "per_copy_gbps": gbps(num_bytes, stats["median_s"]),
            "total_gbps": gbps(num_bytes * len(jobs), stats["median_s"]), **stats}


def nvlink_matrix(n: int) -> list[list[str]] | None:
    """The GPU x GPU part of `nvidia-smi topo -m` (entries like NV12, PIX, SYS), or None."""
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = {}
    for line in text.splitlines():
        cells = re.sub(r"\x1b\[[0-9;]*m", "", line).split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]) and len(cells) > n:
            rows[int(cells[0][3:])] = cells[1:n + 1]
    return [rows[i] for i in range(n)] if len(rows) == n else None


def measure_cuda(settings: Settings, tick: Callable[[str], None]) -> dict:
    """Everything the CUDA profile needs, GPUs 0..ranks-1 of this machine."""
    n, size, reps = settings.ranks, settings.copy_bytes, settings.repeats
    m: dict = {"devices": [torch.cuda.get_device_name(i) for i in range(n)],
               "memory": [list(torch.cuda.mem_get_info(i)) for i in range(n)]}
    m["h2d"] = [cuda_copy([i], size, ("h2d",), reps) for i in range(n)]
    m["d2h"] = [cuda_copy([i], size, ("d2h",), reps) for i in range(n)]
    m["duplex"] = [cuda_copy([i], size, ("h2d", "d2h"), reps) for i in range(n)]
    m["sweep"] = [cuda_copy([0], s, ("h2d",), reps) for s in settings.copy_sweep]
    tick(f"host copies, GPU alone: {m['h2d'][0]['per_copy_gbps']:.1f} GB/s H2D")
    m["pairs"] = {f"{i},{j}": cuda_copy([i, j], size, ("h2d",), reps)
                  for i in range(n) for j in range(i + 1, n)}
    m["all"] = cuda_copy(list(range(n)), size, ("h2d",), reps)
    tick(f"host copies, all {n} GPUs: {m['all']['total_gbps']:.1f} GB/s")
    m.update(_cuda_device_copies(settings))
    sync = torch.cuda.synchronize
    m["forward_alone"] = forward_grid(settings, dtype="bf16", device="cuda:0", sync=sync,
                                      tick=tick)
    m["zo_alone"] = zo_costs(settings, device="cuda:0", sync=sync)
    tick(f"zo update task: {m['zo_alone']['ns_per_param']:.3f} ns/param")
    m["topology"] = nvlink_matrix(n)
    m["nccl"] = spawn_nccl_ranks(settings) if n > 1 else None
    tick("NCCL collectives" if n > 1 else "one GPU: no collectives")
    return m


def _cuda_device_copies(settings: Settings) -> dict:
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


def spawn_nccl_ranks(settings: Settings) -> dict:
    """NCCL collectives on settings.ranks GPUs; rank 0's results."""
    return spawn_ranks(_nccl_rank, settings, what=f"NCCL with {settings.ranks} GPUs")[0]


def _nccl_rank(rank: int, settings: Settings, tmp: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=rendezvous(tmp), rank=rank,
                            world_size=settings.ranks, device_id=torch.device("cuda", rank))
    try:
        out = {"allgather": allgather_sweep(settings, dist, device=f"cuda:{rank}"),
               "allreduce": allreduce_small(dist, device=f"cuda:{rank}")}
        if rank == 0:
            write_rank_result(tmp, rank, out)
    finally:
        dist.destroy_process_group()
