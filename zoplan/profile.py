"""`zoplan profile`: measure this machine into a hardware profile the planner uses.

Two paths, one output (a profile that validates with HardwareProfile.from_dict):
- CUDA (one rank per GPU): pinned H2D / D2H per GPU alone, both directions at once,
  pairs of GPUs at once (-> pcie.switch_groups: GPUs that slow each other down share an
  uplink), all GPUs at once (-> host.mem_bw_gbps, a lower bound of the host ceiling);
  GPU-to-GPU copy, NCCL all-gather vs size and a small all-reduce (spawned ranks);
  block forwards over a grid of shapes in bf16 (-> the compute fit); z + update +
  perturb per parameter; memory; NVLink topology from `nvidia-smi topo -m`.
- CPU (gloo ranks sharing this host, exactly as zoexec runs them): copies between a
  /dev/shm block store and a rank's buffer (one rank with all cores; all ranks at once
  with cores // ranks threads each: zoexec.threads' rule), gloo
  all_gather_single vs size and the loss all-reduce (spawned ranks), block forwards
  in fp32 (zoexec.models' real OPT block) with all cores and k ranks at once
  (-> compute.rank_scaling), and the update task's z + update + perturb (zoexec.zo).

Every figure gets a "[M] zoplan profile <date> <what>" note; raw samples, medians and
IQRs go into profile["measurements"], host, versions and devices into
profile["provenance"]. torch is imported lazily: `import zoplan` never imports it.

Noise: a sample during which OTHER processes used the CPUs is taken again after a pause
(Guard; counted in measurements as rejected samples), and a full CPU profile measures
everything in 3 rounds and keeps the median of each figure (a shared or virtual
machine's speed drifts by tens of percent from one minute to the next).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from zoexec.threads import threads_per_rank, usable_cores
from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.hardware import PROFILES_DIR, HardwareProfile
from zoplan.io import atomic_write_text

KIB, MIB, GIB = 2**10, 2**20, 2**30
ALLREDUCE_ITERS = 30          # the loss all-reduce is ~100 us: many samples are cheap
SHARE_THRESHOLD = 0.75        # two GPUs share an uplink when each gets < 75% of alone
RETRIES = 8                   # a sample disturbed by other processes is retaken (x repeats)
BACKOFF_S = 0.25              # and only after a pause: other work comes in bursts


# ---- settings ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Settings:
    """What to measure and how often; `ranks` = local ranks (CPU: gloo processes)."""

    repeats: int
    quick: bool
    ranks: int
    cores: int
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {self.ranks}")

    @property
    def rounds(self) -> int:
        """Whole measurement rounds, a minute apart; the profile takes the median of each
        figure (CPU hosts: a shared or virtual machine's speed drifts)."""
        return 1 if self.quick or self.device == "cuda" else 3

    @property
    def retries(self) -> int:
        """Extra tries (x repeats) for samples disturbed by other processes."""
        return 2 if self.quick else RETRIES

    @property
    def copy_bytes(self) -> int:
        """The headline copy size: a block-sized buffer."""
        return 16 * MIB if self.device == "cpu" else 256 * MIB

    @property
    def store_bytes(self) -> int:
        """Size of the store the CPU copies cycle through (beyond the caches)."""
        return 256 * MIB if self.quick else 1024 * MIB

    @property
    def copy_sweep(self) -> list[int]:
        if self.device == "cpu":
            return [4 * MIB, 16 * MIB] if self.quick else [1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
        return [16 * MIB, 256 * MIB] if self.quick else [4 * MIB, 64 * MIB, 256 * MIB, GIB]

    @property
    def gather_sizes(self) -> list[int]:
        """Total all-gather output sizes (bytes)."""
        if self.device == "cpu":
            sizes = [4 * KIB, 256 * KIB, 4 * MIB] if self.quick else \
                [4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
        else:
            sizes = [8 * KIB, MIB, 64 * MIB] if self.quick else \
                [8 * KIB, 256 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB]
        return sizes

    @property
    def forward_grid(self) -> list[tuple[int, int, int]]:
        """(hidden, batch, seq) of the timed block forwards."""
        if self.device == "cpu":
            hiddens = [256, 512] if self.quick else [256, 512, 1024]
            shapes = [(1, 32), (1, 128), (4, 128)] if self.quick else \
                [(1, 16), (1, 64), (1, 128), (4, 128), (8, 256)]
        else:
            hiddens = [1024, 2048] if self.quick else [1024, 2048, 4096]
            shapes = [(1, 128), (4, 512)] if self.quick else \
                [(1, 64), (1, 256), (2, 512), (4, 1024), (8, 2048)]
        return [(h, b, s) for h in hiddens for b, s in shapes]

    @property
    def reference_shape(self) -> tuple[int, int, int]:
        """The shape timed with all ranks at once (-> compute.rank_scaling)."""
        return self.forward_grid[-1]

    @property
    def zo_hidden(self) -> int:
        """Hidden size of the block whose update task is timed (its real tensor specs)."""
        if self.device == "cpu":
            return 256 if self.quick else 512
        return 2048 if self.quick else 4096


# ---- statistics and timing -----------------------------------------------------------------
def summarize(samples: list[float]) -> dict:
    """Raw samples (s), median and interquartile range of repeated measurements."""
    ordered = sorted(samples)
    med = statistics.median(ordered)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = med
    return {"samples_s": [float(f"{x:.6g}") for x in samples], "median_s": med,
            "iqr_s": [q1, q3], "iqr_pct": 100.0 * (q3 - q1) / med if med > 0 else 0.0}


class Guard:
    """Tells whether OTHER processes used the CPUs during a measurement: busy CPU time
    of the host (/proc/stat) minus that of this profiling run's process tree. Other
    work on the cores slows a measurement by far more than its share (torch threads
    wait for each other), so such samples are taken again."""

    def __init__(self, root_pid: int | None = None, *, retries: int = RETRIES) -> None:
        import psutil

        self._psutil = psutil
        self.retries = retries
        self.root = psutil.Process(root_pid or os.getpid())
        self.rejected = 0

    def _host_busy(self) -> float:
        t = self._psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _ours(self) -> float:
        total = 0.0
        for proc in [self.root] + self.root.children(recursive=True):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except self._psutil.Error:
                pass
        return total

    def mark(self) -> tuple[float, float]:
        return self._host_busy(), self._ours()

    def others_s(self, mark: tuple[float, float]) -> float:
        host, ours = self.mark()
        return max(0.0, (host - mark[0]) - (ours - mark[1]))

    def clean(self, mark: tuple[float, float], wall_s: float) -> bool:
        """No more than 2 clock ticks and 10% of the wall time used by others."""
        return self.others_s(mark) <= max(0.02, 0.1 * wall_s)


ACTIVE_GUARD: list[Guard] = []   # the guard of the running `zoplan profile` (this process)


def rank_samples(fn: Callable[[], Any], *, repeats: int, dist, guard: Guard,
                 warmup: int = 1, sync: Callable[[], Any] | None = None) -> list[float]:
    """time_samples for ranks measuring at once: every rank starts a sample after a
    barrier, and all ranks keep or drop it together (an all-reduce of the guard's verdict),
    so they stay in step."""
    import torch

    out: list[float] = []
    flag = torch.zeros(1)
    for tries in range(1, warmup + (guard.retries + 1) * repeats + 1):
        dist.barrier()
        mark = guard.mark()
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        wall = time.perf_counter() - start
        flag.fill_(0.0 if guard.clean(mark, wall) else 1.0)
        dist.all_reduce(flag)
        if tries <= warmup:
            continue
        if flag.item() and tries <= warmup + guard.retries * repeats:
            guard.rejected += 1
            time.sleep(BACKOFF_S)
            continue
        out.append(wall)
        if len(out) == repeats:
            break
    return out


def time_samples(fn: Callable[[], Any], *, repeats: int, warmup: int = 1,
                 sync: Callable[[], Any] | None = None,
                 before: Callable[[], Any] | None = None,
                 guard: Guard | None = None) -> list[float]:
    """Wall time of `fn` (then `sync`), `repeats` times after `warmup` untimed runs;
    `before` runs untimed ahead of each run (a barrier, say). With a `guard`, a sample
    during which other processes used the CPUs is taken again after a pause (at most
    RETRIES x repeats extra tries; the guard counts the rejects)."""
    out: list[float] = []
    tries = 0
    while len(out) < repeats:
        if before:
            before()
        active = guard or (ACTIVE_GUARD[0] if ACTIVE_GUARD else None)
        mark = active.mark() if active else None
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        wall = time.perf_counter() - start
        tries += 1
        if tries <= warmup:
            continue
        if active and not active.clean(mark, wall) and tries <= warmup + active.retries * repeats:
            active.rejected += 1
            time.sleep(BACKOFF_S)
            continue
        out.append(wall)
    return out


def gbps(num_bytes: float, seconds: float) -> float:
    return num_bytes / seconds / 1e9 if seconds > 0 else 0.0


# ---- the compute fit ---------------------------------------------------------------------
def _wls_line(xs: list[float], ts: list[float]) -> tuple[float, float]:
    """(o, a) minimising sum(((o + a x - t) / t)^2) with o >= 0."""
    w = [1.0 / (t * t) for t in ts]
    sw, sx, st = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * t for wi, t in zip(w, ts))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * sxx - sx * sx
    if det > 0:
        a = (sw * sxt - sx * st) / det
        o = (st - a * sx) / sw
        if o >= 0 and a > 0:
            return o, a
    return 0.0, sxt / sxx if sxx > 0 else 0.0


def fit_compute(points: list[dict], *, mem_gbps: float) -> dict:
    """Least-squares fit (relative error) of the profile's forward-time model
    t = overhead + max(flops / (peak * m / (m + m_half)), weight_bytes / mem_gbps)
    to timed forwards ({"flops", "weight_bytes", "tokens", "median_s"}).
    m_half is searched on a log grid; for each, overhead and 1/peak are a weighted
    linear least-squares problem (points the memory term dominates are left out)."""
    if len(points) < 2:
        raise ZoError(f"the compute fit needs >= 2 timed shapes, got {len(points)}")
    best = None
    for m_half in [0.0] + [2 ** (k / 4) for k in range(0, 61)]:
        fit = _fit_at(points, m_half, mem_gbps)
        if fit and (best is None or fit["rel_rms_pct"] < best["rel_rms_pct"]):
            best = fit
    if best is None:
        raise ZoError("the compute fit failed: forward times do not grow with FLOPs")
    return best


def _fit_at(points: list[dict], m_half: float, mem_gbps: float) -> dict | None:
    xs = [p["flops"] * (p["tokens"] + m_half) / p["tokens"] for p in points]
    ts = [p["median_s"] for p in points]
    o, a = _wls_line(xs, ts)
    for _ in range(3):  # leave out the points whose memory term wins, refit
        keep = [i for i, x in enumerate(xs)
                if a * x >= points[i]["weight_bytes"] / (mem_gbps * 1e9)]
        if len(keep) < 2:
            break
        o, a = _wls_line([xs[i] for i in keep], [ts[i] for i in keep])
    if a <= 0:
        return None
    model = [o + max(a * x, p["weight_bytes"] / (mem_gbps * 1e9)) for x, p in zip(xs, points)]
    resid = [100.0 * (m - t) / t for m, t in zip(model, ts)]
    return {"peak_tflops": 1.0 / a / 1e12, "overhead_us": o * 1e6, "m_half_tokens": m_half,
            "mem_gbps": mem_gbps,
            "rel_rms_pct": math.sqrt(sum(r * r for r in resid) / len(resid)),
            "residuals_pct": [round(r, 2) for r in resid]}


def rank_scaling(*, alone_s: float, together_s: float, ranks: int, overhead_s: float) -> float:
    """compute.rank_scaling from one shape timed on 1 rank with all cores (alone_s) and
    on each of `ranks` ranks running at once (together_s): the profile predicts
    together = overhead + (alone - overhead) * ranks / rank_scaling."""
    if ranks <= 1:
        return 1.0
    work_alone, work_together = alone_s - overhead_s, together_s - overhead_s
    if work_alone <= 0 or work_together <= 0:
        return 1.0
    return max(0.05, min(float(ranks), ranks * work_alone / work_together))


# ---- block forwards and zo maths (shared by both paths) ----------------------------------
def opt_block_config(hidden: int, seq: int) -> dict:
    """A generic OPT-style block (the FLOP and byte formulas of zoplan.models)."""
    return {"model_type": "opt", "num_hidden_layers": 1, "hidden_size": hidden,
            "ffn_dim": 4 * hidden, "num_attention_heads": max(1, hidden // 64),
            "vocab_size": 64, "max_position_embeddings": max(seq, 64),
            "word_embed_proj_dim": hidden, "do_layer_norm_before": True,
            "tie_word_embeddings": True}


def block_spec(hidden: int, seq: int):
    from zoplan.models import spec_from_hf_config

    return spec_from_hf_config(opt_block_config(hidden, seq), name=f"opt-block-{hidden}")


def build_block(hidden: int, seq: int, *, dtype: str, device):
    """zoexec's ModelParts of one OPT block, on `device` in `dtype` (zoexec's own code)."""
    from zoexec.models import build_parts

    parts, flats = build_parts(opt_block_config(hidden, seq), param_dtype=dtype,
                               compute_dtype=dtype)
    parts.to(device)
    from zoexec.models import bind_block
    bind_block(parts, flats[0].to(device=device, dtype=parts.dtype))
    return parts


def time_forward(parts, *, batch: int, seq: int, repeats: int, device, sync=None) -> dict:
    """Median time of one block forward over batch x seq tokens (zoexec's call)."""
    import torch

    ids = torch.randint(0, 64, (batch, seq), device=device)
    with torch.inference_mode():
        hidden, ctx = parts.embed(ids)
        samples = time_samples(lambda: parts.block_forward(hidden, ctx), repeats=repeats,
                               warmup=1, sync=sync)
    return summarize(samples)


def forward_point(hidden: int, batch: int, seq: int, stats: dict, *, dtype_bytes: int) -> dict:
    spec = block_spec(hidden, seq)
    tokens = batch * seq
    return {"hidden": hidden, "batch": batch, "seq": seq, "tokens": tokens,
            "flops": tokens * spec.block_flops_per_token(seq),
            "weight_bytes": spec.block_params * dtype_bytes, **stats}


def forward_grid(settings: Settings, *, dtype: str, device, sync=None, tick=None) -> list[dict]:
    """Timed forwards over settings.forward_grid (one block built per hidden size)."""
    from zoplan.models import dtype_bytes

    points, built = [], {}
    for hidden, batch, seq in settings.forward_grid:
        if hidden not in built:
            built = {hidden: build_block(hidden, max(s for _, _, s in settings.forward_grid),
                                         dtype=dtype, device=device)}
        stats = time_forward(built[hidden], batch=batch, seq=seq, repeats=settings.repeats,
                             device=device, sync=sync)
        points.append(forward_point(hidden, batch, seq, stats, dtype_bytes=dtype_bytes(dtype)))
        if tick:
            tick(f"forward h={hidden} b={batch} s={seq}: {stats['median_s'] * 1e3:.1f} ms")
    return points


def zo_steps(hidden: int, *, device, dtype=None) -> tuple[dict, int]:
    """The parts of zoexec's update task on one real OPT block (its tensor specs, so
    z_block's chunks and threads are as in a run): z, apply_update, perturb_into."""
    import torch
    from zoexec.models import build_parts
    from zoexec.zo import apply_update, perturb_into, z_block

    parts, _ = build_parts(opt_block_config(hidden, 64))
    specs, n = parts.block_specs, parts.block_numel
    theta, z, work = (torch.randn(n, dtype=dtype or torch.float32, device=device)
                      for _ in range(3))
    steps = {
        "z": lambda: z_block(1, 0, specs, out=z),
        "update": lambda: apply_update(theta, z, lr=1e-9, g=1.0, weight_decay=0.0,
                                       decay_mask_or_specs=specs),
        "perturb": lambda: perturb_into(work, theta, z, 1e-3),
    }
    steps["task"] = lambda: [steps[k]() for k in ("z", "update", "z", "perturb")]
    return steps, n


def zo_costs(settings: Settings, *, device, sync=None, dtype=None) -> dict:
    """The update task of zoexec's engine (z for the deferred update, apply_update, z
    for the new perturbation, perturb_into) and each part alone; ns per block parameter."""
    steps, n = zo_steps(settings.zo_hidden, device=device, dtype=dtype)
    out = {"block_params": n, "hidden": settings.zo_hidden}
    for name, fn in steps.items():
        out[name] = summarize(time_samples(fn, repeats=settings.repeats, sync=sync))
    out["ns_per_param"] = out["task"]["median_s"] / n * 1e9
    return out


# ---- CPU path: one rank alone in this process ----------------------------------------------
def shm_store(numel: int):
    """A flat fp32 tensor mapped from a /dev/shm file, as zoexec.store maps the block store."""
    from zoexec.store import SHM_DIR, create_store

    path = Path(SHM_DIR) / f"zoplan-profile-{os.getpid()}-{time.monotonic_ns()}"
    import torch
    try:
        store = create_store(path, num_blocks=1, block_numel=numel, stride=numel,
                             dtype=torch.float32)
    finally:
        path.unlink(missing_ok=True)
    store.flat.fill_(1.0)
    return store.flat


class RoundRobinStore:
    """A /dev/shm store of several block-sized pieces and one rank buffer; each copy
    takes the next piece, so the store is read cold as in a run whose store is larger
    than the caches (a 16 MiB buffer copied again and again would stay in cache)."""

    def __init__(self, piece_bytes: int, *, store_bytes: int) -> None:
        import torch

        self.numel = piece_bytes // 4
        self.pieces = max(2, store_bytes // piece_bytes)
        self.store = shm_store(self.numel * self.pieces)
        self.buf = torch.zeros(self.numel)
        self.next = 0

    def _piece(self):
        self.next = (self.next + 1) % self.pieces
        return self.store[self.next * self.numel:(self.next + 1) * self.numel]

    def h2d(self) -> None:
        self.buf.copy_(self._piece(), non_blocking=True)

    def d2h(self) -> None:
        self._piece().copy_(self.buf, non_blocking=True)


def cpu_copy(num_bytes: int, *, repeats: int, store_bytes: int) -> dict:
    """h2d (store -> rank buffer) and d2h (rank buffer -> store) copies of one rank,
    with zoexec's call (Tensor.copy_ on a /dev/shm mapping)."""
    rr = RoundRobinStore(num_bytes, store_bytes=store_bytes)
    h2d = summarize(time_samples(rr.h2d, repeats=repeats))
    d2h = summarize(time_samples(rr.d2h, repeats=repeats))
    return {"bytes": num_bytes, "store_bytes": rr.numel * 4 * rr.pieces, "h2d": h2d,
            "d2h": d2h, "h2d_gbps": gbps(num_bytes, h2d["median_s"]),
            "d2h_gbps": gbps(num_bytes, d2h["median_s"])}


def measure_cpu(settings: Settings, tick: Callable[[str], None]) -> dict:
    """Everything the CPU profile needs (one rank here, then `ranks` spawned ranks)."""
    import torch

    torch.set_num_threads(threads_per_rank(settings.cores, 1))
    m: dict = {"threads_alone": torch.get_num_threads()}
    m["copy_alone"] = [cpu_copy(size, repeats=settings.repeats, store_bytes=settings.store_bytes)
                       for size in settings.copy_sweep]
    tick(f"copy, one rank: {m['copy_alone'][-1]['h2d_gbps']:.1f} GB/s")
    m["forward_alone"] = forward_grid(settings, dtype="fp32", device="cpu", tick=tick)
    m["zo_alone"] = zo_costs(settings, device="cpu")
    tick(f"zo update task: {m['zo_alone']['ns_per_param']:.2f} ns/param")
    m["ranks"] = spawn_cpu_ranks(settings) if settings.ranks > 1 else None
    tick(f"{settings.ranks} gloo ranks at once")
    return m


# ---- CPU path: spawned gloo ranks ----------------------------------------------------------
def spawn_cpu_ranks(settings: Settings) -> dict:
    """Run `_cpu_rank` on settings.ranks gloo processes; returns the per-rank results."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="zoplan-profile-") as tmp:
        try:
            mp.spawn(_cpu_rank, args=(settings, tmp), nprocs=settings.ranks, join=True)
        except Exception as exc:  # ProcessRaisedException carries the rank's traceback
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ZoError(f"profiling with {settings.ranks} gloo ranks failed: {last}") from None
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text())
                 for r in range(settings.ranks)]
    return {"threads_per_rank": ranks[0]["threads"], "per_rank": ranks}


def _cpu_rank(rank: int, settings: Settings, tmp: str) -> None:
    """One spawned rank: concurrent copies, gloo collectives, concurrent forward and zo."""
    import torch
    import torch.distributed as dist

    threads = threads_per_rank(settings.cores, settings.ranks)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=settings.ranks)
    guard = Guard(os.getppid(), retries=settings.retries)
    sample = partial(rank_samples, dist=dist, guard=guard)
    try:
        with torch.inference_mode():
            out = {"rank": rank, "threads": threads}
            out.update(_rank_copies(settings, sample))
            out["allgather"] = allgather_sweep(settings, dist, device="cpu", sample=sample)
            out["allreduce"] = allreduce_small(dist, device="cpu", sample=sample)
            out.update(_rank_compute(settings, dist, sample))
            out["rejected"] = guard.rejected
        (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def _rank_copies(settings: Settings, sample) -> dict:
    rr = RoundRobinStore(settings.copy_bytes, store_bytes=settings.store_bytes // settings.ranks)
    h2d = sample(rr.h2d, repeats=settings.repeats)
    d2h = sample(rr.d2h, repeats=settings.repeats)
    return {"copy_bytes": settings.copy_bytes, "h2d": summarize(h2d), "d2h": summarize(d2h)}


def _rank_compute(settings: Settings, dist, sample) -> dict:
    import torch

    hidden, batch, seq = settings.reference_shape
    dist.barrier()
    parts = build_block(hidden, seq, dtype="fp32", device="cpu")
    ids = torch.randint(0, 64, (batch, seq))
    hid, ctx = parts.embed(ids)
    fwd = sample(lambda: parts.block_forward(hid, ctx), repeats=settings.repeats)
    steps, n = zo_steps(settings.zo_hidden, device="cpu")
    task = summarize(sample(steps["task"], repeats=settings.repeats))
    return {"forward": {"hidden": hidden, "batch": batch, "seq": seq, **summarize(fwd)},
            "zo": {"ns_per_param": task["median_s"] / n * 1e9, "task": task}}


def _barrier_sampler(dist, sync=None):
    """Samples after a barrier (NCCL ranks: GPU timings, no CPU guard)."""
    return partial(time_samples, before=dist.barrier, sync=sync)


def allgather_sweep(settings: Settings, dist, *, device, sample=None) -> list[dict]:
    """dist.all_gather_single (zoexec's call) over the world for each total size."""
    import torch

    world = dist.get_world_size()
    cuda = str(device).startswith("cuda")
    sample = sample or _barrier_sampler(dist, torch.cuda.synchronize if cuda else None)
    out = []
    for size in settings.gather_sizes:
        piece = max(1, size // 4 // world)
        inp = torch.ones(piece, device=device)
        res = torch.empty(piece * world, device=device)
        samples = sample(lambda: dist.all_gather_single(res, inp), repeats=settings.repeats,
                         warmup=2)
        out.append({"bytes": piece * world * 4, **summarize(samples)})
    return out


def allreduce_small(dist, *, device, sample=None) -> dict:
    """The loss all-reduce of zoexec's step: two float64 scalars over the world."""
    import torch

    vec = torch.zeros(2, dtype=torch.float64, device=device)
    cuda = str(device).startswith("cuda")
    sample = sample or _barrier_sampler(dist, torch.cuda.synchronize if cuda else None)
    return summarize(sample(lambda: dist.all_reduce(vec), repeats=ALLREDUCE_ITERS, warmup=3))


def collective_figures(gathers: list[dict], allreduce: dict, world: int) -> dict:
    """latency_us, allreduce_small_us and the allgather_busbw table of the profile:
    the planner prices an all-gather as latency + bytes * (s-1)/s / busbw(bytes)."""
    latency = gathers[0]["median_s"]
    table = []
    for g in gathers[1:]:
        payload = g["bytes"] * (world - 1) / world
        busbw = gbps(payload, max(g["median_s"] - latency, 0.1 * g["median_s"]))
        table.append([g["bytes"], round(busbw, 4)])
    if not table:
        table = [[gathers[0]["bytes"], round(gbps(gathers[0]["bytes"], latency), 4)]]
    return {"latency_us": round(latency * 1e6, 2),
            "allreduce_small_us": round(allreduce["median_s"] * 1e6, 2),
            "allgather_busbw": table}


# ---- CUDA path -------------------------------------------------------------------------------
def _cuda_copy_jobs(torch, devices: list[int], num_bytes: int, directions: tuple[str, ...]):
    """One pinned host buffer, one device buffer and one stream per (device, direction)."""
    jobs = []
    for dev in devices:
        for direction in directions:
            host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
            gpu = torch.empty(num_bytes, dtype=torch.uint8, device=f"cuda:{dev}")
            dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
            jobs.append((dst, src, torch.cuda.Stream(device=dev)))
    return jobs


def cuda_copy(torch, devices: list[int], num_bytes: int, directions: tuple[str, ...],
              repeats: int) -> dict:
    """Copies on several GPUs / directions launched together; per-copy GB/s = bytes over
    the wall time of the whole set (they run side by side)."""
    jobs = _cuda_copy_jobs(torch, devices, num_bytes, directions)

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


def share_groups(n: int, alone: list[float], pairs: dict) -> list[list[int]]:
    """Union of GPU pairs that slow each other down when both pull from the host."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i
    for (i, j), rate in pairs.items():
        if rate < SHARE_THRESHOLD * min(alone[i], alone[j]):
            parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values())


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


def fabric_from_topology(n: int, matrix: list[list[str]] | None) -> dict:
    """fabric.kind and groups: all pairs NVLink -> nvswitch; disjoint NVLink cliques ->
    bridge; else host."""
    if n == 1 or matrix is None:
        return {"kind": "host"}
    linked = [[i != j and matrix[i][j].startswith("NV") for j in range(n)] for i in range(n)]
    if all(linked[i][j] for i in range(n) for j in range(n) if i != j):
        return {"kind": "nvswitch", "groups": [list(range(n))]}
    groups, seen = [], set()
    for i in range(n):
        if i in seen:
            continue
        group = [i] + [j for j in range(n) if linked[i][j]]
        if all(linked[a][b] for a in group for b in group if a != b):
            groups.append(group)
            seen.update(group)
        else:
            return {"kind": "host"}
    if all(len(g) == 1 for g in groups):
        return {"kind": "host"}
    return {"kind": "bridge", "groups": groups}


def measure_cuda(settings: Settings, tick: Callable[[str], None]) -> dict:
    """Everything the CUDA profile needs, GPUs 0..ranks-1 of this machine."""
    import torch

    n, size, reps = settings.ranks, settings.copy_bytes, settings.repeats
    m: dict = {"devices": [torch.cuda.get_device_name(i) for i in range(n)],
               "memory": [list(torch.cuda.mem_get_info(i)) for i in range(n)]}
    m["h2d"] = [cuda_copy(torch, [i], size, ("h2d",), reps) for i in range(n)]
    m["d2h"] = [cuda_copy(torch, [i], size, ("d2h",), reps) for i in range(n)]
    m["duplex"] = [cuda_copy(torch, [i], size, ("h2d", "d2h"), reps) for i in range(n)]
    m["sweep"] = [cuda_copy(torch, [0], s, ("h2d",), reps) for s in settings.copy_sweep]
    tick(f"host copies, GPU alone: {m['h2d'][0]['per_copy_gbps']:.1f} GB/s H2D")
    m["pairs"] = {f"{i},{j}": cuda_copy(torch, [i, j], size, ("h2d",), reps)
                  for i in range(n) for j in range(i + 1, n)}
    m["all"] = cuda_copy(torch, list(range(n)), size, ("h2d",), reps)
    tick(f"host copies, all {n} GPUs: {m['all']['total_gbps']:.1f} GB/s")
    m.update(_cuda_device_copies(torch, settings))
    sync = torch.cuda.synchronize
    m["forward_alone"] = forward_grid(settings, dtype="bf16", device="cuda:0", sync=sync,
                                      tick=tick)
    m["zo_alone"] = zo_costs(settings, device="cuda:0", sync=sync)
    tick(f"zo update task: {m['zo_alone']['ns_per_param']:.3f} ns/param")
    m["topology"] = nvlink_matrix(n)
    m["nccl"] = spawn_nccl_ranks(settings) if n > 1 else None
    tick("NCCL collectives" if n > 1 else "one GPU: no collectives")
    return m


def _cuda_device_copies(torch, settings: Settings) -> dict:
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
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="zoplan-profile-") as tmp:
        try:
            mp.spawn(_nccl_rank, args=(settings, tmp), nprocs=settings.ranks, join=True)
        except Exception as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ZoError(f"profiling NCCL with {settings.ranks} GPUs failed: {last}") from None
        return json.loads((Path(tmp) / "rank0.json").read_text())


def _nccl_rank(rank: int, settings: Settings, tmp: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=settings.ranks, device_id=torch.device("cuda", rank))
    try:
        out = {"allgather": allgather_sweep(settings, dist, device=f"cuda:{rank}"),
               "allreduce": allreduce_small(dist, device=f"cuda:{rank}")}
        if rank == 0:
            (Path(tmp) / "rank0.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


# ---- building the profile ------------------------------------------------------------------
def note(date: str, what: str) -> str:
    return f"[M] zoplan profile {date} {what}"


def median_rate(copies: list[dict], key: str) -> float:
    return statistics.median(c[key] for c in copies)


def cpu_profile(m: dict, settings: Settings, *, name: str, date: str, memory: dict) -> dict:
    """The profile dict of a CPU host (gloo ranks), from measure_cpu's results."""
    head = next(c for c in m["copy_alone"] if c["bytes"] == settings.copy_bytes)
    h2d, d2h = head["h2d_gbps"], head["d2h_gbps"]
    ranks = m["ranks"]
    together = _cpu_together(ranks, settings) if ranks else None
    mem_bw = max(h2d, d2h, together["copy_gbps"] if together else 0.0)
    fit = fit_compute(m["forward_alone"], mem_gbps=2 * h2d)
    k, threads = settings.ranks, m["threads_alone"]
    scaling = rank_scaling(alone_s=_reference_alone(m, settings), ranks=k,
                           together_s=together["forward_s"], overhead_s=fit["overhead_us"] * 1e-6) \
        if together else 1.0
    zo_scaling = k * m["zo_alone"]["ns_per_param"] / together["zo_ns_per_param"] \
        if together else 1.0
    coll = together["collective"] if together else _single_rank_collective()
    sources = _cpu_sources(settings, threads=threads, fit=fit, date=date,
                           num_forwards=len(m["forward_alone"]))
    if not together:
        for key in ("collective.latency_us", "collective.allreduce_small_us",
                    "collective.allgather_busbw", "fabric.p2p_gbps", "host.mem_bw_gbps",
                    "compute.rank_scaling", "compute.zo_rank_scaling"):
            sources[key] = "[D] one rank: nothing shared, no collectives measured"
    coll_net = coll["allgather_busbw"][-1][1]
    return {
        "schema_version": 1, "name": name, "gpus_per_node": k, "max_nodes": 1,
        "description": f"{memory['cpu_model']}: {k} gloo ranks on {settings.cores} cores "
                       f"(measured by zoplan profile {date})",
        "device": {"kind": "cpu", "model": memory["cpu_model"],
                   "memory_gib": round(memory["total_gib"], 2),
                   "reserved_gib": round(memory["used_gib"] + 1.0, 2),
                   "concurrent_engines": False},
        "host": {"memory_gib": round(memory["total_gib"], 2), "mem_bw_gbps": _r(mem_bw),
                 "cores": settings.cores},
        "pcie": {"h2d_gbps": _r(h2d), "d2h_gbps": _r(d2h), "duplex_gbps": _r(max(h2d, d2h)),
                 "pinned": False, "switch_uplink_gbps": _r(mem_bw)},
        "fabric": {"kind": "shm", "p2p_gbps": coll_net},
        "collective": coll,
        "network": {"gbps": coll_net, "latency_us": coll["latency_us"]},
        "compute": {"peak_tflops": _r(fit["peak_tflops"]), "mem_gbps": _r(fit["mem_gbps"]),
                    "m_half_tokens": round(fit["m_half_tokens"], 2),
                    "overhead_us": round(fit["overhead_us"], 2),
                    "zo_ns_per_param": _r(m["zo_alone"]["ns_per_param"]),
                    "rank_scaling": _r(scaling), "zo_rank_scaling": _r(zo_scaling)},
        "sources": sources,
        "measurements": {**m, "fit": fit, "together": together},
    }


def _cpu_sources(settings: Settings, *, threads: int, fit: dict, date: str,
                 num_forwards: int) -> dict:
    """The source note of each figure of a CPU profile."""
    c = note(date, "")
    k = settings.ranks
    return {
        "device.memory_gib": f"{c}host memory (a CPU rank's memory is the host's, shared)",
        "device.reserved_gib": f"{c}host memory in use before the run + 1 GiB runtime",
        "device.concurrent_engines": f"{c}a gloo rank runs its tasks one at a time (zoexec's CPU schedule)",
        "host.memory_gib": f"{c}psutil total memory",
        "host.mem_bw_gbps": f"{c}{k} ranks copying {settings.copy_bytes // MIB} MiB at once "
                            f"({threads_per_rank(settings.cores, k)} threads each), sum of their rates",
        "host.cores": f"{c}cores this process may use (os.sched_getaffinity)",
        "pcie.h2d_gbps": f"{c}one rank ({threads} threads) copying {settings.copy_bytes // MIB} MiB "
                         f"pieces of a {settings.store_bytes // MIB} MiB /dev/shm store into its "
                         "buffer in turn (Tensor.copy_, as zoexec's h2d)",
        "pcie.d2h_gbps": f"{c}one rank ({threads} threads) copying its buffer into "
                         f"{settings.copy_bytes // MIB} MiB pieces of a {settings.store_bytes // MIB} "
                         "MiB /dev/shm store in turn (as zoexec's write-back)",
        "pcie.duplex_gbps": f"{c}a CPU rank copies one way at a time: max of the two directions",
        "pcie.switch_uplink_gbps": f"{c}no switches: the host memory figure",
        "fabric.p2p_gbps": f"{c}gloo all-gather bus bandwidth at the largest size",
        "collective.latency_us": f"{c}gloo all_gather_single of {settings.gather_sizes[0] // KIB} KiB "
                                 f"over {k} ranks (median)",
        "collective.allreduce_small_us": f"{c}gloo all-reduce of two float64 over {k} ranks (median)",
        "collective.allgather_busbw": f"{c}gloo all_gather_single over {k} ranks: "
                                      "(s-1)/s x bytes / (time - latency)",
        "network.gbps": "[D] unused (one host): the gloo bus bandwidth",
        "network.latency_us": "[D] unused (one host): the gloo latency",
        "compute.peak_tflops": f"{c}fit of {num_forwards} fp32 OPT-block forwards, "
                               f"1 rank x {threads} threads (rel. rms {fit['rel_rms_pct']:.1f}%)",
        "compute.m_half_tokens": f"{c}same fit",
        "compute.overhead_us": f"{c}same fit (per forward call: op dispatch)",
        "compute.mem_gbps": f"{c}2 x the one-rank copy rate (read + write)",
        "compute.zo_ns_per_param": f"{c}zoexec update task (z, apply_update, z, perturb_into) on an "
                                   f"OPT block of hidden {settings.zo_hidden}, {threads} threads",
        "compute.rank_scaling": f"{c}forward h={settings.reference_shape[0]} on 1 rank vs {k} ranks "
                                "at once (cores // ranks threads each)",
        "compute.zo_rank_scaling": f"{c}update task on 1 rank vs {k} ranks at once",
    }


def _r(x: float) -> float:
    """Four significant digits (keeps profiles readable, never rounds to zero)."""
    return float(f"{x:.4g}")


def _reference_alone(m: dict, settings: Settings) -> float:
    h, b, s = settings.reference_shape
    return next(p["median_s"] for p in m["forward_alone"]
                if (p["hidden"], p["batch"], p["seq"]) == (h, b, s))


def _cpu_together(ranks: dict, settings: Settings) -> dict:
    """Figures of the k ranks that ran at once: copy sum, forward and zo medians,
    collectives (rank 0's view)."""
    per = ranks["per_rank"]
    copy = sum(gbps(r["copy_bytes"], r["h2d"]["median_s"]) for r in per)
    return {"copy_gbps": copy,
            "forward_s": statistics.median(r["forward"]["median_s"] for r in per),
            "zo_ns_per_param": statistics.median(r["zo"]["ns_per_param"] for r in per),
            "collective": collective_figures(per[0]["allgather"], per[0]["allreduce"],
                                             settings.ranks)}


def _single_rank_collective() -> dict:
    return {"latency_us": 1.0, "allreduce_small_us": 1.0, "allgather_busbw": [[MIB, 100.0]]}


def cuda_profile(m: dict, settings: Settings, *, name: str, date: str, memory: dict) -> dict:
    """The profile dict of a CUDA machine, from measure_cuda's results."""
    n = settings.ranks
    h2d, d2h = median_rate(m["h2d"], "per_copy_gbps"), median_rate(m["d2h"], "per_copy_gbps")
    duplex = median_rate(m["duplex"], "total_gbps")
    alone = [c["per_copy_gbps"] for c in m["h2d"]]
    pairs = {tuple(int(x) for x in key.split(",")): v["per_copy_gbps"]
             for key, v in m["pairs"].items()}
    groups = share_groups(n, alone, pairs)
    uplink = max([h2d] + [len(g) * min(pairs[(g[0], g[1])], h2d) for g in groups if len(g) > 1])
    host_bw = max(m["all"]["total_gbps"], h2d, d2h)
    fabric = fabric_from_topology(n, m["topology"])
    fabric["p2p_gbps"] = _r(m["p2p"]["gbps"]) if "p2p" in m else _r(h2d)
    fit = fit_compute(m["forward_alone"], mem_gbps=m["d2d"]["gbps"])
    coll = collective_figures(m["nccl"]["allgather"], m["nccl"]["allreduce"], n) \
        if m["nccl"] else _single_rank_collective()
    total_gib = statistics.median(t for _, t in m["memory"]) / GIB
    used_gib = max(t - f for f, t in m["memory"]) / GIB
    c = note(date, "")
    size = f"{settings.copy_bytes // MIB} MiB"
    sources = {
        "device.memory_gib": f"{c}torch.cuda.mem_get_info total",
        "device.reserved_gib": f"{c}memory in use at profile time + 2 GiB NCCL/allocator slack [D]",
        "host.memory_gib": f"{c}psutil total memory",
        "host.mem_bw_gbps": f"{c}all {n} GPUs pulling {size} pinned at once (a lower bound of the host ceiling)",
        "host.cores": f"{c}os.sched_getaffinity",
        "pcie.h2d_gbps": f"{c}pinned H2D {size}, one GPU alone (median over GPUs)",
        "pcie.d2h_gbps": f"{c}pinned D2H {size}, one GPU alone (median over GPUs)",
        "pcie.duplex_gbps": f"{c}H2D + D2H at once on one GPU, both together",
        "pcie.switch_groups": f"{c}GPU pairs pulling at once: < {SHARE_THRESHOLD:.0%} of alone = shared uplink",
        "pcie.switch_uplink_gbps": f"{c}a sharing group pulling at once, total (or one GPU alone)",
        "fabric.p2p_gbps": f"{c}GPU0 -> GPU1 copy {size}" if n > 1 else "[D] unused with one GPU",
        "fabric.groups": f"{c}nvidia-smi topo -m (NV# entries)",
        "collective.latency_us": f"{c}NCCL all-gather of {settings.gather_sizes[0] // KIB} KiB over {n} GPUs",
        "collective.allreduce_small_us": f"{c}NCCL all-reduce of two float64 over {n} GPUs",
        "collective.allgather_busbw": f"{c}NCCL all_gather_single over {n} GPUs: (s-1)/s x bytes / (time - latency)",
        "network.gbps": "[D] not measured (one node): a 400 Gb/s NIC assumed",
        "network.latency_us": "[D] not measured (one node): ~20 us assumed",
        "compute.peak_tflops": f"{c}fit of {len(m['forward_alone'])} bf16 OPT-block forwards on GPU 0 "
                               f"(rel. rms {fit['rel_rms_pct']:.1f}%)",
        "compute.m_half_tokens": f"{c}same fit",
        "compute.overhead_us": f"{c}same fit (launch cost per forward)",
        "compute.mem_gbps": f"{c}device-to-device copy on GPU 0 (read + write)",
        "compute.zo_ns_per_param": f"{c}zoexec update task (z, apply_update, z, perturb_into) on GPU 0, "
                                   f"OPT block of hidden {settings.zo_hidden}",
        "compute.rank_scaling": "[D] one GPU per rank: no sharing",
    }
    if n == 1:
        sources["collective.latency_us"] = sources["collective.allreduce_small_us"] = \
            sources["collective.allgather_busbw"] = "[D] one GPU: no collectives"
    return {
        "schema_version": 1, "name": name, "gpus_per_node": n, "max_nodes": 1,
        "description": f"{n}x {m['devices'][0]} on {memory['cpu_model']} "
                       f"(measured by zoplan profile {date})",
        "device": {"kind": "cuda", "model": m["devices"][0], "memory_gib": round(total_gib, 2),
                   "reserved_gib": round(used_gib + 2.0, 2), "concurrent_engines": True},
        "host": {"memory_gib": round(memory["total_gib"], 2), "mem_bw_gbps": _r(host_bw),
                 "cores": settings.cores},
        "pcie": {"h2d_gbps": _r(h2d), "d2h_gbps": _r(d2h), "duplex_gbps": _r(duplex),
                 "pinned": True, "switch_groups": groups, "switch_uplink_gbps": _r(uplink)},
        "fabric": fabric,
        "collective": coll,
        "network": {"gbps": 50.0, "latency_us": 20.0},
        "compute": {"peak_tflops": _r(fit["peak_tflops"]), "mem_gbps": _r(fit["mem_gbps"]),
                    "m_half_tokens": round(fit["m_half_tokens"], 2),
                    "overhead_us": round(fit["overhead_us"], 2),
                    "zo_ns_per_param": _r(m["zo_alone"]["ns_per_param"]), "rank_scaling": 1.0},
        "sources": sources,
        "measurements": {**m, "fit": fit},
    }


# ---- provenance ------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_memory() -> dict:
    import psutil

    vm = psutil.virtual_memory()
    return {"total_gib": vm.total / GIB, "used_gib": (vm.total - vm.available) / GIB,
            "cpu_model": cpu_model()}


def software_versions() -> dict:
    """Versions a profile's figures depend on (calibrate warns when they change)."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "zoplan": __version__, "python": platform.python_version()}


def other_load_pct() -> float:
    """CPU use of OTHER processes right now, percent of all cores (noisy measurements)."""
    import psutil

    me = psutil.Process()
    total = psutil.cpu_percent(interval=0.5)
    mine = me.cpu_percent(interval=None) / (psutil.cpu_count() or 1)
    return max(0.0, total - mine)


def provenance(settings: Settings, *, date: str, devices: list[str], load_pct: float) -> dict:
    return {"tool": "zoplan profile", "date": date, "host": socket.gethostname(),
            "cpu_model": cpu_model(), "os": platform.platform(), "cores": settings.cores,
            "versions": software_versions(), "device_kind": settings.device,
            "devices": devices, "ranks": settings.ranks, "repeats": settings.repeats,
            "quick": settings.quick, "other_load_pct": round(load_pct, 1),
            "threads_rule": "max(1, cores // local_ranks) torch threads per rank (zoexec)",
            "command": " ".join(["zoplan"] + sys.argv[1:]) if sys.argv else "zoplan profile"}


# ---- the command -----------------------------------------------------------------------------
def default_name(settings: Settings, devices: list[str]) -> str:
    host = re.sub(r"[^a-z0-9]+", "-", socket.gethostname().lower()).strip("-") or "host"
    if settings.device == "cpu":
        return f"{host}-cpu{settings.ranks}"
    gpu = re.sub(r"[^a-z0-9]+", "-", devices[0].lower()).strip("-")
    return f"{host}-{settings.ranks}x-{gpu}"


def make_settings(*, ranks: int | None, repeats: int, quick: bool, force_cpu: bool) -> Settings:
    import torch

    cores = usable_cores()
    cuda = not force_cpu and torch.cuda.is_available() and torch.cuda.device_count() > 0
    if cuda:
        count = torch.cuda.device_count()
        if ranks and ranks > count:
            raise ZoError(f"--ranks {ranks} but this machine has {count} CUDA GPUs")
        ranks = ranks or count
    ranks = ranks or cores
    try:
        return Settings(repeats=min(repeats, 3) if quick else repeats, quick=quick, ranks=ranks,
                        cores=cores, device="cuda" if cuda else "cpu")
    except ValueError as exc:
        raise ZoError(str(exc)) from None


def measure(settings: Settings) -> list[dict]:
    """Run the measurements (settings.rounds times) with a rich progress display on
    stderr; one result per round."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    stderr = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("[bold]zoplan profile[/]"),
                  TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=stderr, transient=False) as progress:
        task = progress.add_task(f"{settings.device}, {settings.ranks} ranks", total=None)

        def tick(message: str) -> None:
            progress.update(task, description=message)
            progress.console.print(f"  [dim]{message}[/]", highlight=False)
        run = measure_cuda if settings.device == "cuda" else measure_cpu
        rounds = []
        for index in range(settings.rounds):
            prefix = f"round {index + 1}/{settings.rounds}: " if settings.rounds > 1 else ""
            rounds.append(run(settings, lambda message: tick(prefix + message)))
        progress.update(task, description="done")
    return rounds


def combine_rounds(datas: list[dict]) -> dict:
    """One profile from the profiles of several measurement rounds: each measured
    figure (and each all-gather table entry) is the median over the rounds, so a
    machine whose speed drifts for a minute does not set the figures."""
    data = json.loads(json.dumps(datas[0]))
    if len(datas) == 1:
        return data
    for section in ("device", "host", "pcie", "fabric", "collective", "compute"):
        for key, value in data[section].items():
            if isinstance(value, float):
                data[section][key] = _r(statistics.median(d[section][key] for d in datas))
    table = data["collective"]["allgather_busbw"]
    for i, entry in enumerate(table):
        entry[1] = _r(statistics.median(d["collective"]["allgather_busbw"][i][1] for d in datas))
    _refit_rounds(data, [d["measurements"]["forward_alone"] for d in datas])
    for key, note in data["sources"].items():
        if note.startswith("[M]"):
            data["sources"][key] = f"{note} (median of {len(datas)} rounds)"
    data["measurements"] = {"rounds": [d["measurements"] for d in datas],
                            "per_round": [{s: d[s] for s in ("pcie", "host", "collective",
                                                             "compute")} for d in datas],
                            "fit": data.pop("measurements_fit")}
    return data


def _refit_rounds(data: dict, grids: list[list[dict]]) -> None:
    """The compute fit's figures belong together: fit once on each shape's median
    time over the rounds (not a median of each fitted figure)."""
    points = [dict(p, median_s=statistics.median(g[i]["median_s"] for g in grids))
              for i, p in enumerate(grids[0])]
    fit = fit_compute(points, mem_gbps=data["compute"]["mem_gbps"])
    data["compute"].update(peak_tflops=_r(fit["peak_tflops"]),
                           m_half_tokens=round(fit["m_half_tokens"], 2),
                           overhead_us=round(fit["overhead_us"], 2))
    data["measurements_fit"] = fit


def build_profile(rounds: list[dict], settings: Settings, *, name: str | None, date: str,
                  load_pct: float) -> dict:
    """The profile dict (validated) from the measurements of each round."""
    memory = host_memory()
    devices = rounds[0].get("devices") or [f"cpu rank {r}" for r in range(settings.ranks)]
    name = name or default_name(settings, devices)
    build = cuda_profile if settings.device == "cuda" else cpu_profile
    data = combine_rounds([build(m, settings, name=name, date=date, memory=memory)
                           for m in rounds])
    data["provenance"] = provenance(settings, date=date, devices=devices, load_pct=load_pct)
    data["notes"] = ("Measured on this machine by `zoplan profile`; raw samples, medians and "
                     "IQRs are under measurements.")
    data = json.loads(json.dumps(data, default=float))  # plain JSON types only
    HardwareProfile.from_dict(data, origin=f"measured profile {name}")
    return data


def profile_command(*, output: Path | None, name: str | None, ranks: int | None, repeats: int,
                    quick: bool, force_cpu: bool, console) -> HardwareProfile:
    """`zoplan profile`: measure, build, validate, write atomically, print a summary."""
    if output is not None and not Path(output).parent.exists():
        raise ZoError(f"cannot write {output}: folder {Path(output).parent} does not exist")
    settings = make_settings(ranks=ranks, repeats=repeats, quick=quick, force_cpu=force_cpu)
    load = other_load_pct()
    if load > 25:
        console.print(f"[yellow]warning:[/] other processes use {load:.0f}% of the CPUs: "
                      "the figures will be slow and noisy", highlight=False)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    ACTIVE_GUARD[:] = [Guard(retries=settings.retries)]
    try:
        rounds = measure(settings)
    finally:
        rejected = ACTIVE_GUARD[0].rejected
        ACTIVE_GUARD.clear()
    rounds[0]["rejected_samples"] = rejected + sum(
        r.get("rejected", 0) for m in rounds for r in (m.get("ranks") or {}).get("per_rank", []))
    data = build_profile(rounds, settings, name=name, date=date, load_pct=load)
    path = Path(output) if output else PROFILES_DIR / f"{data['name']}.json"
    profile = HardwareProfile.from_dict(data, origin=f"profile {path}")
    atomic_write_text(path, profile.to_json())
    render_summary(profile, path, console)
    return profile


def render_summary(profile: HardwareProfile, path: Path, console) -> None:
    from rich.table import Table

    table = Table(title=f"{profile.name}: measured figures", show_lines=False)
    for col in ("figure", "value", "how it was measured (see sources)"):
        table.add_column(col, no_wrap=col == "figure")
    rows = [("pcie.h2d_gbps", profile.pcie["h2d_gbps"]), ("pcie.d2h_gbps", profile.pcie["d2h_gbps"]),
            ("host.mem_bw_gbps", profile.host["mem_bw_gbps"]),
            ("collective.latency_us", profile.collective["latency_us"]),
            ("collective.allreduce_small_us", profile.collective["allreduce_small_us"])]
    rows += [(f"compute.{k}", profile.compute[k]) for k in
             ("peak_tflops", "m_half_tokens", "overhead_us", "mem_gbps", "zo_ns_per_param",
              "rank_scaling", "zo_rank_scaling") if k in profile.compute]
    for key, value in rows:
        how = re.sub(r"^\[M\] zoplan profile \S+ ", "", profile.sources.get(key, ""))
        table.add_row(key, f"{value:g}", how)
    busbw = ", ".join(f"{int(b) // KIB} KiB: {bw:g}" for b, bw in profile.collective["allgather_busbw"])
    console.print(table)
    console.print(f"all-gather bus bandwidth (GB/s): {busbw}", highlight=False)
    console.print(f"wrote {path}", highlight=False)
