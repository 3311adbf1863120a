"""Shipped hardware profiles load and carry sources; validation errors are one clear line."""

from __future__ import annotations

import copy
import json

import pytest

from zoplan import profile as prof
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile, shipped_profiles
from zoplan.io import load_json

EXPECTED = {"dgx-a100-80gb", "dgx-h100", "hgx-h200", "8x-rtx4090", "8x-a100-pcie-nvlink-pairs",
            "rtx4090-workstation", "gh200", "cpu"}
MULTI_NODE = ("dgx-a100-80gb", "dgx-h100", "hgx-h200")


def base() -> dict:
    return load_json(shipped_profiles()["dgx-a100-80gb"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_profile_loads_with_sources(name):
    profile = load_profile(name)
    assert profile.name == name
    for path, note in profile.sources.items():
        assert note.startswith(("[S]", "[M]", "[D]")), f"{name}: {path} note {note!r}"
    assert HardwareProfile.from_dict(profile.to_dict()) == profile
    assert len(profile.fabric_groups) >= 1


def test_all_expected_profiles_are_shipped():
    assert EXPECTED <= set(shipped_profiles())


@pytest.mark.parametrize("name", MULTI_NODE)
def test_multi_node_profiles_reach_128_nodes(name):
    assert load_profile(name).max_nodes >= 128


def test_profile_specifics():
    assert load_profile("8x-rtx4090").fabric["kind"] == "host"
    assert load_profile("8x-rtx4090").pcie["switch_groups"]
    pairs = load_profile("8x-a100-pcie-nvlink-pairs")
    assert pairs.fabric["kind"] == "bridge" and pairs.max_slices(8) == 2
    assert load_profile("rtx4090-workstation").gpus_per_node == 1
    gh = load_profile("gh200")
    assert gh.gpus_per_node == 1 and 345 <= gh.pcie["h2d_gbps"] <= 420
    cpu = load_profile("cpu")
    assert cpu.is_cpu and cpu.device["concurrent_engines"] is False
    assert cpu.fabric["kind"] == "shm"


def _mutate(fn) -> dict:
    data = copy.deepcopy(base())
    fn(data)
    return data


CASES = [
    ("negative bandwidth", lambda d: d["pcie"].update(h2d_gbps=-3), "pcie.h2d_gbps"),
    ("zero bandwidth", lambda d: d["fabric"].update(p2p_gbps=0), "fabric.p2p_gbps"),
    ("not a number", lambda d: d["compute"].update(peak_tflops="fast"), "compute.peak_tflops"),
    ("missing section", lambda d: d.pop("collective"), "collective"),
    ("missing field", lambda d: d["host"].pop("cores"), "host.cores"),
    ("unknown key", lambda d: d.update(gpu_count=8), "gpu_count"),
    ("group rank out of range", lambda d: d["pcie"].update(switch_groups=[[0, 9]]), "pcie.switch_groups"),
    ("group rank twice", lambda d: d["fabric"].update(groups=[[0, 1], [1, 2]]), "fabric.groups"),
    ("group not a list", lambda d: d["fabric"].update(groups=[0, 1]), "fabric.groups"),
    ("missing source note", lambda d: d["sources"].pop("pcie.h2d_gbps"), "pcie.h2d_gbps"),
    ("schema version", lambda d: d.update(schema_version=2), "schema_version"),
    ("table order", lambda d: d["collective"].update(allgather_busbw=[[2, 1], [1, 1]]),
     "collective.allgather_busbw"),
    ("device kind", lambda d: d["device"].update(kind="tpu"), "device.kind"),
    ("fabric kind", lambda d: d["fabric"].update(kind="infiniband"), "fabric.kind"),
]


@pytest.mark.parametrize("label,mutate,field", CASES, ids=[c[0] for c in CASES])
def test_validation_error_names_the_field(label, mutate, field):
    with pytest.raises(ZoError) as info:
        HardwareProfile.from_dict(_mutate(mutate), origin="profile x.json")
    message = str(info.value)
    assert field in message, message
    assert "\n" not in message and message.startswith("profile x.json: ")


def test_not_json_is_one_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{ not json")
    with pytest.raises(ZoError) as info:
        load_profile(path)
    assert "not valid JSON" in str(info.value) and "\n" not in str(info.value)


def test_unknown_profile_name_lists_shipped():
    with pytest.raises(ZoError, match="dgx-h100"):
        load_profile("no-such-machine")


def test_profile_path_round_trip(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(base()))
    assert load_profile(path) == load_profile("dgx-a100-80gb")


# ---- zoplan profile: the pure parts (the measuring run is in test_loop_e2e.py) ---------


def _points(peak_tflops, overhead_us, m_half):
    pts = []
    for flops, tokens in [(1e9, 32), (4e9, 128), (1.6e10, 512), (6e10, 2048), (2e9, 64)]:
        t = overhead_us * 1e-6 + flops * (tokens + m_half) / tokens / (peak_tflops * 1e12)
        pts.append({"flops": flops, "tokens": tokens, "weight_bytes": 1.0, "median_s": t})
    return pts


def test_compute_fit_recovers_the_model():
    fit = prof.fit_compute(_points(0.2, 500, 64), mem_gbps=10)
    assert fit["peak_tflops"] == pytest.approx(0.2, rel=0.05)
    assert fit["overhead_us"] == pytest.approx(500, rel=0.1)
    assert 40 <= fit["m_half_tokens"] <= 100
    assert fit["rel_rms_pct"] < 2


def test_compute_fit_tells_gemm_attention_and_elementwise_apart():
    """CPU points carry attention FLOPs and element-wise outputs; the fit recovers the
    four figures of a synthetic machine from the same grid shapes a profile times."""
    settings = prof.Settings(repeats=1, quick=False, ranks=1, cores=2)
    truth = {"peak": 0.25e12, "attn": 0.08e12, "elem_ns": 0.6, "over": 300e-6, "m_half": 48.0}
    points = []
    for family, hidden, batch, seq in settings.forward_grid:
        p = prof.forward_point(hidden, batch, seq, {}, dtype_bytes=4, family=family)
        p["median_s"] = (truth["over"] + p["flops"] * (p["tokens"] + truth["m_half"])
                         / p["tokens"] / truth["peak"] + p["attn_flops"] / truth["attn"]
                         + p["elems"] * truth["elem_ns"] * 1e-9)
        points.append(p)
    fit = prof.fit_compute(points, mem_gbps=1e6)
    assert fit["peak_tflops"] == pytest.approx(0.25, rel=0.05)
    assert fit["attn_tflops"] == pytest.approx(0.08, rel=0.05)
    assert fit["elem_ns"] == pytest.approx(0.6, rel=0.1)
    assert fit["overhead_us"] == pytest.approx(300, rel=0.1)
    assert fit["rel_rms_pct"] < 1
    assert fit["rope_overhead_us"] == pytest.approx(0, abs=15)   # both families alike


def test_compute_fit_prices_a_llama_blocks_extra_dispatch():
    """A Llama block runs more operators than an OPT block (RMS norms, gated MLP,
    rotary embedding): the fit gives them their own dispatch cost, and the planner
    adds it to blocks of the Llama family only."""
    from zoplan.hardware import forward_terms

    settings = prof.Settings(repeats=1, quick=False, ranks=1, cores=2)
    over, rope = 800e-6, 300e-6
    points = []
    for family, hidden, batch, seq in settings.forward_grid:
        p = prof.forward_point(hidden, batch, seq, {}, dtype_bytes=4, family=family)
        p["median_s"] = (over + (rope if family != "opt" else 0.0)
                         + p["flops"] * (p["tokens"] + 48.0) / p["tokens"] / 0.25e12
                         + p["attn_flops"] / 0.08e12 + p["elems"] * 0.6e-9)
        points.append(p)
    fit = prof.fit_compute(points, mem_gbps=1e6)
    assert fit["overhead_us"] == pytest.approx(800, rel=0.05)
    assert fit["rope_overhead_us"] == pytest.approx(300, rel=0.1)
    assert prof.fit_figures(fit)["rope_overhead_us"] == pytest.approx(300, rel=0.1)
    work = dict(flops=1e9, attn_flops=0.0, elems=0.0, tokens=256)
    opt, llama = (forward_terms(fit, **work, family=f)[0] for f in ("opt", "llama"))
    assert llama - opt == pytest.approx(fit["rope_overhead_us"] * 1e-6)
    # one family alone: no such term (its dispatch is the overhead)
    only_opt = prof.fit_compute([p for p in points if p["family"] == "opt"], mem_gbps=1e6)
    assert "rope_overhead_us" not in only_opt


def test_z_fit_and_paired_scalings():
    draws = [{"busiest_elems": n, "median_s": 400e-6 + n * 5e-9} for n in (99_000, 1_600_000)]
    z = prof.fit_z(draws)
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
    assert prof.paired_z_scaling(measured, call_s=400e-6) == pytest.approx(1.25)
    assert prof.paired_rank_scaling(measured, overhead_s=0.010) == pytest.approx(1.6)


def test_compute_fit_needs_two_points():
    with pytest.raises(ZoError, match=">= 2"):
        prof.fit_compute(_points(1, 1, 1)[:1], mem_gbps=1)


def test_rank_scaling_inverts_the_profile_model():
    # one rank: 100 ms = 10 ms overhead + 90 ms work; two ranks at once: 10 + 90 * 2 / 1.6
    together = 0.010 + 0.090 * 2 / 1.6
    assert prof.rank_scaling(alone_s=0.1, together_s=together, ranks=2,
                             overhead_s=0.01) == pytest.approx(1.6)
    assert prof.rank_scaling(alone_s=0.1, together_s=0.2, ranks=1, overhead_s=0) == 1.0


def test_summarize_has_median_and_iqr():
    s = prof.summarize([3.0, 1.0, 2.0, 4.0, 100.0])
    assert s["median_s"] == 3.0 and s["iqr_s"] == [2.0, 4.0]
    assert s["samples_s"] == [3.0, 1.0, 2.0, 4.0, 100.0]


def test_collective_figures_subtract_the_latency():
    gathers = [{"bytes": 4096, "median_s": 100e-6},
               {"bytes": 2**20, "median_s": 100e-6 + 2**19 / 1e9}]   # 2 ranks: half moves
    figs = prof.collective_figures(gathers, {"median_s": 50e-6}, world=2)
    assert figs["latency_us"] == pytest.approx(100)
    assert figs["allreduce_small_us"] == pytest.approx(50)
    assert figs["allgather_busbw"] == [[2**20, pytest.approx(1.0, rel=1e-3)]]


def test_share_groups_from_pairs():
    alone = [25.0] * 4
    pairs = {(0, 1): 12.5, (0, 2): 25, (0, 3): 25, (1, 2): 25, (1, 3): 25, (2, 3): 12}
    assert prof.share_groups(4, alone, pairs) == [[0, 1], [2, 3]]
    assert prof.share_groups(2, [25, 25], {(0, 1): 24}) == [[0], [1]]


def test_fabric_from_topology():
    nv = [["X", "NV12", "NV12"], ["NV12", "X", "NV12"], ["NV12", "NV12", "X"]]
    assert prof.fabric_from_topology(3, nv) == {"kind": "nvswitch", "groups": [[0, 1, 2]]}
    pairs = [["X", "NV4", "SYS", "SYS"], ["NV4", "X", "SYS", "SYS"],
             ["SYS", "SYS", "X", "NV4"], ["SYS", "SYS", "NV4", "X"]]
    assert prof.fabric_from_topology(4, pairs) == {"kind": "bridge", "groups": [[0, 1], [2, 3]]}
    pcie = [["X", "PIX"], ["PIX", "X"]]
    assert prof.fabric_from_topology(2, pcie) == {"kind": "host"}
    assert prof.fabric_from_topology(2, None) == {"kind": "host"}


def test_importing_zoplan_profile_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, zoplan.profile, zoplan.calibrate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_zo_rank_scaling_is_optional_and_checked():
    data = copy.deepcopy(load_json(shipped_profiles()["cpu"]))
    base_profile = HardwareProfile.from_dict(data)
    data["compute"]["zo_rank_scaling"] = 1.7
    data["sources"]["compute.zo_rank_scaling"] = "[M] test"
    with_zo = HardwareProfile.from_dict(data)
    assert with_zo.zo_time_s(10**6, 2) == pytest.approx(
        10**6 * data["compute"]["zo_ns_per_param"] * 1e-9 / (1.7 / 2))
    assert with_zo.forward_time_s(flops=1e9, weight_bytes=1, tokens=64, local_ranks=2) == \
        base_profile.forward_time_s(flops=1e9, weight_bytes=1, tokens=64, local_ranks=2)
    data["compute"]["zo_rank_scaling"] = -1
    with pytest.raises(ZoError, match="compute.zo_rank_scaling"):
        HardwareProfile.from_dict(data)


def _fake_cuda_measurements(n: int) -> dict:
    """What measure_cuda returns, made up (no GPU here): the profile builder's input."""
    def copy(rate, copies=1):
        return {"per_copy_gbps": rate, "total_gbps": rate * copies, "median_s": 0.01}
    stats = {"median_s": 0.001, "iqr_s": [0.001, 0.001], "samples_s": [0.001]}
    grid = [{"hidden": 1024, "batch": 1, "seq": 128, "tokens": t, "flops": 1e9 * t,
             "weight_bytes": 2e7, "median_s": 5e-5 + 1e9 * t * (t + 256) / t / 5e14}
            for t in (128, 512, 2048, 8192)]
    return {
        "devices": ["NVIDIA H200"] * n, "memory": [[140 * prof.GIB, 143 * prof.GIB]] * n,
        "h2d": [copy(54)] * n, "d2h": [copy(53)] * n, "duplex": [copy(30, 2)] * n,
        "sweep": [copy(50)], "all": copy(45, n),
        "pairs": {f"{i},{j}": copy(26 if (i // 2 == j // 2) else 54)
                  for i in range(n) for j in range(i + 1, n)},
        "d2d": {"gbps": 4000.0}, "p2p": {"gbps": 380.0},
        "forward_alone": grid, "zo_alone": {"ns_per_param": 0.01},
        "topology": [["X" if i == j else "NV18" for j in range(n)] for i in range(n)],
        "nccl": {"allgather": [{"bytes": 8192, **stats, "median_s": 2e-5},
                               {"bytes": 2**26, **stats, "median_s": 2e-5 + 2**25 / 3e11}],
                 "allreduce": {**stats, "median_s": 1e-5}},
    }


def test_cuda_profile_builder_makes_a_valid_profile():
    settings = prof.Settings(repeats=3, quick=True, ranks=4, cores=64, device="cuda")
    memory = {"total_gib": 2048.0, "used_gib": 10.0, "cpu_model": "Xeon"}
    data = prof.cuda_profile(_fake_cuda_measurements(4), settings, name="fake-h200",
                             date="2000-01-01", memory=memory)
    profile = HardwareProfile.from_dict(json.loads(json.dumps(data)))
    assert profile.pcie["switch_groups"] == [[0, 1], [2, 3]]
    assert profile.pcie["switch_uplink_gbps"] == pytest.approx(54)  # never below one GPU alone
    assert profile.fabric["kind"] == "nvswitch" and profile.max_slices(4) == 4
    assert profile.compute["peak_tflops"] == pytest.approx(500, rel=0.05)
    assert profile.collective["allgather_busbw"][0][1] == pytest.approx(0.75 * 2 * 300, rel=0.01)
    assert profile.sources["pcie.h2d_gbps"].startswith("[M] zoplan profile 2000-01-01")


def test_rounds_combine_to_the_median_of_each_figure():
    rounds = []
    for peak, busbw in ((0.1, 1.0), (0.3, 3.0), (0.2, 2.0)):
        data = json.loads(load_profile("cpu").to_json())
        data["compute"]["peak_tflops"] = peak
        data["collective"]["allgather_busbw"] = [[4096, busbw], [2**20, 2 * busbw]]
        data["sources"]["compute.peak_tflops"] = "[M] zoplan profile 2000-01-01 fit"
        data["measurements"] = {"peak": peak, "forward_alone": _points(peak, 500, 64)}
        rounds.append(data)
    combined = HardwareProfile.from_dict(prof.combine_rounds(rounds))
    assert combined.compute["peak_tflops"] == pytest.approx(0.2, rel=0.05)  # refit on medians
    assert combined.collective["allgather_busbw"] == [[4096, 2.0], [2**20, 4.0]]
    assert combined.sources["compute.peak_tflops"].endswith("(median of 3 rounds)")
    assert [m["peak"] for m in combined.extra["measurements"]["rounds"]] == [0.1, 0.3, 0.2]


def test_forward_grid_warms_short_shapes_before_each_sample(monkeypatch):
    """A shape under WARM_VISIT_BELOW_S is called once untimed before each timed call
    (right after a larger shape it would run cold); a longer one is timed directly."""
    import time

    calls = {"short": 0, "long": 0}

    class Block:
        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def embed(self, ids):
            return None, None

        def block_forward(self, hidden, ctx):
            calls[self.name] += 1
            time.sleep(self.seconds)

    blocks = {128: Block("short", 0.001), 256: Block("long", prof.WARM_VISIT_BELOW_S * 1.2)}
    monkeypatch.setattr(prof, "build_block", lambda hidden, seq, **kw: blocks[hidden])
    monkeypatch.setattr(prof.Settings, "forward_grid",
                        property(lambda self: [("opt", 128, 1, 32), ("opt", 256, 1, 32)]))
    settings = prof.Settings(repeats=3, quick=True, ranks=1, cores=2)
    points = prof.forward_grid(settings, dtype="fp32", device="cpu")
    assert [len(p["samples_s"]) for p in points] == [3, 3]
    assert calls == {"short": 1 + 2 * 3, "long": 1 + 3}


@pytest.mark.parametrize("args,message", [(["--ranks", "0"], "--ranks must be >= 1, got 0"),
                                          (["--repeats", "0"], "repeats must be >= 1, got 0")])
def test_profile_refuses_bad_settings_in_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from zoplan.cli import app

    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["profile", "--cpu", "--quick", *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {message}"]
    assert not out.exists()


def test_collectives_are_timed_from_the_last_arrival():
    """collective_samples counts a collective from the moment the last rank entered it
    (the others' earlier time there is waiting, as zoplan calibrate counts it)."""
    import time

    class FakeDist:
        class ReduceOp:
            MAX = "max"

        def barrier(self):
            pass

        def get_rank(self):
            return 1   # never the late one at even indices

        def get_world_size(self):
            return 2

        def all_reduce(self, tensor, op=None):
            assert op == "max"
            tensor.fill_(tensor.item() + 0.010)   # the other rank entered 10 ms later

    samples = prof.collective_samples(lambda: time.sleep(0.015), dist=FakeDist(), repeats=4,
                                      warmup=1)
    assert len(samples) == 4
    assert all(0.004 <= s <= 0.012 for s in samples), samples   # 15 ms - 10 ms, not 15 ms
