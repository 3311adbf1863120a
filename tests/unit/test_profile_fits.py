"""zoplan.profiling: the fits and the assembly of a profile, from synthetic samples
(no torch: the measuring side is zoexec.profiler, tested in test_profiler.py and in the
end-to-end loop)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zoplan.errors import ZoError
from zoplan.hardware import GIB, HardwareProfile, load_profile, shipped_profiles
from zoplan.hwcheck import _number
from zoplan.io import load_json
from zoplan.models import block_forward_work
from zoplan.pricing.compute import (
    cpu_forward_terms,
    forward_time_s,
    gpu_forward_alone_s,
    gpu_forward_terms,
)
from zoplan.pricing.zo import zo_time_s
from zoplan.profiling.build import build_profile, combine_rounds
from zoplan.profiling.fits import (
    FREE_TFLOPS,
    GPU_RATES,
    collective_figures,
    fabric_from_topology,
    fit_compute,
    fit_figures,
    fit_gpu_compute,
    fit_gpu_z,
    fit_z,
    gpu_point_bytes,
    hbm_from_passes,
    paired_rank_scaling,
    paired_z_scaling,
    rank_scaling,
    share_groups,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# the block-forward grid of a full CPU profile (zoexec.profiler.settings.Settings)
_SHAPES = [(1, 32), (4, 64), (1, 256), (8, 128), (2, 512), (4, 512)]
_WIDE = {128: [(16, 512), (32, 256)], 256: [(16, 512)], 512: [(8, 512)], 1024: []}
CPU_GRID = ([("opt", h, b, s) for h in (128, 256, 512, 1024) for b, s in _SHAPES + _WIDE[h]]
            + [("llama", h, b, s) for h in (128, 512) for b, s in _SHAPES + _WIDE[h]])


def _points(peak_tflops, overhead_us, m_half):
    pts = []
    for flops, tokens in [(1e9, 32), (4e9, 128), (1.6e10, 512), (6e10, 2048), (2e9, 64)]:
        t = overhead_us * 1e-6 + flops * (tokens + m_half) / tokens / (peak_tflops * 1e12)
        pts.append({"flops": flops, "tokens": tokens, "weight_bytes": 1.0, "median_s": t})
    return pts


def test_compute_fit_recovers_the_model():
    fit = fit_compute(_points(0.2, 500, 64), mem_gbps=10)
    assert fit["peak_tflops"] == pytest.approx(0.2, rel=0.05)
    assert fit["overhead_us"] == pytest.approx(500, rel=0.1)
    assert 40 <= fit["m_half_tokens"] <= 100
    assert fit["rel_rms_pct"] < 2


def test_compute_fit_tells_gemm_attention_and_elementwise_apart():
    """CPU points carry attention FLOPs and element-wise outputs; the fit recovers the
    four figures of a synthetic machine from the same grid shapes a profile times."""
    truth = {"peak": 0.25e12, "attn": 0.08e12, "elem_ns": 0.6, "over": 300e-6, "m_half": 48.0}
    points = []
    for family, hidden, batch, seq in CPU_GRID:
        p = block_forward_work(hidden, batch, seq, dtype_bytes=4, family=family)
        p["median_s"] = (truth["over"] + p["flops"] * (p["tokens"] + truth["m_half"])
                         / p["tokens"] / truth["peak"] + p["attn_flops"] / truth["attn"]
                         + p["elems"] * truth["elem_ns"] * 1e-9)
        points.append(p)
    fit = fit_compute(points, mem_gbps=1e6)
    assert fit["peak_tflops"] == pytest.approx(0.25, rel=0.05)
    assert fit["attn_tflops"] == pytest.approx(0.08, rel=0.05)
    assert fit["elem_ns"] == pytest.approx(0.6, rel=0.1)
    assert fit["overhead_us"] == pytest.approx(300, rel=0.1)
    assert fit["rel_rms_pct"] < 1
    assert fit["rope_overhead_us"] == pytest.approx(0, abs=15)   # both families alike


def test_a_fit_that_finds_attention_free_gives_a_figure_the_profile_check_accepts():
    """On a quick CPU profile the GEMMs may explain every timing and attention's
    coefficient comes out 0: the fit names a rate that is free for planning and still
    inside the plausible range, so the measured profile is not refused (CI, stop 24)."""
    points = []
    for family, hidden, batch, seq in CPU_GRID:
        p = block_forward_work(hidden, batch, seq, dtype_bytes=4, family=family)
        p["median_s"] = 300e-6 + p["flops"] * (p["tokens"] + 48.0) / p["tokens"] / 0.25e12
        points.append(p)
    fit = fit_compute(points, mem_gbps=1e6)
    assert fit["attn_tflops"] == FREE_TFLOPS
    assert _number("fit", "compute.attn_tflops", fit_figures(fit)["attn_tflops"]) == FREE_TFLOPS
    work = dict(flops=1e9, attn_flops=1e9, elems=0.0, tokens=256)
    assert cpu_forward_terms(fit, **work)[2] < 1e-3 * cpu_forward_terms(fit, **work)[1]


def test_compute_fit_prices_a_llama_blocks_extra_dispatch():
    """A Llama block runs more operators than an OPT block (RMS norms, gated MLP,
    rotary embedding): the fit gives them their own dispatch cost, and the planner
    adds it to blocks of the Llama family only."""
    over, rope = 800e-6, 300e-6
    points = []
    for family, hidden, batch, seq in CPU_GRID:
        p = block_forward_work(hidden, batch, seq, dtype_bytes=4, family=family)
        p["median_s"] = (over + (rope if family != "opt" else 0.0)
                         + p["flops"] * (p["tokens"] + 48.0) / p["tokens"] / 0.25e12
                         + p["attn_flops"] / 0.08e12 + p["elems"] * 0.6e-9)
        points.append(p)
    fit = fit_compute(points, mem_gbps=1e6)
    assert fit["overhead_us"] == pytest.approx(800, rel=0.05)
    assert fit["rope_overhead_us"] == pytest.approx(300, rel=0.1)
    assert fit_figures(fit)["rope_overhead_us"] == pytest.approx(300, rel=0.1)
    work = dict(flops=1e9, attn_flops=0.0, elems=0.0, tokens=256)
    opt, llama = (cpu_forward_terms(fit, **work, family=f)[0] for f in ("opt", "llama"))
    assert llama - opt == pytest.approx(fit["rope_overhead_us"] * 1e-6)
    # one family alone: no such term (its dispatch is the overhead)
    only_opt = fit_compute([p for p in points if p["family"] == "opt"], mem_gbps=1e6)
    assert "rope_overhead_us" not in only_opt


def test_z_fit_and_paired_scalings():
    draws = [{"busiest_elems": n, "median_s": 400e-6 + n * 5e-9} for n in (99_000, 1_600_000)]
    z = fit_z(draws)
    assert z["z_call_us"] == pytest.approx(400, rel=0.01)
    assert z["z_ns_per_elem"] == pytest.approx(5, rel=0.01)
    # rank 0 alone (2 threads, pool) vs 2 ranks at once (1 thread each, no pool):
    # per-element speed together = 1.25 x alone
    alone = [400e-6 + 1_600_000 * 5e-9] * 3
    together = [3_200_000 * 4e-9] * 3
    measured = {"per_rank": [{"z": {"alone": {"samples_s": alone}, "threads_alone": 2,
                                    "together": {"samples_s": together}, "threads_together": 1,
                                    "busiest_alone": 1_600_000, "busiest_together": 3_200_000},
                              "forward": {"alone": {"samples_s": [0.110] * 3},
                                          "together": {"samples_s": [0.010 + 0.1 * 2 / 1.6] * 3}}},
                             {}]}
    assert paired_z_scaling(measured, call_s=400e-6) == pytest.approx(1.25)
    assert paired_rank_scaling(measured, overhead_s=0.010) == pytest.approx(1.6)


def test_compute_fit_needs_two_points():
    with pytest.raises(ZoError, match=">= 2"):
        fit_compute(_points(1, 1, 1)[:1], mem_gbps=1)


def test_rank_scaling_inverts_the_profile_model():
    # one rank: 100 ms = 10 ms overhead + 90 ms work; two ranks at once: 10 + 90 * 2 / 1.6
    together = 0.010 + 0.090 * 2 / 1.6
    assert rank_scaling(alone_s=0.1, together_s=together, ranks=2,
                             overhead_s=0.01) == pytest.approx(1.6)
    assert rank_scaling(alone_s=0.1, together_s=0.2, ranks=1, overhead_s=0) == 1.0


def test_collective_figures_subtract_the_latency():
    gathers = [{"bytes": 4096, "median_s": 100e-6},
               {"bytes": 2**20, "median_s": 100e-6 + 2**19 / 1e9}]   # 2 ranks: half moves
    figs = collective_figures(gathers, {"median_s": 50e-6}, world=2)
    assert figs["latency_us"] == pytest.approx(100)
    assert figs["allreduce_small_us"] == pytest.approx(50)
    assert figs["allgather_busbw"] == [[2**20, pytest.approx(1.0, rel=1e-3)]]


def test_share_groups_from_pairs():
    alone = [25.0] * 4
    pairs = {(0, 1): 12.5, (0, 2): 25, (0, 3): 25, (1, 2): 25, (1, 3): 25, (2, 3): 12}
    assert share_groups(4, alone, pairs) == [[0, 1], [2, 3]]
    assert share_groups(2, [25, 25], {(0, 1): 24}) == [[0], [1]]


def test_fabric_from_topology():
    nv = [["X", "NV12", "NV12"], ["NV12", "X", "NV12"], ["NV12", "NV12", "X"]]
    assert fabric_from_topology(3, nv) == {"kind": "nvswitch", "groups": [[0, 1, 2]]}
    pairs = [["X", "NV4", "SYS", "SYS"], ["NV4", "X", "SYS", "SYS"],
             ["SYS", "SYS", "X", "NV4"], ["SYS", "SYS", "NV4", "X"]]
    assert fabric_from_topology(4, pairs) == {"kind": "bridge", "groups": [[0, 1], [2, 3]]}
    pcie = [["X", "PIX"], ["PIX", "X"]]
    assert fabric_from_topology(2, pcie) == {"kind": "host"}
    assert fabric_from_topology(2, None) == {"kind": "host"}


def test_zo_rank_scaling_is_optional_and_checked():
    data = copy.deepcopy(load_json(shipped_profiles()["cpu"]))
    base_profile = HardwareProfile.from_dict(data)
    data["compute"]["zo_rank_scaling"] = 1.7
    data["sources"]["compute.zo_rank_scaling"] = "[M] test"
    with_zo = HardwareProfile.from_dict(data)
    assert zo_time_s(with_zo, 10**6, 2) == pytest.approx(
        10**6 * data["compute"]["zo_ns_per_param"] * 1e-9 / (1.7 / 2))
    assert forward_time_s(with_zo, flops=1e9, weight_bytes=1, tokens=64, local_ranks=2) == \
        forward_time_s(base_profile, flops=1e9, weight_bytes=1, tokens=64, local_ranks=2)
    data["compute"]["zo_rank_scaling"] = -1
    with pytest.raises(ZoError, match="compute.zo_rank_scaling"):
        HardwareProfile.from_dict(data)


# A made-up GPU (no GPU here): the truth the GPU fits must recover.
GPU_TRUTH = {"peak_tflops": 500.0, "tf32_tflops": 240.0, "fp32_tflops": 40.0,
             "m_half_tokens": 256.0, "overhead_us": 50.0, "hbm_gbps": 4000.0,
             "z_launch_us": 8.0, "z_ns_per_elem": 0.001}
GPU_GRID = {"bf16": [(h, b, s) for h in (1024, 2048, 4096)
                     for b, s in ((1, 64), (1, 256), (2, 512), (4, 1024), (8, 2048))],
            "tf32": [(2048, 1, 256), (4096, 2, 512), (4096, 8, 2048)],
            "fp32": [(2048, 1, 256), (4096, 2, 512), (4096, 8, 2048)]}


def _gpu_point(precision: str, hidden: int, batch: int, seq: int, truth=GPU_TRUTH) -> dict:
    """A forward point as zoexec.profiler.blocks.forward_grid returns it, timed by the
    GPU model of zoplan.hardware with the made-up figures."""
    p = block_forward_work(hidden, batch, seq, dtype_bytes=2 if precision == "bf16" else 4)
    p["precision"] = precision
    attn_bytes, elem_bytes = gpu_point_bytes(p)
    rate = truth[GPU_RATES[precision]]
    parts = gpu_forward_terms(truth, rate_tflops=rate, hbm_gbps=truth["hbm_gbps"],
                              flops=p["flops"], attn_flops=p["attn_flops"],
                              attn_bytes=attn_bytes, elem_bytes=elem_bytes,
                              weight_bytes=p["weight_bytes"], tokens=p["tokens"])
    p["median_s"] = gpu_forward_alone_s(parts[0], parts[1] + parts[2])
    return p


def _gpu_zo(truth=GPU_TRUTH) -> dict:
    """gpu_zo_costs' samples of the made-up GPU: z draws and passes."""
    def draw(tensors, numel):
        t = tensors * truth["z_launch_us"] * 1e-6 + tensors * numel * truth["z_ns_per_elem"] * 1e-9
        return {"tensors": tensors, "numel": numel, "elems": tensors * numel,
                "launches": tensors, "median_s": t}
    n = 2**28
    passes = [{"param_dtype": param, "compute_dtype": "bf16", "elems": n,
               "update": {"median_s": (2 * pb + 2) * n / (truth["hbm_gbps"] * 1e9)},
               "perturb": {"median_s": (pb + 4) * n / (truth["hbm_gbps"] * 1e9)}}
              for param, pb in (("bf16", 2), ("fp32", 4))]
    return {"dtype": "bf16", "z_draws": [draw(4, 2**26), draw(1024, 2**12)], "passes": passes}


def _cuda_round(n: int) -> dict:
    """What zoexec.profiler.cuda.measure_cuda returns, made up (no GPU here): GPUs in
    switch pairs, each link 54 GB/s alone, 26 H2D + 50 D2H both ways; a pair both ways
    24 H2D + 44 D2H."""
    def copy(rate, copies=1, h2d=None, d2h=None, jobs=()):
        out = {"per_copy_gbps": rate, "total_gbps": rate * copies, "median_s": 0.01,
               "per_job": list(jobs)}
        if h2d is not None:
            out["per_direction_gbps"] = {"h2d": h2d, "d2h": d2h}
        return out
    stats = {"median_s": 0.001, "iqr_s": [0.001, 0.001], "samples_s": [0.001]}
    grid = [_gpu_point(prec, h, b, s) for prec, shapes in GPU_GRID.items() for h, b, s in shapes]
    all_jobs = [{"device": i, "direction": d, "gbps": (12.0 if d == "h2d" else 22.0)}
                for i in range(n) for d in ("h2d", "d2h")]
    return {
        "devices": ["NVIDIA H200"] * n, "memory": [[140 * GIB, 143 * GIB]] * n,
        "h2d": [copy(54)] * n, "d2h": [copy(53)] * n,
        "duplex": [copy(38, 2, h2d=26, d2h=50)] * n,
        "sweep": [copy(50)], "all": copy(30, n),
        "all_duplex": copy(17, 2 * n, h2d=12, d2h=22, jobs=all_jobs),
        "pairs": {f"{i},{j}": copy(26 if (i // 2 == j // 2) else 54)
                  for i in range(n) for j in range(i + 1, n)},
        "d2d": {"gbps": 4000.0}, "p2p": {"gbps": 380.0},
        "forward_alone": grid, "zo_alone": _gpu_zo(),
        "topology": [["X" if i == j else "NV18" for j in range(n)] for i in range(n)],
        "nccl": {"allgather": [{"bytes": 8192, **stats, "median_s": 2e-5},
                               {"bytes": 2**26, **stats, "median_s": 2e-5 + 2**25 / 3e11}],
                 "allreduce": {**stats, "median_s": 1e-5}},
    }


def _cuda_samples(n: int) -> dict:
    """zoexec.profiler.measure's samples of a quick CUDA profile of n GPUs."""
    mib = 2**20
    settings = {"repeats": 3, "quick": True, "ranks": n, "cores": 64, "device": "cuda",
                "rounds": 1, "copy_bytes": 256 * mib, "store_bytes": 256 * mib,
                "copy_sweep": [16 * mib, 256 * mib], "gather_sizes": [8192, mib, 64 * mib],
                "forward_grid": [["opt", 1024, 1, 128]], "reference_shape": ["opt", 1024, 1, 128],
                "z_hiddens": [128, 2048], "zo_hidden": 2048,
                "z_gpu_blocks": [[4, 2**26], [1024, 2**12]],
                "speed_checks": {"gemm": {}, "memory": {"hidden": 128, "batch": 8, "seq": 512},
                                 "z": {}}}
    return {"settings": settings, "rounds": [_cuda_round(n)], "date": "2000-01-01",
            "host": {"name": "box", "cpu_model": "Xeon", "os": "Linux", "total_gib": 2048.0,
                     "used_gib": 10.0},
            "versions": {"torch": "2.13.0", "transformers": "5.23.0", "python": "3.11"},
            "devices": ["NVIDIA H200"] * n, "other_load_pct": 0.0, "rejected_samples": 3,
            "command": "zoplan profile"}


def test_cuda_samples_build_a_valid_profile():
    """The samples of zoexec.profiler on a CUDA machine (made up: no GPU here) become a
    validated profile with the planner's figures, notes and provenance."""
    data = build_profile(_cuda_samples(4), name="fake-h200")
    profile = HardwareProfile.from_dict(json.loads(json.dumps(data)))
    assert profile.switch_groups == [[0, 1], [2, 3]]
    assert profile.figures().pcie.switch_uplink_gbps == pytest.approx(54)  # never below one GPU alone
    # duplex: one GPU both ways; a switch pair both ways with all GPUs copying (its sum)
    assert (profile.figures().pcie.h2d_duplex_gbps, profile.figures().pcie.d2h_duplex_gbps) == (26, 50)
    assert profile.figures().pcie.uplink_h2d_duplex_gbps == pytest.approx(24)
    assert profile.figures().pcie.uplink_d2h_duplex_gbps == pytest.approx(44)
    assert profile.figures().host.mem_bw_gbps == pytest.approx(17 * 8)   # all GPUs both ways
    assert profile.figures().fabric.kind == "nvswitch" and profile.max_slices(4) == 4
    for key in ("peak_tflops", "tf32_tflops", "fp32_tflops"):
        assert profile.to_dict()["compute"][key] == pytest.approx(GPU_TRUTH[key], rel=0.02), key
    figures = profile.figures()
    assert figures.device.hbm_gbps == pytest.approx(4000)
    stage = (figures.device.update16_gbps, figures.device.perturb16_gbps,
             figures.device.update32_gbps, figures.device.perturb32_gbps)
    assert all(rate is not None and rate > 0 for rate in stage), stage
    assert figures.compute.z_launch_us == pytest.approx(8, rel=1e-3)
    assert figures.compute.mem_gbps is None and figures.pcie.duplex_gbps is None
    assert figures.collective.allgather_busbw[0][1] == pytest.approx(0.75 * 2 * 300, rel=0.01)
    assert profile.sources["pcie.h2d_gbps"].startswith("[M] zoplan profile 2000-01-01")
    assert profile.sources["collective.latency_us"].endswith(
        "8 KiB over 4 GPUs (median, from the last rank's arrival)")
    prov = profile.extra()["provenance"]
    assert prov["host"] == "box" and prov["versions"]["torch"] == "2.13.0"
    assert prov["versions"]["zoplan"] and prov["devices"] == ["NVIDIA H200"] * 4
    assert profile.extra()["measurements"]["rejected_samples"] == 3   # one round: its samples


def test_profile_name_defaults_to_host_and_devices():
    assert build_profile(_cuda_samples(2))["name"] == "box-2x-nvidia-h200"


def test_rounds_combine_to_the_median_of_each_figure():
    rounds = []
    for peak, busbw in ((0.1, 1.0), (0.3, 3.0), (0.2, 2.0)):
        data = json.loads(load_profile("cpu").to_json())
        data["compute"]["peak_tflops"] = peak
        data["collective"]["allgather_busbw"] = [[4096, busbw], [2**20, 2 * busbw]]
        data["sources"]["compute.peak_tflops"] = "[M] zoplan profile 2000-01-01 fit"
        data["measurements"] = {"peak": peak, "forward_alone": _points(peak, 500, 64)}
        rounds.append(data)
    combined = HardwareProfile.from_dict(combine_rounds(rounds))
    assert combined.figures().compute.peak_tflops == pytest.approx(0.2, rel=0.05)  # refit on medians
    assert combined.to_dict()["collective"]["allgather_busbw"] == [[4096, 2.0], [2**20, 4.0]]
    assert combined.sources["compute.peak_tflops"].endswith("(median of 3 rounds)")
    assert [m["peak"] for m in combined.extra()["measurements"]["rounds"]] == [0.1, 0.3, 0.2]


# ---- the GPU fits (synthetic samples of a made-up GPU) ------------------------------------
def test_gpu_compute_fit_recovers_a_rate_per_precision():
    """Forwards timed in bf16, fp32 with TF32 and fp32 (the profiler's grids) give one
    GEMM rate per precision, one efficiency term and one launch cost; attention and
    element-wise bytes at the HBM bandwidth are known parts of the time, not fitted."""
    points = [_gpu_point(prec, h, b, s) for prec, shapes in GPU_GRID.items()
              for h, b, s in shapes]
    fit = fit_gpu_compute(points, hbm_gbps=GPU_TRUTH["hbm_gbps"])
    for key in ("peak_tflops", "tf32_tflops", "fp32_tflops"):
        assert fit[key] == pytest.approx(GPU_TRUTH[key], rel=0.02), key
    assert fit["overhead_us"] == pytest.approx(50, rel=0.1)
    assert 200 <= fit["m_half_tokens"] <= 320
    assert fit["rel_rms_pct"] < 1
    assert fit_figures(fit)["fp32_tflops"] == pytest.approx(40, rel=0.02)


def test_gpu_compute_fit_of_the_h200s_forwards_is_a_plausible_chip():
    """The 8 forwards the H200 timed (tests/fixtures/h200/forwards.json): the 128-token
    bf16 ones take 0.58-0.71 ms whatever their width (the host's launches), the 16k-token
    ones 2.9 and 9.4 ms (the device; the launches hidden behind it). A fit that adds the
    launch cost to the device work gave 1219 TFLOP/s bf16 with 544 us of launches: above
    the chip's dense spec (989; the best public bf16 matmul on its SMs: 792). As the
    longer of the two, the rates sit below the datasheet's (989 / 494.5 / 67) and near
    what a matmul reaches, and the launch cost within the launch-bound forwards' times."""
    data = load_json(FIXTURES / "h200" / "forwards.json")
    fit = fit_gpu_compute(data["forward_alone"], hbm_gbps=data["hbm_gbps"])
    assert 700 <= fit["peak_tflops"] <= 850, fit
    assert 200 <= fit["tf32_tflops"] <= 494.5, fit
    assert 40 <= fit["fp32_tflops"] <= 67, fit
    assert 550 <= fit["overhead_us"] <= 750, fit
    long = [i for i, p in enumerate(data["forward_alone"]) if p["tokens"] > 8192]
    assert all(abs(fit["residuals_pct"][i]) < 5 for i in long), fit


def test_gpu_compute_fit_needs_every_precision():
    points = [_gpu_point("bf16", h, b, s) for h, b, s in GPU_GRID["bf16"]]
    with pytest.raises(ZoError, match="none in fp32, tf32"):
        fit_gpu_compute(points, hbm_gbps=4000)


def test_gpu_z_fit_and_hbm_from_passes():
    """z draws of a block of few large and one of many small tensors separate the cost
    of a generator launch from that of an element; the passes' bytes (2p + c, p + 2c)
    over their times give the HBM bandwidth."""
    zo = _gpu_zo()
    z = fit_gpu_z(zo["z_draws"])
    assert z["z_launch_us"] == pytest.approx(8, rel=1e-6)
    assert z["z_ns_per_elem"] == pytest.approx(0.001, rel=1e-6)
    hbm = hbm_from_passes(zo["passes"])
    assert hbm["hbm_gbps"] == pytest.approx(4000, rel=1e-9)
    assert [r["pass"] for r in hbm["passes"]] == ["update", "perturb"] * 2
