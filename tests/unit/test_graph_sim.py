"""Task graph, fair-sharing simulator and bounds: the invariants of DESIGN.md.

- a lone flow gets the whole link; two flows each get half; a flow that starts mid-way
  changes the other's finish time exactly as computed by hand; max-min across links;
- no two spans overlap on one rank's lane (on CPU profiles: on one rank at all);
- every dependency is respected; the write-back fence and the buffer reuse hold;
- lower bound <= simulated step <= fully serialised sum, for many layouts and profiles;
- bytes the simulator moved over each link = the analytic bytes of the bounds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import simpy

from zoplan.hardware import load_profile
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.sim.bounds import link_bytes, step_bounds
from zoplan.sim.graph import build_step_graph, internode_allreduce_s, step_costs
from zoplan.sim.simulate import FairShareNetwork, simulate
from zoplan.workload import Workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(name: str):
    return load_profile(FIXTURES / f"{name}.json")


# ---- fair sharing, by hand --------------------------------------------------------
def run_flows(capacities, flows):
    """flows: (start_s, bytes, link indices, cap_Bps); returns each flow's end time."""
    env = simpy.Environment()
    net = FairShareNetwork(env, capacities)
    ends = {}

    def proc(i, start, size, links, cap):
        yield env.timeout(start)
        yield net.transfer([(size, links, cap)])
        ends[i] = env.now
    for i, flow in enumerate(flows):
        env.process(proc(i, *flow))
    env.run()
    return [ends[i] for i in range(len(flows))]


def test_lone_flow_gets_the_whole_link():
    assert run_flows([10.0], [(0.0, 100.0, (0,), math.inf)]) == pytest.approx([10.0])


def test_two_flows_each_get_half():
    ends = run_flows([10.0], [(0.0, 100.0, (0,), math.inf), (0.0, 100.0, (0,), math.inf)])
    assert ends == pytest.approx([20.0, 20.0])


def test_flow_starting_midway_changes_the_other_finish_time():
    # A alone for 5 s at 10 B/s (50 B), then 5 B/s each: A's last 50 B take 10 s -> 15 s;
    # B has 50 B by then and finishes its last 50 B alone at 10 B/s -> 20 s.
    ends = run_flows([10.0], [(0.0, 100.0, (0,), math.inf), (5.0, 100.0, (0,), math.inf)])
    assert ends == pytest.approx([15.0, 20.0], rel=1e-12)


def test_max_min_fairness_across_links_and_private_caps():
    # A crosses links 0 (10 B/s) and 1 (4 B/s): bottleneck 4; B on link 0 alone gets 6.
    ends = run_flows([10.0, 4.0], [(0.0, 40.0, (0, 1), math.inf), (0.0, 60.0, (0,), math.inf)])
    assert ends == pytest.approx([10.0, 10.0])
    # a private cap of 2 B/s leaves 8 B/s to the other flow on the link
    ends = run_flows([10.0], [(0.0, 20.0, (0,), 2.0), (0.0, 80.0, (0,), math.inf)])
    assert ends == pytest.approx([10.0, 10.0])


def test_flows_on_separate_links_do_not_interact():
    ends = run_flows([10.0, 10.0], [(0.0, 100.0, (0,), math.inf), (0.0, 50.0, (1,), math.inf)])
    assert ends == pytest.approx([10.0, 5.0])


# ---- graph structure ---------------------------------------------------------------
def costs_for(profile, layout, *, model="opt-1.3b", batch=16, seq=256):
    dtype = "fp32" if profile.is_cpu else "fp16"
    workload = Workload(batch=batch, seq=seq, param_dtype=dtype, compute_dtype=dtype)
    return step_costs(model=get_model(model), profile=profile, workload=workload,
                      layout=layout)


def test_graph_has_every_task_and_is_a_dag():
    import networkx as nx
    costs = costs_for(load_profile("dgx-a100-80gb"), Layout(pertp=2, ddp=4, slices=4, prefetch=2))
    graph = build_step_graph(costs, num_blocks=6)
    kinds = {}
    for _, attrs in graph.nodes(data=True):
        kinds[attrs["kind"]] = kinds.get(attrs["kind"], 0) + 1
    assert kinds == {"embed": 8, "h2d": 48, "allgather": 48, "update": 48, "forward": 48,
                     "d2h": 48, "head": 8, "allreduce": 8}
    assert nx.is_directed_acyclic_graph(graph)


def test_fence_and_buffer_edges():
    costs = costs_for(load_profile("dgx-a100-80gb"), Layout(pertp=1, ddp=8, slices=2, prefetch=3))
    graph = build_step_graph(costs, num_blocks=8)
    into = {u: d["why"] for u, _, d in graph.in_edges("d2h/b5/r2", data=True)}
    # fence from every local rank outside r2's slice group {2, 3}; its group via the all-gather
    assert sorted(u for u, why in into.items() if why == "fence") == [
        f"h2d/b5/r{m}" for m in (0, 1, 4, 5, 6, 7)]
    assert graph.edges["d2h/b2/r2", "h2d/b5/r2"]["why"] == "buffer"
    assert not graph.has_edge("d2h/b4/r2", "h2d/b5/r2") or \
        graph.edges["d2h/b4/r2", "h2d/b5/r2"]["why"] == "order"


def test_internode_allreduce_is_log2_rounds_of_latency():
    profile = load_profile("dgx-a100-80gb")
    assert internode_allreduce_s(profile, 1) == 0.0
    assert internode_allreduce_s(profile, 128) == pytest.approx(7 * 25e-6)
    assert internode_allreduce_s(profile, 3) == pytest.approx(2 * 25e-6)


# ---- simulation invariants ---------------------------------------------------------
def _layouts(profile, gpus):
    for pertp in (1, 2):
        for slices in [s for s in (1, 2, 4, 8) if gpus % s == 0 and s <= profile.max_slices(gpus)]:
            for prefetch in (1, 2, 4):
                yield Layout(pertp=pertp, ddp=gpus // pertp, slices=slices, prefetch=prefetch)


CASES = [("dgx-a100-80gb", 8), ("node4-nvswitch", 4), ("pcie-host4", 4),
         ("pairs-bridge4", 4), ("cpu4", 4)]


def _profile(name):
    return load_profile(name) if name == "dgx-a100-80gb" else fixture(name)


@pytest.mark.parametrize("name,gpus", CASES)
def test_invariants_hold_for_every_layout(name, gpus):
    profile = _profile(name)
    for layout in _layouts(profile, gpus):
        costs = costs_for(profile, layout, model="opt-125m" if profile.is_cpu else "opt-1.3b")
        graph = build_step_graph(costs)
        result = simulate(graph)
        bounds = step_bounds(costs)
        label = f"{name} {layout.label()}"
        assert bounds.lower_bound_s <= result.step_time_s * (1 + 1e-9), label
        assert result.step_time_s <= bounds.serial_s * (1 + 1e-9), label
        _check_no_overlap(result.spans, serial=profile.is_cpu, label=label)
        _check_dependencies(graph, result.spans, label)
        expected = link_bytes(costs)
        for link, moved in result.link_bytes.items():
            assert moved == pytest.approx(expected[link], rel=1e-9), f"{label} {link}"


def _check_no_overlap(spans, *, serial: bool, label: str):
    lanes = {}
    for span in spans:
        lanes.setdefault((span.rank, "all" if serial else span.lane), []).append(span)
    for key, items in lanes.items():
        items.sort(key=lambda s: (s.start_s, s.end_s))
        for a, b in zip(items, items[1:]):
            assert b.start_s >= a.end_s - 1e-12, f"{label}: {a.name} overlaps {b.name} on {key}"


def _check_dependencies(graph, spans, label):
    by_name = {s.name: s for s in spans}
    assert len(by_name) == graph.number_of_nodes()
    for u, v, why in graph.edges(data="why"):
        assert by_name[u].end_s <= by_name[v].start_s + 1e-12, f"{label}: {why} {u} -> {v}"


def test_cpu_ranks_run_tasks_in_the_fixed_order():
    profile = fixture("cpu4")
    costs = costs_for(profile, Layout(pertp=1, ddp=4, slices=2, prefetch=2), model="tiny-opt",
                      seq=64)
    spans = simulate(build_step_graph(costs)).spans
    rank0 = sorted((s for s in spans if s.rank == 0), key=lambda s: s.start_s)
    order = [(s.kind, s.block) for s in rank0]
    expected = [("embed", -1)]
    for b in range(4):
        expected += [("h2d", b), ("allgather", b), ("update", b), ("forward", b), ("d2h", b)]
    assert order == expected + [("head", -1), ("allreduce", -1)]


def test_slicing_gains_nothing_when_peer_traffic_crosses_host_memory():
    profile = fixture("pcie-host4")
    times = {s: simulate(build_step_graph(costs_for(
        profile, Layout(pertp=1, ddp=4, slices=s, prefetch=2)))).step_time_s for s in (1, 2, 4)}
    assert times[2] >= times[1] and times[4] >= times[1], times


def test_slicing_gains_on_nvswitch():
    profile = load_profile("dgx-a100-80gb")
    times = {s: simulate(build_step_graph(costs_for(
        profile, Layout(pertp=1, ddp=8, slices=s, prefetch=3)))).step_time_s for s in (1, 8)}
    assert times[8] < times[1] / 2, times


# ---- the CPU cost model of a measured profile (attention, element-wise, z) --------------
def _measured_cpu(**extra):
    from zoplan.hardware import HardwareProfile

    data = fixture("cpu4").to_dict()
    data["compute"].update({"attn_tflops": 0.05, "elem_ns": 0.5, "z_ns_per_elem": 5.0,
                            "z_call_us": 400.0, "z_chunk_us": 20.0, "zo_pass_ns": 0.3,
                            "z_rank_scaling": 1.25,
                            **extra})
    return HardwareProfile.from_dict(data)


def test_measured_cpu_task_times_follow_the_schedule():
    from zoplan.execrules import z_makespan
    from zoplan.sim.graph import task_times

    hw, model = _measured_cpu(), get_model("tiny-opt")
    wl = Workload(batch=8, seq=64, param_dtype="fp32", compute_dtype="fp32")
    t = task_times(model=model, profile=hw, workload=wl, tokens=512, streams=2, local_ranks=1)
    busiest, chunks = z_makespan(model.block_tensor_numels(), 4)   # 4 cores, one rank
    z = 400e-6 + chunks * 20e-6 + busiest * 5e-9
    passes = model.block_params * 0.3e-9
    assert t["update_s"] == pytest.approx(2 * (z + passes))
    one = hw.forward_time_s(flops=512 * model.block_gemm_flops_per_token(),
                            attn_flops=512 * model.block_attn_flops_per_token(64),
                            elems=512 * model.block_elems_per_token(),
                            weight_bytes=model.block_params * 4, tokens=512)
    assert t["forward_s"] == pytest.approx(2 * one + passes)
    # attention and element-wise work are priced on their own
    assert one > hw.forward_time_s(flops=512 * model.block_gemm_flops_per_token(),
                                   weight_bytes=model.block_params * 4, tokens=512)
    # 4 ranks of one thread: no thread pool, the whole block on one thread, 1.25x faster
    t4 = task_times(model=model, profile=hw, workload=wl, tokens=512, streams=1, local_ranks=4)
    z4 = len(model.block_tensor_numels()) * 20e-6 + model.block_params * 5e-9 / 1.25
    assert t4["update_s"] == pytest.approx(2 * (z4 + hw.pass_time_s(model.block_params, 4)))


def test_z_model_needs_all_its_figures():
    from zoplan.errors import ZoError
    from zoplan.hardware import HardwareProfile

    data = _measured_cpu().to_dict()
    del data["compute"]["zo_pass_ns"]
    with pytest.raises(ZoError, match="zo_pass_ns missing"):
        HardwareProfile.from_dict(data)


def test_rank_jitter_makes_ranks_wait_and_keeps_the_bounds():
    model = get_model("tiny-opt")
    wl = Workload(batch=8, seq=64, param_dtype="fp32", compute_dtype="fp32")
    lay = Layout(pertp=1, ddp=2, slices=1, prefetch=2)
    steps = {}
    for jitter in (0.0, 0.05):
        hw = _measured_cpu(**({"rank_jitter": jitter} if jitter else {}))
        costs = step_costs(model=model, profile=hw, workload=wl, layout=lay)
        sim = simulate(build_step_graph(costs))
        bounds = step_bounds(costs)
        assert bounds.lower_bound_s <= sim.step_time_s * (1 + 1e-9) <= bounds.serial_s
        steps[jitter] = sim
    assert steps[0.05].step_time_s > steps[0.0].step_time_s
    assert steps[0.05].step_time_s <= steps[0.0].step_time_s * 1.05 + 1e-9
    busy = {r: sum(s.dur_s for s in steps[0.05].spans if s.rank == r) for r in (0, 1)}
    assert busy[1] > busy[0]   # rank 1 is the slow one, rank 0 waits for it
