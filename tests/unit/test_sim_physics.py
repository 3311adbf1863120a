"""The priced GPU physics (zoplan.pricing: host, overlap, zo; docs/costs.md): the host lane, the
streams sharing a GPU, z arithmetic-bound per GPU generation, the socket link, the
heavy tail of slow nodes, and their figures' source notes; CPU profiles unchanged."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.pricing.compute import hbm_gbps
from zoplan.pricing.overlap import NONE, Interference, interference, stream_factors
from zoplan.pricing.stragglers import expected_max_normal, node_spread, straggler_factor
from zoplan.pricing.zo import gpu_z_time_s, z_issue_s
from zoplan.sim.bounds import HOST, host_lane_s, step_bounds
from zoplan.sim.costs import step_costs
from zoplan.sim.graph import build_step_graph
from zoplan.sim.links import SOCKET_H2D
from zoplan.sim.simulate import simulate
from zoplan.workload import Workload

A100 = load_profile("dgx-a100-80gb")
WL = Workload(batch=16, seq=512, param_dtype="fp16", compute_dtype="fp16", update="stochastic")


def _costs(model: str, layout: Layout, *, profile=A100, workload=WL, resident=True):
    spec = get_model(model)
    return step_costs(model=spec, profile=profile, workload=workload, layout=layout,
                      resident=(resident,) * spec.num_layers)


def test_a_small_resident_model_is_host_bound_and_a_big_one_is_not():
    """opt-125m resident on one GPU: a block's device time is well under a millisecond,
    its issue (layer call, z reseeds, events) longer: the host lane binds, the simulated
    step is no shorter than it. OPT-175B's blocks (tens of ms) are compute-bound."""
    small = _costs("opt-125m", Layout(pertp=1, ddp=1, slices=1, prefetch=1),
                   workload=Workload(batch=1, seq=128, param_dtype="fp16",
                                     compute_dtype="fp16", update="plain"))
    bounds = step_bounds(small)
    assert bounds.binding == HOST, bounds.resources
    sim = simulate(build_step_graph(small))
    assert sim.step_time_s >= host_lane_s(small, 0, small.num_blocks) * (1 - 1e-9)
    assert small.forward_s < small.issue_s["forward"]
    big = _costs("opt-175b", Layout(pertp=2, ddp=4, slices=8, prefetch=2, slice_update=True))
    big_bounds = step_bounds(big)
    assert big_bounds.binding != HOST
    assert big_bounds.resources[HOST] < 0.1 * big_bounds.lower_bound_s


def test_the_simulator_holds_a_task_to_its_issue_window():
    """No task starts before its issue starts nor ends before it ends."""
    costs = _costs("opt-125m", Layout(pertp=1, ddp=2, slices=2, prefetch=1), resident=False)
    graph = build_step_graph(costs)
    sim = simulate(graph)
    for name, (start, end) in sim.times.items():
        issue = graph.nodes[name]["issue"]
        assert start >= issue[0] - 1e-12 and end >= issue[1] - 1e-12, name


def test_the_streams_sharing_a_gpu_slow_each_other():
    """With a slice update and an all-gather beside the compute stream, compute tasks run
    1 + k min(1, L / C) slower and the collective's 1 + k min(1, C / L) on a profile of
    one symmetric figure (the A100's, assumed); k = 0: none."""
    lay = Layout(pertp=2, ddp=4, slices=8, prefetch=2, slice_update=True)
    shared = _costs("opt-175b", lay)
    data = copy.deepcopy(A100.to_dict())
    data["compute"]["overlap_slowdown"] = 0.0
    alone = _costs("opt-175b", lay, profile=HardwareProfile.from_dict(data))
    k = A100.figures().compute.overlap_slowdown
    comp, side, coll = shared.overlap
    assert alone.overlap == (1.0, 1.0, 1.0)
    assert stream_factors(compute_s=1.0, slice_s=0.5, other_s=0.5, k=NONE) == (1.0, 1.0, 1.0)
    assert side == coll   # one figure: the slice update and the all-gather alike
    assert 1.0 < comp <= 1 + k and 1.0 < coll <= 1 + k and max(comp, coll) == pytest.approx(1 + k)
    assert shared.forward_s == pytest.approx(alone.forward_s * comp)
    assert shared.slice_s(0) == pytest.approx(alone.slice_s(0) * side)
    assert shared.allgather_alone_s(0) > alone.allgather_alone_s(0)
    lone = _costs("opt-175b", Layout(pertp=1, ddp=1, slices=1, prefetch=2), resident=False)
    assert lone.overlap == (1.0, 1.0, 1.0)   # one GPU: no collective-stream work to share with


H200_CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-2026-12-04" / "pass2"


def test_the_h200s_interference_is_priced_as_it_was_measured():
    """The H200's overlap probe (scripts/gpu_check.sh, pass 2's summary.json): z + update
    passes beside a forward +154%, the forward beside them +4.7%; an H2D copy beside a
    forward slowed neither. The Hopper profiles' figures, put in the probe's setup (the
    passes alone 0.60 of the forward), give those slowdowns back; the all-gather keeps
    the assumed symmetric figure; and a plan with the update on the slice stretches the
    slice update, not the compute stream."""
    probe = json.loads((H200_CHECK / "summary.json").read_text())["stages"]["overlap"]
    h200 = load_profile("hgx-h200")
    k = interference(h200)
    comp, side, coll = stream_factors(compute_s=probe["forward_ms"], slice_s=probe["update_ms"],
                                      other_s=0.0, k=k)
    assert comp - 1 == pytest.approx(probe["forward_slowdown_beside_update"], rel=0.02)
    assert side - 1 == pytest.approx(probe["update_slowdown_beside_forward"], rel=0.02)
    assert abs(probe["forward_slowdown_beside_h2d"]) < 0.02 > abs(probe["h2d_slowdown_beside_forward"])
    assert k.k == A100.figures().compute.overlap_slowdown and coll == pytest.approx(1 + k.k)
    assert interference(load_profile("dgx-h100")) == k == interference(load_profile("gh200"))
    wl = Workload(batch=16, seq=512, param_dtype="bf16", compute_dtype="bf16", update="stochastic")
    plan = _costs("opt-175b", Layout(pertp=2, ddp=4, slices=8, prefetch=2, slice_update=True),
                  profile=h200, workload=wl)
    comp, side, coll = plan.overlap
    assert side > coll > comp > 1.0
    symmetric = Interference(k.k, k.k, k.k)
    assert stream_factors(compute_s=1.0, slice_s=0.4, other_s=0.6, k=symmetric)[1] < side


def test_z_is_arithmetic_bound_and_the_h200_draws_like_the_h100():
    """Philox draws cost the generation's figure per value, not bytes over HBM: the
    H200 (the H100's SMs; its element-wise passes measured at 2399 GB/s, below the
    H100's public figure) costs what the H100 does (3.676 ps measured, 3.7 public);
    the A100's z is above its bytes at HBM."""
    h100, h200 = load_profile("dgx-h100"), load_profile("hgx-h200")
    numels = get_model("opt-13b").block_tensor_numels()
    assert gpu_z_time_s(h200, numels, elem_bytes=2) == pytest.approx(
        gpu_z_time_s(h100, numels, elem_bytes=2), rel=0.01)
    assert hbm_gbps(h200) == pytest.approx(2399)
    n = sum(numels)
    assert gpu_z_time_s(A100, numels) > 4 * n / (A100.figures().device.hbm_gbps * 1e9)
    assert z_issue_s(A100, numels) > 0   # its launches are the host's


def test_a_two_socket_host_sends_half_the_store_across_the_socket_link():
    costs = _costs("opt-13b", Layout(pertp=1, ddp=8, slices=1, prefetch=2), resident=False)
    assert all(SOCKET_H2D in f.route for flows in costs.h2d for f in flows)
    assert costs.links[SOCKET_H2D] == pytest.approx(128e9 / 0.5)
    one = _costs("opt-13b", Layout(pertp=1, ddp=1, slices=1, prefetch=2),
                 profile=load_profile("gh200"), resident=False)
    assert SOCKET_H2D not in one.links


def test_slow_nodes_make_a_heavy_tail():
    """With a share of nodes carrying a slow GPU the job's expected lead grows toward
    its penalty; one node waits for nobody."""
    assert straggler_factor(A100, 1) == 1.0
    gauss = 1 + node_spread(A100) * expected_max_normal(4096)
    assert straggler_factor(A100, 4096) > gauss
    assert straggler_factor(A100, 4096) == pytest.approx(
        1 + A100.figures().compute.slow_node_penalty, rel=1e-3)


def test_a_new_figure_needs_its_own_source_note():
    data = copy.deepcopy(A100.to_dict())
    del data["sources"]["compute.overlap_slowdown"]
    with pytest.raises(ZoError, match="compute.overlap_slowdown has no source note"):
        HardwareProfile.from_dict(data)
    data = copy.deepcopy(A100.to_dict())
    data["device"]["hbm_fraction"] = 1.5
    with pytest.raises(ZoError, match="device.hbm_fraction is 1.5"):
        HardwareProfile.from_dict(data)


def test_cpu_profiles_have_no_host_lane_and_no_sharing():
    cpu = load_profile("cpu")
    costs = _costs("tiny-opt", Layout(pertp=1, ddp=2, slices=2, prefetch=1), profile=cpu,
                   workload=Workload(batch=4, seq=64), resident=False)
    assert costs.issue_s == {} and costs.overlap == (1.0, 1.0, 1.0)
    assert HOST not in step_bounds(costs).resources


def test_a_store_that_cannot_be_page_locked_is_staged_by_the_host():
    """pcie.pinned false: zoexec copies the store through pinned slots
    (zoexec.runtime.pinning.Staging), the rank's thread copying every byte into (out of)
    a slot at the pageable rates while the DMA runs beside it: the copies' issue grows
    by their bytes over those rates, a copy starts with its issue (not after it) and
    ends no sooner, and the host lane pays for it. A GPU profile that says so without
    the pageable rates is refused."""
    h200 = load_profile("hgx-h200")
    data = copy.deepcopy(h200.to_dict())
    data["pcie"]["pinned"] = False
    pageable = HardwareProfile.from_dict(data)
    wl = Workload(batch=8, seq=512, param_dtype="bf16", compute_dtype="bf16", update="stochastic")
    lay = Layout(pertp=1, ddp=1, slices=1, prefetch=3)
    pinned = _costs("opt-1.3b", lay, profile=h200, workload=wl, resident=False)
    staged = _costs("opt-1.3b", lay, profile=pageable, workload=wl, resident=False)
    block = pinned.block_bytes
    gbps = h200.to_dict()["pcie"]
    assert staged.issue_s["h2d"] - pinned.issue_s["h2d"] == pytest.approx(block / (gbps["pageable_h2d_gbps"] * 1e9))
    assert staged.issue_s["d2h"] - pinned.issue_s["d2h"] == pytest.approx(block / (gbps["pageable_d2h_gbps"] * 1e9))
    graph = build_step_graph(staged)
    sim = simulate(graph)
    copies = [n for n, a in graph.nodes(data=True) if a["kind"] in ("h2d", "d2h")]
    for name in copies:
        issue = graph.nodes[name]["issue"]
        assert graph.nodes[name]["staged"] and sim.times[name][1] >= issue[1] - 1e-12
    h2d = [n for n in copies if graph.nodes[n]["kind"] == "h2d"]
    assert any(sim.times[n][0] < graph.nodes[n]["issue"][1] for n in h2d)   # starts with its issue
    assert simulate(build_step_graph(pinned)).step_time_s * 3 < sim.step_time_s
    assert not any("staged" in a for _, a in build_step_graph(pinned).nodes(data=True))
    data = copy.deepcopy(A100.to_dict())
    data["pcie"]["pinned"] = False
    for key in ("pageable_h2d_gbps", "pageable_d2h_gbps"):   # the shipped ones (assumed)
        del data["pcie"][key], data["sources"][f"pcie.{key}"]
    with pytest.raises(ZoError, match="pcie.pinned is false"):
        HardwareProfile.from_dict(data)
