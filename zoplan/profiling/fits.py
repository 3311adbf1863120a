"""The fits of a profile: from measured samples (plain numbers, no torch) to figures.

- the compute fit: block forward times over a grid of shapes -> dispatch overhead, GEMM
  peak with a small-GEMM efficiency term, attention rate, element-wise cost, and a
  Llama-family block's extra dispatch (zoplan.pricing.compute.cpu_forward_terms is the model);
- the z fit: z draws of several blocks -> a fixed cost per draw and per chunk and a
  cost per element of the busiest thread;
- the GPU fits: forwards per GEMM precision -> a rate each, one efficiency term and a
  launch cost, a forward taking the longer of its launches and its device work
  (zoplan.pricing.compute.gpu_forward_terms, gpu_forward_alone_s); z draws -> a cost
  per launch and per element; the zo passes -> the HBM bandwidth;
- rank scalings: how k ranks on one host share its cores, from paired samples of all
  ranks at once and rank 0 alone;
- collectives: latency, small all-reduce and the all-gather bus bandwidth table;
- topology: GPUs that share a PCIe uplink, NVLink groups.
Every function takes the samples `zoexec.profiler` returns (see its docstring for their
shape), so each can be tested with synthetic samples.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from zoplan.errors import ZoError
from zoplan.models import one_block_config, spec_from_hf_config
from zoplan.pricing.compute import (
    CAUSAL_ATTN_SHARE,
    cpu_forward_terms,
    gpu_block_bytes,
    gpu_elems_per_token,
    gpu_forward_alone_s,
    gpu_forward_terms,
)
from zoplan.pricing.zo import zo_pass_bytes  # the one formula of a pass's bytes

# a timed GPU forward and its (attention, element-wise) HBM bytes: gpu_point_bytes
_Point = tuple[dict[str, Any], float, float]
SHARE_THRESHOLD = 0.75        # two GPUs share an uplink when each gets < 75% of alone


def round4(x: float) -> float:
    """Four significant digits (keeps profiles readable, never rounds to zero)."""
    return float(f"{x:.4g}")


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
                required: int | tuple[int, ...] = 1,
                weights: list[float] | None = None) -> list[float] | None:
    """Coefficients c >= 0 minimising sum(((sum_j c_j x_j - t) / t)^2): every subset
    of the columns is solved unconstrained and the best one with all coefficients > 0
    kept (a handful of columns: an exact non-negative least squares). Column(s)
    `required` must take part (the GEMM term: a forward always does GEMMs). `weights`
    replace 1 / t^2 (a fit of t - known part keeps the relative error of t)."""
    k = len(columns)
    need = {required} if isinstance(required, int) else set(required)
    w = weights or [1.0 / (t * t) for t in ts]
    best, best_err = None, math.inf
    for size in range(1, k + 1):
        for subset in itertools.combinations(range(k), size):
            if not need <= set(subset):
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


def fit_compute(points: list[dict[str, Any]], *, mem_gbps: float) -> dict[str, Any]:
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


# The rate a fit gives work it found no cost for (attention on a CPU whose timings the
# GEMMs explain): free for planning, and inside the plausible range zoplan/hwcheck.py
# holds every TFLOP/s figure to, so the measured profile is not refused as broken.
FREE_TFLOPS = 1e4


def _fit_at(points: list[dict[str, Any]], m_half: float, mem_gbps: float) -> dict[str, Any] | None:
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
    coef: list[float] | None = None
    for _ in range(4):  # leave out the points whose memory term wins, refit
        cols = [[1.0] * len(keep), [gemm[i] for i in keep]] + [[c[i] for i in keep] for c in extra]
        coef = _wls_nonneg(cols, [ts[i] for i in keep])
        if coef is None:
            return None
        nxt = [i for i in range(len(points)) if coef[1] * gemm[i] >= mem[i]]
        if nxt == keep or len(nxt) < 2 + len(extra):
            break
        keep = nxt
    assert coef is not None   # the loop ran, and returned on a failed fit
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
    if "attn" in terms:   # a (near) zero coefficient: the fit found no cost of its own
        out["attn_tflops"] = min(1.0 / terms["attn"] / 1e12, FREE_TFLOPS) \
            if terms["attn"] > 0 else FREE_TFLOPS
    if "elems" in terms:
        out["elem_ns"] = terms["elems"] * 1e9
    if "rope" in terms:
        out["rope_overhead_us"] = terms["rope"] * 1e6
    return out


def fit_z(draws: list[dict[str, Any]], *, chunk_us: float = 0.0) -> dict[str, Any]:
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


# ---- the GPU fits ------------------------------------------------------------------------
GPU_RATES = {"bf16": "peak_tflops", "tf32": "tf32_tflops", "fp32": "fp32_tflops"}
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}


def gpu_point_bytes(point: dict[str, Any]) -> tuple[float, float]:
    """(attention, element-wise) HBM bytes of a timed GPU forward (its block:
    zoplan.models.one_block_config; zoplan.pricing.compute.gpu_block_bytes, the
    element-wise outputs a GPU writes: gpu_elems_per_token)."""
    spec = spec_from_hf_config(one_block_config(point["hidden"], point["seq"],
                                                point.get("family", "opt")), name="block")
    return gpu_block_bytes(attn_dim=spec.attn_dim, kv_dim=spec.kv_dim,
                           elems_per_token=gpu_elems_per_token(spec),
                           tokens=point["tokens"],
                           dtype_bytes=PRECISION_BYTES[point["precision"]])


def fit_gpu_compute(points: list[dict[str, Any]], *, hbm_gbps: float) -> dict[str, Any]:
    """Least-squares fit (relative error) of the GPU forward model to forwards timed in
    bf16, fp32 with TF32 ("tf32") and fp32 ("fp32"): t = max(launches, device work)
    (zoplan.pricing.compute.gpu_forward_alone_s of gpu_forward_terms): one GEMM rate
    per precision, one efficiency term m / (m + m_half_tokens) and one launch cost
    (overhead_us) for all; attention and element-wise bytes at the measured HBM
    bandwidth are known, not fitted. m_half is searched on a log grid; for each, the k
    fastest forwards are taken as bound by the launches (k = 0, 1, ...: overhead_us is
    their weighted mean) and the others by the device (the rates: a non-negative
    weighted least-squares problem, refitted while points change sides of their
    rooflines), and the split whose whole model fits every point best is kept."""
    missing = sorted(set(GPU_RATES) - {p.get("precision") for p in points})
    if missing:
        raise ZoError(f"the GPU compute fit needs forwards in {', '.join(GPU_RATES)}; "
                      f"none in {', '.join(missing)}")
    work = [(p, *gpu_point_bytes(p)) for p in points]
    best = None
    for m_half in [0.0] + [2 ** (k / 4) for k in range(0, 61)]:
        fit = _gpu_fit_at(work, m_half, hbm_gbps)
        if fit and (best is None or fit["rel_rms_pct"] < best["rel_rms_pct"]):
            best = fit
    if best is None:
        raise ZoError("the GPU compute fit failed: forward times do not grow with FLOPs")
    return best


def _gpu_fit_at(work: list[_Point], m_half: float, hbm_gbps: float) -> dict[str, Any] | None:
    """The best split of the points into launch-bound and device-bound at this m_half."""
    ts = [p["median_s"] for p, _, _ in work]
    order = sorted(range(len(work)), key=lambda i: ts[i])
    best = None
    for k in range(len(work)):
        host, device = order[:k], order[k:]
        if {work[i][0]["precision"] for i in device} != set(GPU_RATES):
            continue    # a rate no device-bound point measures
        o = sum(1 / ts[i] for i in host) / sum(1 / ts[i] ** 2 for i in host) if host else 0.0
        rate = _gpu_rates(work, device, m_half, hbm_gbps)
        if rate is None:
            continue
        fit = _gpu_fit_figures(work, o, rate, m_half, hbm_gbps)
        if best is None or fit["rel_rms_pct"] < best["rel_rms_pct"]:
            best = {**fit, "launch_bound": k}
    return best


def _gpu_device_s(point: _Point, inv_rate: float, m_half: float, hbm_gbps: float) -> float:
    """A forward's device seconds with 1 / rate `inv_rate` (s per FLOP)."""
    p, attn_bytes, elem_bytes = point
    return sum(gpu_forward_terms({"m_half_tokens": m_half, "overhead_us": 0.0},
                                 rate_tflops=1.0 / inv_rate / 1e12, hbm_gbps=hbm_gbps,
                                 flops=p["flops"], attn_flops=p["attn_flops"],
                                 attn_bytes=attn_bytes, elem_bytes=elem_bytes,
                                 weight_bytes=p["weight_bytes"], tokens=p["tokens"]))


def _gpu_rates(work: list[_Point], device: list[int], m_half: float,
               hbm_gbps: float) -> dict[str, float] | None:
    """1 / rate per precision (s per FLOP) fitted to the device-bound points, refitted
    while points change sides of their rooflines (weights or attention memory-bound)."""
    hbm = hbm_gbps * 1e9
    precisions = list(GPU_RATES)
    ts = [p["median_s"] for p, _, _ in work]
    scale = [(p["tokens"] + m_half) / p["tokens"] for p, _, _ in work]
    attn_compute = [True] * len(work)     # attention above its bytes' time
    keep = list(device)                   # points whose GEMMs are above the weights' time
    rate = None
    for _ in range(6):
        cols = [[(work[i][0]["flops"] + CAUSAL_ATTN_SHARE * work[i][0]["attn_flops"]
                  * attn_compute[i]) * scale[i] * (work[i][0]["precision"] == d)
                 for i in keep] for d in precisions]
        known = [work[i][2] / hbm + (0.0 if attn_compute[i] else work[i][1] / hbm) for i in keep]
        coef = _wls_nonneg(cols, [ts[i] - k for i, k in zip(keep, known)],
                           required=tuple(range(len(cols))),
                           weights=[1.0 / ts[i] ** 2 for i in keep])
        if coef is None:
            return None
        rate = dict(zip(precisions, coef))
        inv = [rate[p["precision"]] * s for (p, _, _), s in zip(work, scale)]
        attn_next = [a * CAUSAL_ATTN_SHARE * p["attn_flops"] >= ab / hbm
                     for (p, ab, _), a in zip(work, inv)]
        keep_next = [i for i in device if inv[i] * work[i][0]["flops"] >= work[i][0]["weight_bytes"] / hbm]
        if (keep_next == keep and attn_next == attn_compute) or len(keep_next) < len(cols):
            break
        keep, attn_compute = keep_next, attn_next
    return rate


def _gpu_fit_figures(work: list[_Point], o: float, rate: dict[str, float], m_half: float,
                     hbm_gbps: float) -> dict[str, Any]:
    """The fit's figures and its residuals over every point, t = max(launches, device)."""
    model = [gpu_forward_alone_s(o, _gpu_device_s(w, rate[w[0]["precision"]], m_half, hbm_gbps))
             for w in work]
    resid = [100.0 * (m - p["median_s"]) / p["median_s"] for m, (p, _, _) in zip(model, work)]
    out: dict[str, Any] = {GPU_RATES[d]: 1.0 / inv / 1e12 for d, inv in rate.items()}
    out.update({"overhead_us": o * 1e6, "m_half_tokens": m_half, "hbm_gbps": hbm_gbps,
                "rel_rms_pct": math.sqrt(sum(r * r for r in resid) / len(resid)),
                "residuals_pct": [round(r, 2) for r in resid]})
    return out


def fit_gpu_z(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """z_launch_us and z_ns_per_elem from GPU z draws of blocks of few large and many
    small tensors: time = launches x z_launch_us + elements x z_ns_per_elem
    (non-negative least squares, relative error)."""
    coef = _wls_nonneg([[float(d["launches"]) for d in draws],
                        [float(d["elems"]) for d in draws]],
                       [d["median_s"] for d in draws], required=())
    if coef is None or not any(coef):
        raise ZoError("the GPU z fit failed: z draws do not grow with launches or elements")
    return {"z_launch_us": coef[0] * 1e6, "z_ns_per_elem": coef[1] * 1e9}


def hbm_from_passes(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """device.hbm_gbps from the timed zo passes (apply_update, perturb_into) with a
    16-bit and an fp32 store: each pass's bytes (zoplan.pricing.zo.zo_pass_bytes) over its
    time; the median of the passes. Returns the figure and each pass's rate."""
    rates = []
    for entry in passes:
        upd, pert = zo_pass_bytes(param_bytes=PRECISION_BYTES[entry["param_dtype"]],
                                  compute_bytes=PRECISION_BYTES[entry["compute_dtype"]])
        for name, per in (("update", upd), ("perturb", pert)):
            rates.append({"param_dtype": entry["param_dtype"], "pass": name,
                          "gbps": gbps(per * entry["elems"], entry[name]["median_s"])})
    if not rates:
        raise ZoError("no zo passes were timed: device.hbm_gbps cannot be measured")
    return {"hbm_gbps": statistics.median(r["gbps"] for r in rates), "passes": rates}


def fit_figures(fit: dict[str, Any]) -> dict[str, Any]:
    """The compute section's figures of a forward fit (CPU or GPU)."""
    out = {"peak_tflops": round4(fit["peak_tflops"]), "m_half_tokens": round(fit["m_half_tokens"], 2),
           "overhead_us": round(fit["overhead_us"], 2)}
    for key in ("tf32_tflops", "fp32_tflops"):
        if key in fit:
            out[key] = round4(fit[key])
    if "attn_tflops" in fit:
        out["attn_tflops"] = round4(fit["attn_tflops"])
    if "elem_ns" in fit:
        out["elem_ns"] = round4(fit["elem_ns"])
    if "rope_overhead_us" in fit:
        out["rope_overhead_us"] = round(fit["rope_overhead_us"], 2)
    return out


# ---- rank scalings ------------------------------------------------------------------------
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


def paired_rank_scaling(measured: dict[str, Any], *, overhead_s: float) -> float:
    """compute.rank_scaling from rank 0's paired forward samples (_paired): the median
    over pairs of rank_scaling(alone, together)."""
    k = len(measured["per_rank"])
    fwd = measured["per_rank"][0]["forward"]
    pairs = zip(fwd["alone"]["samples_s"], fwd["together"]["samples_s"])
    return statistics.median(rank_scaling(alone_s=a, together_s=t, ranks=k, overhead_s=overhead_s)
                             for a, t in pairs)


def paired_mem_scaling(measured: dict[str, Any], *, fit: dict[str, Any], gemm_scaling: float) -> float:
    """compute.mem_rank_scaling from rank 0's paired memory-bound forwards: the fit
    splits the shape's time alone into dispatch, GEMM and attention + element-wise
    parts; with the GEMMs shared by `gemm_scaling`, the scaling of the rest that
    explains the time with all ranks at once (median over pairs). The samples carry
    the shape's work (flops, attn_flops, elems, tokens)."""
    k = len(measured["per_rank"])
    fwd = measured["per_rank"][0]["forward_memory"]
    over, gemm, rest = cpu_forward_terms({"attn_tflops": FREE_TFLOPS, **fit}, flops=fwd["flops"],
                                     attn_flops=fwd["attn_flops"], elems=fwd["elems"],
                                     tokens=fwd["tokens"])
    out = []
    for alone, together in zip(fwd["alone"]["samples_s"], fwd["together"]["samples_s"]):
        scale = (alone - over) / (gemm + rest) if gemm + rest > 0 else 1.0  # the pair's speed
        left = together - over - gemm * scale * k / gemm_scaling
        out.append(k * rest * scale / left if left > 0 and rest > 0 else float(k))
    return max(0.05, min(float(k), statistics.median(out)))


def rank_jitter(measured: dict[str, Any]) -> float:
    """compute.rank_jitter: how far the slowest rank runs above the ranks' mean when all
    run the same work at once: (max - mean) / mean of each together sample of the
    paired forwards and z draws, median over samples."""
    per = measured["per_rank"]
    out: list[float] = []
    for key in ("forward", "forward_memory", "z"):
        if not all(key in r for r in per):
            continue
        for times in zip(*(r[key]["together"]["samples_s"] for r in per)):
            mean = statistics.fmean(times)
            if mean > 0:
                out.append((max(times) - mean) / mean)
    return statistics.median(out) if out else 0.0


def paired_z_scaling(measured: dict[str, Any], *, call_s: float) -> float:
    """compute.z_rank_scaling from rank 0's paired z draws: per-element speed of the
    busiest thread with all ranks at once over that of one rank alone (median over
    pairs; 1 = threads of several ranks draw as fast as one rank's threads)."""
    z = measured["per_rank"][0]["z"]
    call_alone = call_s if z["threads_alone"] > 1 else 0.0       # the pool's hand-over
    call_together = call_s if z["threads_together"] > 1 else 0.0
    out: list[float] = []
    for alone, together in zip(z["alone"]["samples_s"], z["together"]["samples_s"]):
        per_alone = max(alone - call_alone, 1e-9) / z["busiest_alone"]
        per_together = max(together - call_together, 1e-9) / z["busiest_together"]
        out.append(per_alone / per_together)
    return max(0.05, min(4.0, statistics.median(out)))


# ---- collectives and topology ------------------------------------------------------------
def collective_figures(gathers: list[dict[str, Any]], allreduce: dict[str, Any], world: int) -> dict[str, Any]:
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


def share_groups(n: int, alone: list[float],
                 pairs: dict[tuple[int, ...], float]) -> list[list[int]]:
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


def fabric_from_topology(n: int, matrix: list[list[str]] | None) -> dict[str, Any]:
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
