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
  all_gather_single vs size and the loss all-reduce (spawned ranks); block forwards
  in fp32 of zoexec's real OPT and Llama blocks over a grid of shapes, timed in turn
  (-> the compute fit: GEMM, attention and element-wise terms); z draws after torch
  work and a per-chunk probe (-> the z model), the update/perturb passes; paired
  samples of all ranks at once and rank 0 alone (-> compute.rank_scaling,
  mem_rank_scaling, z_rank_scaling, rank_jitter); and a speed check (SpeedProbe,
  with one-sample probes between the forward grid's passes) that `zoexec run --trace`
  repeats before, between and after its steps, so `zoplan calibrate` can tell gross
  machine drift from model error. Like zoexec's ranks, the CPU path runs with OpenMP
  workers passive and glibc keeping freed memory (zoexec.threads).

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

from zoexec.threads import keep_freed_memory, threads_per_rank, usable_cores
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
    def forward_grid(self) -> list[tuple[str, int, int, int]]:
        """(family, hidden, batch, seq) of the timed block forwards. On the CPU the grid
        spans small and wide blocks, short and long sequences and both block families,
        so the fit can tell GEMMs, attention and element-wise work apart."""
        if self.device == "cpu":
            if self.quick:
                return [("opt", h, b, s) for h in (128, 512)
                        for b, s in ((1, 32), (4, 128), (2, 512), (8, 512))] + \
                    [("llama", 256, b, s) for b, s in ((4, 64), (1, 512))]
            shapes = [(1, 32), (4, 64), (1, 256), (8, 128), (2, 512), (4, 512)]
            wide = {128: [(16, 512), (32, 256)], 256: [(16, 512)], 512: [(8, 512)], 1024: []}
            return [("opt", h, b, s) for h in (128, 256, 512, 1024) for b, s in shapes + wide[h]] \
                + [("llama", h, b, s) for h in (128, 512) for b, s in shapes + wide[h]]
        hiddens = [1024, 2048] if self.quick else [1024, 2048, 4096]
        shapes = [(1, 128), (4, 512)] if self.quick else \
            [(1, 64), (1, 256), (2, 512), (4, 1024), (8, 2048)]
        return [("opt", h, b, s) for h in hiddens for b, s in shapes]

    @property
    def reference_shape(self) -> tuple[str, int, int, int]:
        """The shape timed with all ranks at once (-> compute.rank_scaling)."""
        if self.device == "cpu":
            return ("opt", 256 if self.quick else 512, 4, 128)
        return self.forward_grid[-1]

    @property
    def z_hiddens(self) -> tuple[int, ...]:
        """Hidden sizes of the OPT blocks whose z draws fit the CPU z model."""
        return (128, self.zo_hidden)

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
def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def _wls_nonneg(columns: list[list[float]], ts: list[float], *,
                required: int = 1) -> list[float] | None:
    """Coefficients c >= 0 minimising sum(((sum_j c_j x_j - t) / t)^2): every subset
    of the columns is solved unconstrained and the best one with all coefficients > 0
    kept (a handful of columns: an exact non-negative least squares). Column
    `required` must take part (the GEMM term: a forward always does GEMMs)."""
    import itertools

    k = len(columns)
    w = [1.0 / (t * t) for t in ts]
    best, best_err = None, math.inf
    for size in range(1, k + 1):
        for subset in itertools.combinations(range(k), size):
            if required not in subset:
                continue
            gram = [[sum(wi * columns[a][i] * columns[b][i] for i, wi in enumerate(w))
                     for b in subset] for a in subset]
            rhs = [sum(wi * columns[a][i] * ts[i] for i, wi in enumerate(w)) for a in subset]
            sol = _solve(gram, rhs)
            if sol is None or any(c <= 0 for c in sol):
                continue
            coef = [0.0] * k
            for a, c in zip(subset, sol):
                coef[a] = c
            err = sum(wi * (sum(coef[j] * columns[j][i] for j in range(k)) - t) ** 2
                      for i, (wi, t) in enumerate(zip(w, ts)))
            if err < best_err:
                best, best_err = coef, err
    return best


def fit_compute(points: list[dict], *, mem_gbps: float) -> dict:
    """Least-squares fit (relative error) of the profile's forward-time model
    t = overhead [+ rope_overhead for Llama-family blocks]
        + max(flops / (peak * m / (m + m_half)), weight_bytes / mem_gbps)
        + attn_flops / attn_rate + elems * elem_ns
    to timed forwards ({"flops", "weight_bytes", "tokens", "median_s"}, and on the CPU
    "attn_flops" and "elems"). m_half is searched on a log grid; for each, overhead,
    1/peak, 1/attn_rate and elem_ns are a non-negative weighted least-squares problem
    (points the memory term dominates are left out). The attention and element-wise
    terms are fitted only when the points carry that work, the Llama-family dispatch
    only when the points hold both families."""
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
    ts = [p["median_s"] for p in points]
    gemm = [p["flops"] * (p["tokens"] + m_half) / p["tokens"] for p in points]
    attn = [p.get("attn_flops", 0.0) for p in points]
    elems = [p.get("elems", 0.0) for p in points]
    rope = [float(p.get("family", "opt") != "opt") for p in points]
    if all(rope):   # one family only: its dispatch is overhead_us
        rope = [0.0] * len(points)
    named = [(n, col) for n, col in (("attn", attn), ("elems", elems), ("rope", rope)) if any(col)]
    extra = [col for _, col in named]
    mem = [p["weight_bytes"] / (mem_gbps * 1e9) for p in points]
    keep = list(range(len(points)))
    coef = None
    for _ in range(4):  # leave out the points whose memory term wins, refit
        cols = [[1.0] * len(keep), [gemm[i] for i in keep]] + [[c[i] for i in keep] for c in extra]
        coef = _wls_nonneg(cols, [ts[i] for i in keep])
        if coef is None:
            return None
        nxt = [i for i in range(len(points)) if coef[1] * gemm[i] >= mem[i]]
        if nxt == keep or len(nxt) < 2 + len(extra):
            break
        keep = nxt
    o, a, *rest = coef
    if a <= 0:
        return None
    terms = dict(zip([n for n, _ in named], rest))
    model = [o + max(a * g, mb) + terms.get("attn", 0.0) * at + terms.get("elems", 0.0) * e
             + terms.get("rope", 0.0) * r for g, mb, at, e, r in zip(gemm, mem, attn, elems, rope)]
    resid = [100.0 * (m - t) / t for m, t in zip(model, ts)]
    out = {"peak_tflops": 1.0 / a / 1e12, "overhead_us": o * 1e6, "m_half_tokens": m_half,
           "mem_gbps": mem_gbps,
           "rel_rms_pct": math.sqrt(sum(r * r for r in resid) / len(resid)),
           "residuals_pct": [round(r, 2) for r in resid]}
    if "attn" in terms:   # a zero coefficient (the fit found no cost): 1e6 TFLOP/s
        out["attn_tflops"] = 1.0 / terms["attn"] / 1e12 if terms["attn"] > 1e-24 else 1e6
    if "elems" in terms:
        out["elem_ns"] = terms["elems"] * 1e9
    if "rope" in terms:
        out["rope_overhead_us"] = terms["rope"] * 1e6
    return out


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


def paired_rank_scaling(measured: dict, *, overhead_s: float) -> float:
    """compute.rank_scaling from rank 0's paired forward samples (_paired): the median
    over pairs of rank_scaling(alone, together)."""
    k = len(measured["per_rank"])
    fwd = measured["per_rank"][0]["forward"]
    pairs = zip(fwd["alone"]["samples_s"], fwd["together"]["samples_s"])
    return statistics.median(rank_scaling(alone_s=a, together_s=t, ranks=k, overhead_s=overhead_s)
                             for a, t in pairs)


def paired_mem_scaling(measured: dict, *, fit: dict, gemm_scaling: float) -> float:
    """compute.mem_rank_scaling from rank 0's paired memory-bound forwards: the fit
    splits the shape's time alone into dispatch, GEMM and attention + element-wise
    parts; with the GEMMs shared by `gemm_scaling`, the scaling of the rest that
    explains the time with all ranks at once (median over pairs)."""
    from zoplan.hardware import forward_terms

    k = len(measured["per_rank"])
    fwd = measured["per_rank"][0]["forward_memory"]
    point = forward_point(fwd["hidden"], fwd["batch"], fwd["seq"], {}, dtype_bytes=4)
    over, gemm, rest = forward_terms({"attn_tflops": 1e6, **fit}, flops=point["flops"],
                                     attn_flops=point["attn_flops"], elems=point["elems"],
                                     tokens=point["tokens"])
    out = []
    for alone, together in zip(fwd["alone"]["samples_s"], fwd["together"]["samples_s"]):
        scale = (alone - over) / (gemm + rest) if gemm + rest > 0 else 1.0  # the pair's speed
        left = together - over - gemm * scale * k / gemm_scaling
        out.append(k * rest * scale / left if left > 0 and rest > 0 else float(k))
    return max(0.05, min(float(k), statistics.median(out)))


def rank_jitter(measured: dict) -> float:
    """compute.rank_jitter: how far the slowest rank runs above the ranks' mean when all
    run the same work at once: (max - mean) / mean of each together sample of the
    paired forwards and z draws, median over samples."""
    per = measured["per_rank"]
    out = []
    for key in ("forward", "forward_memory", "z"):
        if not all(key in r for r in per):
            continue
        for times in zip(*(r[key]["together"]["samples_s"] for r in per)):
            mean = statistics.fmean(times)
            if mean > 0:
                out.append((max(times) - mean) / mean)
    return statistics.median(out) if out else 0.0


def paired_z_scaling(measured: dict, *, call_s: float) -> float:
    """compute.z_rank_scaling from rank 0's paired z draws: per-element speed of the
    busiest thread with all ranks at once over that of one rank alone (median over
    pairs; 1 = threads of several ranks draw as fast as one rank's threads)."""
    z = measured["per_rank"][0]["z"]
    call_alone = call_s if z["threads_alone"] > 1 else 0.0       # the pool's hand-over
    call_together = call_s if z["threads_together"] > 1 else 0.0
    out = []
    for alone, together in zip(z["alone"]["samples_s"], z["together"]["samples_s"]):
        per_alone = max(alone - call_alone, 1e-9) / z["busiest_alone"]
        per_together = max(together - call_together, 1e-9) / z["busiest_together"]
        out.append(per_alone / per_together)
    return max(0.05, min(4.0, statistics.median(out)))


def fit_figures(fit: dict) -> dict:
    """The compute section's figures of a forward fit."""
    out = {"peak_tflops": _r(fit["peak_tflops"]), "m_half_tokens": round(fit["m_half_tokens"], 2),
           "overhead_us": round(fit["overhead_us"], 2)}
    if "attn_tflops" in fit:
        out["attn_tflops"] = _r(fit["attn_tflops"])
    if "elem_ns" in fit:
        out["elem_ns"] = _r(fit["elem_ns"])
    if "rope_overhead_us" in fit:
        out["rope_overhead_us"] = round(fit["rope_overhead_us"], 2)
    return out


# ---- block forwards and zo maths (shared by both paths) ----------------------------------
def block_config(hidden: int, seq: int, family: str = "opt") -> dict:
    """A generic one-block model of `family` (the FLOP and element formulas of
    zoplan.models): OPT with a 4h MLP, or Llama with a gated 8h/3 MLP."""
    if family == "opt":
        return {"model_type": "opt", "num_hidden_layers": 1, "hidden_size": hidden,
                "ffn_dim": 4 * hidden, "num_attention_heads": max(1, hidden // 64),
                "vocab_size": 64, "max_position_embeddings": max(seq, 64),
                "word_embed_proj_dim": hidden, "do_layer_norm_before": True,
                "tie_word_embeddings": True}
    heads = max(1, hidden // 64)
    return {"model_type": family, "num_hidden_layers": 1, "hidden_size": hidden,
            "intermediate_size": 8 * hidden // 3 // 32 * 32 or hidden,
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads, "vocab_size": 64,
            "max_position_embeddings": max(seq, 64), "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def opt_block_config(hidden: int, seq: int) -> dict:
    return block_config(hidden, seq, "opt")


def block_spec(hidden: int, seq: int, family: str = "opt"):
    from zoplan.models import spec_from_hf_config

    return spec_from_hf_config(block_config(hidden, seq, family),
                               name=f"{family}-block-{hidden}")


def build_block(hidden: int, seq: int, *, dtype: str, device, family: str = "opt"):
    """zoexec's ModelParts of one block, on `device` in `dtype` (zoexec's own code)."""
    from zoexec.models import bind_block, build_parts

    parts, flats = build_parts(block_config(hidden, seq, family), param_dtype=dtype,
                               compute_dtype=dtype)
    parts.to(device)
    bind_block(parts, flats[0].to(device=device, dtype=parts.dtype))
    return parts


def forward_point(hidden: int, batch: int, seq: int, stats: dict, *, dtype_bytes: int,
                  family: str = "opt", split: bool = True) -> dict:
    """A timed forward with its work: `flops` (GEMMs; with attention when not `split`),
    `attn_flops` and `elems` (see HardwareProfile.forward_time_s)."""
    spec = block_spec(hidden, seq, family)
    tokens = batch * seq
    gemm = tokens * spec.block_gemm_flops_per_token()
    attn = tokens * spec.block_attn_flops_per_token(seq)
    return {"family": family, "hidden": hidden, "batch": batch, "seq": seq, "tokens": tokens,
            "flops": gemm if split else gemm + attn, "attn_flops": attn if split else 0.0,
            "elems": tokens * spec.block_elems_per_token() if split else 0.0,
            "weight_bytes": spec.block_params * dtype_bytes, **stats}


# A forward shorter than this is timed after one untimed call of the same shape: right
# after a different, larger shape it runs cold (caches, allocator, sleeping threads). A
# tiny-opt block over 256 tokens took 1.48x as long right after an h512 forward over 4096
# tokens as right after itself (2-core VM, interleaved, 2 x 150 samples), while in a
# run a forward follows the same block's other stream or a block of the same shape.
WARM_VISIT_BELOW_S = 0.05


def forward_grid(settings: Settings, *, dtype: str, device, sync=None, tick=None,
                 between: Callable[[], Any] | None = None) -> list[dict]:
    """Timed forwards over settings.forward_grid (one block built per family and hidden
    size). The shapes are timed in turn, one sample each per pass, so a machine whose
    speed drifts for some seconds slows every shape alike instead of a few (which would
    bend the fit); short shapes are warmed by an untimed call of their own first
    (WARM_VISIT_BELOW_S). `between` runs after each timed pass (the CPU's speed probes).
    CPU points carry attention and element-wise work apart (the CPU fit prices them on
    their own); GPU points count attention as GEMM FLOPs."""
    import torch
    from zoplan.models import dtype_bytes

    blocks, jobs = {}, []
    longest = max(s for *_, s in settings.forward_grid)
    with torch.inference_mode():
        for family, hidden, batch, seq in settings.forward_grid:
            if (family, hidden) not in blocks:
                blocks[(family, hidden)] = build_block(hidden, longest, dtype=dtype,
                                                       device=device, family=family)
            parts = blocks[(family, hidden)]
            ids = torch.randint(0, 64, (batch, seq), device=device)
            hid, ctx = parts.embed(ids)
            jobs.append(partial(parts.block_forward, hid, ctx))
        samples: list[list[float]] = [[] for _ in jobs]
        warm = [0] * len(jobs)   # untimed calls ahead of each sample (set by the first pass)
        for rep in range(settings.repeats + 1):   # the first pass warms up
            for index, (job, out) in enumerate(zip(jobs, samples)):
                if rep:
                    out += time_samples(job, repeats=1, warmup=warm[index], sync=sync)
                else:
                    first = time_samples(job, repeats=1, warmup=0, sync=sync)[0]
                    warm[index] = int(first < WARM_VISIT_BELOW_S)
            if rep and between:
                between()
            if tick:
                tick(f"block forwards: pass {rep + 1}/{settings.repeats + 1} over "
                     f"{len(jobs)} shapes")
    points = []
    for (family, hidden, batch, seq), times in zip(settings.forward_grid, samples):
        stats = summarize(times)
        points.append(forward_point(hidden, batch, seq, stats, dtype_bytes=dtype_bytes(dtype),
                                    family=family, split=settings.device == "cpu"))
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
    steps["numels"] = [s.numel for s in specs]
    return steps, n


def zo_costs(settings: Settings, *, device, sync=None, dtype=None) -> dict:
    """The update task of zoexec's engine (z for the deferred update, apply_update, z
    for the new perturbation, perturb_into) and each part alone; ns per block parameter.
    On the CPU also z draws of smaller blocks (-> the z model: a fixed cost per draw
    and a cost per element of the busiest thread)."""
    import torch
    from zoexec.threads import z_makespan

    steps, n = zo_steps(settings.zo_hidden, device=device, dtype=dtype)
    numels = steps.pop("numels")
    out = {"block_params": n, "hidden": settings.zo_hidden}
    for name, fn in steps.items():
        out[name] = summarize(time_samples(fn, repeats=settings.repeats, sync=sync))
    out["ns_per_param"] = out["task"]["median_s"] / n * 1e9
    if settings.device == "cpu":
        threads = torch.get_num_threads()
        kick = torch.ones(1 << 20)
        draws = []
        for hidden in settings.z_hiddens:
            # in a run a z draw follows a copy or a pass (torch's OpenMP threads still
            # spinning on the cores the z threads need): time it so, not cold
            fn, sizes = steps["z"], numels
            if hidden != settings.zo_hidden:
                small, _ = zo_steps(hidden, device=device, dtype=dtype)
                fn, sizes = small["z"], small["numels"]
            stats = summarize(time_samples(fn, repeats=settings.repeats,
                                           before=lambda: kick.mul_(1.0)))
            busiest, chunks = z_makespan(sizes, threads)
            draws.append({"hidden": hidden, "threads": threads, "busiest_elems": busiest,
                          "busiest_chunks": chunks, **stats})
        out["z_draws"] = draws
        out["z_chunk"] = z_chunk_cost(repeats=settings.repeats)
        out["pass_ns"] = (out["update"]["median_s"] + out["perturb"]["median_s"]) / 2 / n * 1e9
    return out


def z_chunk_cost(*, repeats: int, tensors: int = 256) -> dict:
    """The fixed cost of one z chunk (seeding a generator, slicing, the call): a z draw
    over `tensors` tiny tensors on one thread, per tensor."""
    import torch
    from zoexec.zo import z_block

    specs = [(16 * i, 16) for i in range(tensors)]
    out = torch.empty(16 * tensors)
    stats = summarize(time_samples(lambda: z_block(3, 0, specs, out=out, num_threads=1),
                                   repeats=repeats, warmup=2))
    return {"tensors": tensors, **stats, "us_per_chunk": stats["median_s"] / tensors * 1e6}


def fit_z(draws: list[dict], *, chunk_us: float = 0.0) -> dict:
    """z_call_us and z_ns_per_elem from z draws of several blocks, less the busiest
    thread's chunks x chunk_us: time = call + elements x ns (non-negative least
    squares, relative error)."""
    ts = [d["median_s"] - d.get("busiest_chunks", 0) * chunk_us * 1e-6 for d in draws]
    if min(ts) <= 0:
        ts = [d["median_s"] for d in draws]
        chunk_us = 0.0
    coef = _wls_nonneg([[1.0] * len(draws), [float(d["busiest_elems"]) for d in draws]], ts)
    if coef is None:
        raise ZoError("the z fit failed: z draws do not grow with the block size")
    return {"z_call_us": coef[0] * 1e6, "z_ns_per_elem": coef[1] * 1e9, "z_chunk_us": chunk_us}


# ---- speed check: is this machine as fast now as when it was profiled? -----------------------
# Reference work of the speed check: a GEMM-bound and a memory-bound block forward (a
# shared machine's memory-bound work drifts far more than its GEMMs) and a z draw.
SPEED_CHECKS = {"gemm": {"hidden": 512, "batch": 4, "seq": 128},
                "memory": {"hidden": 128, "batch": 8, "seq": 512},
                "z": {"hidden": 256}}


class SpeedProbe:
    """The speed check's work (SPEED_CHECKS), built once and timed on demand: a
    GEMM-bound and a memory-bound block forward and a z draw, with this process's
    threads. `check` is the speed check (medians of `repeats` samples, under a second):
    `zoplan profile` stores one in the profile, `zoexec run --trace` takes one before
    and after its steps (rank 0 alone, all cores). `sample` is one sample of each,
    cheap enough (about 0.1 s) to take every few seconds through a profile or a run,
    so that the machine's speed is known over their whole length and not only at one
    moment. `zoplan calibrate` compares them, to tell a machine that got slower from a
    wrong prediction."""

    def __init__(self) -> None:
        import torch

        self.jobs: dict[str, Callable[[], Any]] = {}
        for name, shape in SPEED_CHECKS.items():
            if name == "z":
                steps, _ = zo_steps(shape["hidden"], device="cpu")
                self.jobs[name] = steps["z"]
                continue
            parts = build_block(shape["hidden"], shape["seq"], dtype="fp32", device="cpu")
            with torch.inference_mode():
                hidden, ctx = parts.embed(torch.randint(0, 64, (shape["batch"], shape["seq"])))
            self.jobs[name] = partial(self._forward, parts, hidden, ctx)

    @staticmethod
    def _forward(parts, hidden, ctx) -> None:
        import torch

        with torch.inference_mode():
            parts.block_forward(hidden, ctx)

    def check(self, *, repeats: int = 5) -> dict:
        import torch

        out: dict = {"threads": torch.get_num_threads()}
        for name, job in self.jobs.items():
            stats = summarize(time_samples(job, repeats=repeats, warmup=2 if name == "z" else 1))
            out[name] = {**SPEED_CHECKS[name], "median_s": stats["median_s"]}
        return out

    def sample(self) -> dict:
        """{"gemm": s, "memory": s, "z": s}: one timed call of each after an untimed one."""
        return {name: time_samples(job, repeats=1, warmup=1)[0] for name, job in self.jobs.items()}


def merge_probes(check: dict, probes: list[dict]) -> dict:
    """A speed check whose medians also count one-sample probes taken around it (each
    probe one value per kind, the check's median one more)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in check.items()}
    for name in SPEED_CHECKS:
        values = [check[name]["median_s"]] + [p[name] for p in probes if name in p]
        out[name]["median_s"] = statistics.median(values)
    out["probes"] = len(probes)
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

    keep_freed_memory()   # as zoexec's CPU ranks do
    torch.set_num_threads(threads_per_rank(settings.cores, 1))
    m: dict = {"threads_alone": torch.get_num_threads()}
    m["copy_alone"] = [cpu_copy(size, repeats=settings.repeats, store_bytes=settings.store_bytes)
                       for size in settings.copy_sweep]
    tick(f"copy, one rank: {m['copy_alone'][-1]['h2d_gbps']:.1f} GB/s")
    probe, probes = SpeedProbe(), []
    m["forward_alone"] = forward_grid(settings, dtype="fp32", device="cpu", tick=tick,
                                      between=lambda: probes.append(probe.sample()))
    m["zo_alone"] = zo_costs(settings, device="cpu")
    tick(f"zo update task: {m['zo_alone']['ns_per_param']:.2f} ns/param")
    m["speed_check"] = merge_probes(probe.check(), probes)
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

    keep_freed_memory()   # as zoexec's CPU ranks do
    threads = threads_per_rank(settings.cores, settings.ranks)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=settings.ranks)
    guard = Guard(os.getppid(), retries=settings.retries)
    sample = partial(rank_samples, dist=dist, guard=guard)
    try:
        with torch.no_grad():   # not inference_mode: the z threads would not inherit it
            out = {"rank": rank, "threads": threads}
            out.update(_rank_copies(settings, sample))
            after_last = partial(collective_samples, dist=dist)
            out["allgather"] = allgather_sweep(settings, dist, device="cpu", sample=after_last)
            out["allreduce"] = allreduce_small(dist, device="cpu", sample=after_last)
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
    """The update task with all ranks at once, and paired samples of a block forward
    and a z draw: all ranks at once (cores // ranks threads each), then rank 0 alone
    with all cores while the others wait, in turn, so a machine whose speed drifts
    between minutes slows both sides of each pair alike (-> the rank scalings)."""
    import torch
    from zoexec.threads import z_makespan

    family, hidden, batch, seq = settings.reference_shape
    dist.barrier()
    parts = build_block(hidden, seq, dtype="fp32", device="cpu", family=family)
    ids = torch.randint(0, 64, (batch, seq))
    hid, ctx = parts.embed(ids)
    steps, n = zo_steps(settings.zo_hidden, device="cpu")
    numels = steps.pop("numels")
    task = summarize(sample(steps["task"], repeats=settings.repeats))
    threads = torch.get_num_threads()
    fwd = _paired(lambda: parts.block_forward(hid, ctx), dist, settings, threads)
    mem = SPEED_CHECKS["memory"]   # a memory-bound forward: attention, element-wise work
    small = build_block(mem["hidden"], mem["seq"], dtype="fp32", device="cpu")
    m_hid, m_ctx = small.embed(torch.randint(0, 64, (mem["batch"], mem["seq"])))
    fwd_mem = _paired(lambda: small.block_forward(m_hid, m_ctx), dist, settings, threads)
    z = _paired(steps["z"], dist, settings, threads)
    return {"forward": {"family": family, "hidden": hidden, "batch": batch, "seq": seq,
                        **fwd},
            "forward_memory": {"family": "opt", **mem, **fwd_mem},
            "zo": {"ns_per_param": task["median_s"] / n * 1e9, "task": task},
            "z": {"hidden": settings.zo_hidden, **z, "threads_together": threads,
                  "threads_alone": settings.cores,
                  "busiest_together": z_makespan(numels, threads)[0],
                  "busiest_alone": z_makespan(numels, settings.cores)[0]}}


# Pairs of _paired, at least: the rank scalings are medians of per-pair ratios, and the
# machine's speed can change between the two halves of a pair. With the 3 pairs of a
# --quick profile, one such change set mem_rank_scaling to 1.68 where full profiles of
# the same hour measured 0.97-1.06 (2 ranks on 2 cores).
PAIRS_MIN = 7


def _paired(fn: Callable[[], Any], dist, settings: Settings, threads: int) -> dict:
    """Samples of `fn` on all ranks at once and on rank 0 alone with all cores, in
    turn (one warm-up pair, then max(repeats, PAIRS_MIN) pairs); rank 0's samples count
    (every rank runs the same work)."""
    import torch

    together, alone = [], []
    rank = dist.get_rank()
    for index in range(max(settings.repeats, PAIRS_MIN) + 1):
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
    out = {"together": summarize(together)}
    if alone:
        out["alone"] = summarize(alone)
        out["ratios"] = [t / a for t, a in zip(together, alone)]
    return out


def _barrier_sampler(dist, sync=None):
    """Samples after a barrier (NCCL ranks: GPU timings, no CPU guard)."""
    return partial(time_samples, before=dist.barrier, sync=sync)


STAGGER_S = 0.002   # how late the last rank enters a timed collective (collective_samples)


def collective_samples(fn: Callable[[], Any], *, dist, repeats: int,
                       warmup: int = 1) -> list[float]:
    """Durations of a collective `fn` of ranks on one host, each from the moment the last
    rank entered it to this rank's return: what `zoplan calibrate` counts as a run's
    collective (the time a rank spends there before the last one arrives is waiting).
    As in a run, the ranks do not arrive together: after a barrier, one rank (each in
    turn) enters STAGGER_S after the others, which are then blocked in the collective.
    Ranks on one host share the monotonic clock of time.perf_counter (Linux:
    CLOCK_MONOTONIC)."""
    import torch

    latest = torch.zeros(1, dtype=torch.float64)
    rank, world = dist.get_rank(), dist.get_world_size()
    out: list[float] = []
    for index in range(warmup + repeats):
        dist.barrier()
        if index % world == rank:
            time.sleep(STAGGER_S)
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        latest.fill_(start)
        dist.all_reduce(latest, op=dist.ReduceOp.MAX)
        if index >= warmup:
            out.append(max(end - latest.item(), 1e-7))
    return out


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
    zfit = fit_z(m["zo_alone"]["z_draws"], chunk_us=m["zo_alone"]["z_chunk"]["us_per_chunk"])
    scaling = paired_rank_scaling(ranks, overhead_s=fit["overhead_us"] * 1e-6) \
        if ranks else 1.0
    mem_scaling = paired_mem_scaling(ranks, fit=fit, gemm_scaling=scaling) if ranks else 1.0
    z_scaling = paired_z_scaling(ranks, call_s=zfit["z_call_us"] * 1e-6) if ranks else 1.0
    zo_scaling = k * m["zo_alone"]["ns_per_param"] / together["zo_ns_per_param"] \
        if together else 1.0
    coll = together["collective"] if together else _single_rank_collective()
    sources = _cpu_sources(settings, threads=threads, fit=fit, date=date,
                           num_forwards=len(m["forward_alone"]))
    if not together:
        for key in ("collective.latency_us", "collective.allreduce_small_us",
                    "collective.allgather_busbw", "fabric.p2p_gbps", "host.mem_bw_gbps",
                    "compute.rank_scaling", "compute.zo_rank_scaling", "compute.z_rank_scaling",
                    "compute.mem_rank_scaling"):
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
        "compute": {**fit_figures(fit), "mem_gbps": _r(fit["mem_gbps"]),
                    "zo_ns_per_param": _r(m["zo_alone"]["ns_per_param"]),
                    "rank_scaling": _r(scaling), "zo_rank_scaling": _r(zo_scaling),
                    "z_call_us": round(zfit["z_call_us"], 2),
                    "z_chunk_us": round(zfit["z_chunk_us"], 3),
                    "z_ns_per_elem": _r(zfit["z_ns_per_elem"]),
                    "zo_pass_ns": _r(m["zo_alone"]["pass_ns"]),
                    "z_rank_scaling": _r(z_scaling), "mem_rank_scaling": _r(mem_scaling),
                    **({"rank_jitter": round(rank_jitter(ranks), 4)} if ranks else {})},
        "sources": sources,
        "measurements": {**m, "fit": fit, "z_fit": zfit, "together": together},
        "speed_check": m["speed_check"],
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
                                 f"over {k} ranks (median, from the last rank's arrival)",
        "collective.allreduce_small_us": f"{c}gloo all-reduce of two float64 over {k} ranks "
                                         "(median, from the last rank's arrival)",
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
        "compute.rank_scaling": f"{c}forward of an {settings.reference_shape[0]} block "
                                f"h={settings.reference_shape[1]}: {k} ranks at once (cores // ranks "
                                "threads each) and rank 0 alone (all cores) in turn, median of the pairs",
        "compute.attn_tflops": f"{c}same fit (attention FLOPs apart from the GEMMs)",
        "compute.elem_ns": f"{c}same fit (element-wise operator outputs, zoplan.models)",
        "compute.rope_overhead_us": f"{c}same fit (a Llama-family block's dispatch beyond an "
                                    f"OPT block's: its norms, gated MLP and rotary embedding "
                                    f"are more operators)",
        "compute.z_ns_per_elem": f"{c}z draws (zoexec.zo.z_block) of OPT blocks h={'/'.join(map(str, settings.z_hiddens))}, "
                                 f"{threads} threads: per element of the busiest thread",
        "compute.z_call_us": f"{c}same fit (handing the chunks to the thread pool)",
        "compute.z_chunk_us": f"{c}z draw over 256 tiny tensors on one thread, per chunk",
        "compute.zo_pass_ns": f"{c}apply_update and perturb_into over an OPT block of hidden "
                              f"{settings.zo_hidden}, {threads} threads: per element and pass",
        "compute.z_rank_scaling": f"{c}z draws, {k} ranks at once and rank 0 alone in turn: "
                                  "per-element speed of the busiest thread, together / alone",
        "compute.rank_jitter": f"{c}{k} ranks running the same forward or z draw at once: "
                               "(slowest - mean) / mean per sample, median",
        "compute.mem_rank_scaling": f"{c}a memory-bound OPT block forward (h={SPEED_CHECKS['memory']['hidden']}, "
                                    f"{SPEED_CHECKS['memory']['batch']}x{SPEED_CHECKS['memory']['seq']} tokens), "
                                    f"{k} ranks at once and rank 0 alone in turn: the rank scaling "
                                    "of its attention and element-wise parts",
        "compute.zo_rank_scaling": f"{c}update task on 1 rank vs {k} ranks at once",
    }


def _r(x: float) -> float:
    """Four significant digits (keeps profiles readable, never rounds to zero)."""
    return float(f"{x:.4g}")


def _cpu_together(ranks: dict, settings: Settings) -> dict:
    """Figures of the k ranks that ran at once: copy sum, forward and zo medians,
    collectives (rank 0's view)."""
    per = ranks["per_rank"]
    copy = sum(gbps(r["copy_bytes"], r["h2d"]["median_s"]) for r in per)
    return {"copy_gbps": copy,
            "forward_s": statistics.median(r["forward"]["together"]["median_s"] for r in per),
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
        "compute": {**fit_figures(fit), "mem_gbps": _r(fit["mem_gbps"]),
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

    if ranks is not None and ranks < 1:
        raise ZoError(f"--ranks must be >= 1, got {ranks}")
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
    _refit_rounds(data, datas)
    if all("speed_check" in d for d in datas):
        for name in SPEED_CHECKS:
            data["speed_check"][name]["median_s"] = statistics.median(
                d["speed_check"][name]["median_s"] for d in datas)
        data["speed_check"]["probes"] = sum(d["speed_check"].get("probes", 0) for d in datas)
    for key, note in data["sources"].items():
        if note.startswith("[M]"):
            data["sources"][key] = f"{note} (median of {len(datas)} rounds)"
    data["measurements"] = {"rounds": [d["measurements"] for d in datas],
                            "per_round": [{s: d[s] for s in ("pcie", "host", "collective",
                                                             "compute")} for d in datas],
                            "fit": data.pop("measurements_fit")}
    return data


def _refit_rounds(data: dict, datas: list[dict]) -> None:
    """The compute fit's figures belong together: fit once on each shape's median
    time over the rounds (not a median of each fitted figure); the same for z."""
    grids = [d["measurements"]["forward_alone"] for d in datas]
    points = [dict(p, median_s=statistics.median(g[i]["median_s"] for g in grids))
              for i, p in enumerate(grids[0])]
    fit = fit_compute(points, mem_gbps=data["compute"]["mem_gbps"])
    data["compute"].update(fit_figures(fit))
    data["measurements_fit"] = fit
    draws = [d["measurements"].get("zo_alone", {}).get("z_draws") for d in datas]
    if all(draws):   # the z model's figures belong together too
        chunk = statistics.median(d["measurements"]["zo_alone"]["z_chunk"]["us_per_chunk"]
                                  for d in datas)
        zfit = fit_z([dict(p, median_s=statistics.median(g[i]["median_s"] for g in draws))
                      for i, p in enumerate(draws[0])], chunk_us=chunk)
        data["compute"].update(z_call_us=round(zfit["z_call_us"], 2),
                               z_ns_per_elem=_r(zfit["z_ns_per_elem"]),
                               z_chunk_us=round(zfit["z_chunk_us"], 3))


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
              "rank_scaling", "zo_rank_scaling", "attn_tflops", "elem_ns", "rope_overhead_us",
              "z_ns_per_elem",
              "z_call_us", "z_chunk_us", "zo_pass_ns", "z_rank_scaling", "mem_rank_scaling",
              "rank_jitter")
             if k in profile.compute]
    for key, value in rows:
        how = re.sub(r"^\[M\] zoplan profile \S+ ", "", profile.sources.get(key, ""))
        table.add_row(key, f"{value:g}", how)
    busbw = ", ".join(f"{int(b) // KIB} KiB: {bw:g}" for b, bw in profile.collective["allgather_busbw"])
    console.print(table)
    console.print(f"all-gather bus bandwidth (GB/s): {busbw}", highlight=False)
    console.print(f"wrote {path}", highlight=False)
