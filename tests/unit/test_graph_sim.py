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
from zoplan.pricing.collectives import internode_allreduce_s
from zoplan.pricing.compute import forward_time_s, gemm_tflops, gpu_elems_per_token
from zoplan.pricing.host import forward_issue_s
from zoplan.pricing.tasks import task_times
from zoplan.pricing.zo import cpu_z_time_s, gpu_z_time_s, pass_time_s, sr_chunks, z_issue_s
from zoplan.sim.bounds import link_bytes, step_bounds
from zoplan.sim.costs import step_costs
from zoplan.sim.graph import build_step_graph
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
def costs_for(profile, layout, *, model="opt-1.3b", batch=16, seq=256, update=""):
    dtype = "fp32" if profile.is_cpu else "fp16"
    param = "fp32" if update == "master" else dtype
    workload = Workload(batch=batch, seq=seq, param_dtype=param, compute_dtype=dtype,
                        update=update)
    return step_costs(model=get_model(model), profile=profile, workload=workload,
                      layout=layout)


def test_graph_has_every_task_and_is_a_dag():
    import networkx as nx
    costs = costs_for(load_profile("dgx-a100-80gb"), Layout(pertp=2, ddp=4, slices=4, prefetch=2))
    graph = build_step_graph(costs, num_blocks=6)
    kinds = {}
    for _, attrs in graph.nodes(data=True):
        kinds[attrs["kind"]] = kinds.get(attrs["kind"], 0) + 1
    # slices 4 < 8 local ranks on CUDA: a write-back fence collective per block and rank
    assert kinds == {"embed": 8, "h2d": 48, "allgather": 48, "update": 48, "forward": 48,
                     "d2h": 48, "head": 8, "allreduce": 8, "fence": 48}
    assert nx.is_directed_acyclic_graph(nx.DiGraph(list(graph.edges())))


def test_fence_and_buffer_edges():
    """CPU ranks: d2h waits on every other slice group's h2d directly (read stamps);
    CUDA ranks: on the node's fence collective, issued once the block is ready."""
    lay = Layout(pertp=1, ddp=4, slices=2, prefetch=2)
    graph = build_step_graph(costs_for(fixture("cpu4"), lay, model="opt-125m"), num_blocks=6)
    into = {u: d["why"] for u, _, d in graph.in_edges("d2h/b5/r2", data=True)}
    # fence from every local rank outside r2's slice group {2, 3}; its group via the all-gather
    assert sorted(u for u, why in into.items() if why == "fence") == ["h2d/b5/r0", "h2d/b5/r1"]
    assert not any(attrs["kind"] == "fence" for _, attrs in graph.nodes(data=True))

    costs = costs_for(load_profile("dgx-a100-80gb"), Layout(pertp=1, ddp=8, slices=2, prefetch=3))
    graph = build_step_graph(costs, num_blocks=8)
    into = {u: d["why"] for u, _, d in graph.in_edges("d2h/b5/r2", data=True)}
    assert [u for u, why in into.items() if why == "fence"] == ["fence/b5/r2"]
    fence = graph.nodes["fence/b5/r2"]
    assert fence["group"] == ("fence", 5, 0) and fence["lane"] == "collective"
    assert fence["dur_s"] == pytest.approx(15e-6) and not fence["record"]
    assert graph.edges["allgather/b5/r2", "fence/b5/r2"]["why"] == "data"
    assert graph.edges["d2h/b2/r2", "h2d/b5/r2"]["why"] == "buffer"
    assert not graph.has_edge("d2h/b4/r2", "h2d/b5/r2") or \
        graph.edges["d2h/b4/r2", "h2d/b5/r2"]["why"] == "order"
    # no fence where the all-gather already orders the write-back, or with one rank
    for lay in (Layout(pertp=1, ddp=8, slices=8, prefetch=2), Layout(pertp=1, ddp=1, slices=1,
                                                                     prefetch=2)):
        costs = costs_for(load_profile("dgx-a100-80gb"), lay)
        assert costs.fence_s == 0.0, lay.label()


def test_fence_is_simulated_waits_for_every_rank_and_is_no_span():
    """A slow h2d on one rank holds every rank's write-back of that block through the
    fence collective (latency allreduce_small_us), and the fence leaves no span."""
    costs = costs_for(fixture("node4-nvswitch"), Layout(pertp=1, ddp=4, slices=1, prefetch=2),
                      model="tiny-opt", batch=8, seq=64)
    result = simulate(build_step_graph(costs))
    assert not any(s.kind == "fence" for s in result.spans)
    times = result.times
    for b in range(4):
        ready = max(times[f"h2d/b{b}/r{m}"][1] for m in range(4))
        start, end = times[f"fence/b{b}/r0"]
        assert start == pytest.approx(ready) and end == pytest.approx(ready + 20e-6)
        assert all(times[f"d2h/b{b}/r{m}"][0] >= end - 1e-12 for m in range(4))


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
        _check_invariants(costs, profile, f"{name} {layout.label()}")


def _check_invariants(costs, profile, label: str):
    """Simulate the step of `costs`: within its bounds, no lane overlap, every
    dependency kept, the link bytes as counted; returns the result."""
    graph = build_step_graph(costs)
    result = simulate(graph)
    bounds = step_bounds(costs)
    assert bounds.lower_bound_s <= result.step_time_s * (1 + 1e-9), label
    assert result.step_time_s <= bounds.serial_s * (1 + 1e-9), label
    _check_no_overlap(result.spans, serial=profile.is_cpu, label=label)
    _check_dependencies(graph, result, label)
    expected = link_bytes(costs)
    for link, moved in result.link_bytes.items():
        assert moved == pytest.approx(expected[link], rel=1e-9, abs=1e-3), f"{label} {link}"
    return result


def _patterns(blocks: int):
    yield ()                                              # every block offloaded
    yield tuple(b % 2 == 0 for b in range(blocks))          # every other one resident
    yield tuple(b < 3 for b in range(blocks))               # a run, then offloaded
    yield (True,) * blocks                                  # every block resident


@pytest.mark.parametrize("name,gpus", CASES)
def test_invariants_hold_with_resident_blocks_and_the_update_on_the_slice(name, gpus):
    """Placement (StepCosts.resident) and slice_update: the same invariants, and a
    resident block moves no byte over PCIe (link_bytes matches what was simulated)."""
    profile = _profile(name)
    model = "opt-125m" if profile.is_cpu else "opt-1.3b"
    most = max(s for s in (1, 2, 4, 8) if gpus % s == 0 and s <= profile.max_slices(gpus))
    for slices, su, prefetch in ((1, False, 1), (most, False, 2), (most, True, 2)):
        layout = Layout(pertp=2, ddp=gpus // 2, slices=slices, prefetch=prefetch,
                        slice_update=su)
        for resident in _patterns(get_model(model).num_layers):
            costs = step_costs(model=get_model(model), profile=profile, layout=layout,
                               workload=Workload(batch=16, seq=128,
                                                 param_dtype="fp32" if profile.is_cpu else "fp16",
                                                 compute_dtype="fp32" if profile.is_cpu else "fp16"),
                               resident=resident)
            label = f"{name} {layout.label()} resident {sum(resident)}"
            result = _check_invariants(costs, profile, label)
            kinds = {s.kind for s in result.spans}
            assert ("slice_update" in kinds) == (su and slices > 1), label
            if resident and all(resident):
                assert not kinds & {"h2d", "d2h"}, label


def _check_no_overlap(spans, *, serial: bool, label: str):
    lanes = {}
    for span in spans:
        lanes.setdefault((span.rank, "all" if serial else span.lane), []).append(span)
    for key, items in lanes.items():
        items.sort(key=lambda s: (s.start_s, s.end_s))
        for a, b in zip(items, items[1:]):
            assert b.start_s >= a.end_s - 1e-12, f"{label}: {a.name} overlaps {b.name} on {key}"


def _check_dependencies(graph, result, label):
    recorded = [n for n, record in graph.nodes(data="record") if record]
    assert sorted(s.name for s in result.spans) == sorted(recorded)
    times = result.times
    assert len(times) == graph.number_of_nodes()
    for u, v, why in graph.edges(data="why"):
        assert times[u][1] <= times[v][0] + 1e-12, f"{label}: {why} {u} -> {v}"
    assert list(graph.edge_values("why")) == graph.edges(data="why")   # what the simulator reads


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
    times = {s: simulate(build_step_graph(costs_for(   # master: the uploads, not the
        profile, Layout(pertp=1, ddp=8, slices=s, prefetch=3), update="master"))  # rounding
    ).step_time_s for s in (1, 8)}
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

    hw, model = _measured_cpu(), get_model("tiny-opt")
    wl = Workload(batch=8, seq=64, param_dtype="fp32", compute_dtype="fp32")
    t = task_times(model=model, profile=hw, workload=wl, tokens=512, streams=2, local_ranks=1)
    busiest, chunks = z_makespan(model.block_tensor_numels(), 4)   # 4 cores, one rank
    z = 400e-6 + chunks * 20e-6 + busiest * 5e-9
    passes = model.block_params * 0.3e-9
    assert t["update_s"] == pytest.approx(2 * (z + passes))
    one = forward_time_s(hw, flops=512 * model.block_gemm_flops_per_token(),
                            attn_flops=512 * model.block_attn_flops_per_token(64),
                            elems=512 * model.block_elems_per_token(),
                            weight_bytes=model.block_params * 4, tokens=512)
    assert t["forward_s"] == pytest.approx(2 * one + passes)
    # attention and element-wise work are priced on their own
    assert one > forward_time_s(hw, flops=512 * model.block_gemm_flops_per_token(),
                                   weight_bytes=model.block_params * 4, tokens=512)
    # 4 ranks of one thread: no thread pool, the whole block on one thread, 1.25x faster
    t4 = task_times(model=model, profile=hw, workload=wl, tokens=512, streams=1, local_ranks=4)
    z4 = len(model.block_tensor_numels()) * 20e-6 + model.block_params * 5e-9 / 1.25
    assert t4["update_s"] == pytest.approx(2 * (z4 + pass_time_s(hw, model.block_params, 4)))


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


# ---- the GPU cost model ------------------------------------------------------------------
A100_HBM = 2039e9 * 0.85   # dgx-a100-80gb device.hbm_gbps x hbm_fraction (achieved)
A100_Z = 0.0038e-9, 10e-6   # compute.z_ns_per_elem (device), z_launch_us (host), in s


def test_gpu_gemm_rate_follows_the_precision():
    """fp16 and bf16 GEMMs at peak_tflops, fp32 at tf32_tflops with TF32 allowed and at
    fp32_tflops without (~1/15 of 16-bit: the executor never enables TF32 unless told),
    each at m / (m + m_half_tokens)."""
    hw, model = load_profile("dgx-a100-80gb"), get_model("opt-13b")
    flops, eff = 4096 * model.block_gemm_flops_per_token(), 4096 / (4096 + 256)
    for dtype, tf32, rate in (("fp16", True, 271), ("bf16", False, 271),
                              ("fp32", True, 135.5), ("fp32", False, 18.07)):
        t = forward_time_s(hw, flops=flops, weight_bytes=0, tokens=4096, compute_dtype=dtype,
                              tf32=tf32)
        assert t == pytest.approx(flops / (rate * 1e12 * eff)), (dtype, tf32)
    assert forward_issue_s(hw) == pytest.approx(100e-6)   # the layer call: host time
    slow = Workload(batch=16, seq=256, param_dtype="fp32", compute_dtype="fp32", tf32=False)
    fast = Workload(batch=16, seq=256, param_dtype="fp16", compute_dtype="fp16")
    t = {w.compute_dtype: task_times(model=model, profile=hw, workload=w, tokens=4096,
                                     streams=2, local_ranks=1) for w in (slow, fast)}
    assert t["fp32"]["forward_s"] > 10 * t["fp16"]["forward_s"]


def test_gpu_attention_and_elementwise_work_cost_hbm_time():
    """Element-wise outputs move 2 words each at HBM bandwidth; attention costs its
    FLOPs at the GEMM rate or its bytes at HBM bandwidth, whichever is longer; a causal
    kernel computes half of the scores (CAUSAL_ATTN_SHARE); the GEMMs' biases are
    added in the GEMM's epilogue, not by kernels of their own (gpu_elems_per_token)."""
    hw = load_profile("dgx-a100-80gb")
    base = forward_time_s(hw, flops=1e12, weight_bytes=0, tokens=2048, compute_dtype="fp16")
    elems = forward_time_s(hw, flops=1e12, weight_bytes=0, tokens=2048, elems=1e9,
                              compute_dtype="fp16")
    assert elems - base == pytest.approx(1e9 * 2 * 2 / A100_HBM)
    attn = forward_time_s(hw, flops=1e12, weight_bytes=0, tokens=2048, attn_flops=1e6,
                             attn_bytes=4e9, compute_dtype="fp16")
    assert attn - base == pytest.approx(4e9 / A100_HBM)
    causal = forward_time_s(hw, flops=1e12, weight_bytes=0, tokens=2048, attn_flops=1e15,
                            compute_dtype="fp16")
    rate = gemm_tflops(hw, "fp16") * 1e12 * 2048 / (2048 + hw.figures().compute.m_half_tokens)
    assert causal - base == pytest.approx(0.5e15 / rate)
    model = get_model("opt-1.3b")   # through the task: the element-wise bytes are in it
    wl = Workload(batch=8, seq=256, param_dtype="fp16", compute_dtype="fp16", update="plain")
    fwd = task_times(model=model, profile=hw, workload=wl, tokens=2048, streams=1,
                     local_ranks=1)["forward_s"]
    gemm_only = forward_time_s(hw, flops=2048 * model.block_gemm_flops_per_token(),
                                  weight_bytes=0, tokens=2048, compute_dtype="fp16")
    assert fwd - gemm_only >= 2048 * gpu_elems_per_token(model) * 4 / A100_HBM
    h = model.hidden   # OPT: 2 LayerNorms, 2 residual adds, ReLU (4h), scaling, transpose
    assert gpu_elems_per_token(model) == 2 * h + 2 * h + 4 * h + h + h
    llama = get_model("llama-2-7b")   # no biases: every element-wise output is a kernel's
    assert gpu_elems_per_token(llama) == llama.block_elems_per_token()


def test_gpu_z_and_update_modes_follow_the_precision_table():
    """z: a cost per element on the device (arithmetic-bound), a launch per chunk on
    the host; the passes by their bytes at the achieved HBM speed (docs/precision.md): plain 16-bit update + perturb, master fp32 update and a
    perturb pass reading fp32 and writing 16 bits, stochastic the fp32 update per chunk
    with its noise and rounding kernels."""
    hw, model = load_profile("dgx-a100-80gb"), get_model("opt-1.3b")
    numels, n = model.block_tensor_numels(), model.block_params
    z = n * A100_Z[0]
    assert gpu_z_time_s(hw, numels) == pytest.approx(z)
    assert z_issue_s(hw, numels) == pytest.approx(len(numels) * A100_Z[1])
    t = {}
    for update, param in (("plain", "fp16"), ("stochastic", "fp16"), ("master", "fp32")):
        wl = Workload(batch=8, seq=256, param_dtype=param, compute_dtype="fp16", update=update)
        t[update] = task_times(model=model, profile=hw, workload=wl, tokens=1024, streams=2,
                               local_ranks=1)
    assert t["plain"]["update_s"] == pytest.approx(2 * z + (6 + 6) * n / A100_HBM)
    assert t["master"]["update_s"] == pytest.approx(2 * z + (10 + 8) * n / A100_HBM)
    # noise launch + 5 kernels a chunk (host), the noise written (4 bytes an element at
    # HBM speed: a uniform draw, no Box-Muller), 42 bytes per element
    rounding = 4 * n / A100_HBM + 42 * n / A100_HBM
    assert sr_chunks(numels, "cuda") >= len(numels)   # its launches: host time
    assert t["stochastic"]["update_s"] == pytest.approx(2 * z + rounding + 6 * n / A100_HBM)
    # the second stream's perturbation pass is in the forward task
    assert t["master"]["forward_s"] - t["plain"]["forward_s"] == pytest.approx(2 * n / A100_HBM)


def test_cpu_update_task_is_priced_as_before_and_stochastic_above_it():
    """The CPU's master update stays 2 x (z + pass); stochastic (bf16 on a CPU) replaces
    the update pass by its noise (one thread, chunk by chunk) and 42/12 passes of
    rounding; a profile without the z model prices it at twice the task."""
    hw, model = _measured_cpu(), get_model("tiny-opt")
    numels, n = model.block_tensor_numels(), model.block_params
    master = Workload(batch=8, seq=64, param_dtype="fp32", compute_dtype="fp32")
    stoch = Workload.for_update(batch=8, seq=64, compute_dtype="bf16", update="stochastic")
    tm, ts = (task_times(model=model, profile=hw, workload=w, tokens=512, streams=2,
                         local_ranks=1) for w in (master, stoch))
    z, one = cpu_z_time_s(hw, numels, 1), pass_time_s(hw, n, 1)
    assert tm["update_s"] == 2 * (z + one)
    noise = sr_chunks(numels, "cpu") * 20e-6 + n * 5e-9
    assert ts["update_s"] == pytest.approx(2 * z + noise + 42 / 12 * one + one)
    plain = fixture("cpu4")
    tm, ts = (task_times(model=model, profile=plain, workload=w, tokens=512, streams=2,
                         local_ranks=1) for w in (master, stoch))
    assert ts["update_s"] == pytest.approx(2 * tm["update_s"])


def test_duplex_lowers_each_direction_while_the_other_runs():
    """Link 0 (H2D) and link 1 (D2H), 25 B/s each alone; while both carry a flow H2D
    gets 12 and D2H 24 (the A100's measured split). 48 B of D2H end at 2 s; H2D has
    moved 24 of its 100 B by then and moves the other 76 alone at 25: 5.04 s."""
    from zoplan.sim.simulate import link_components

    env = simpy.Environment()
    net = FairShareNetwork(env, [25.0, 25.0], link_components(2, [(0, 1)]),
                           {0: (1, 12.0), 1: (0, 24.0)})
    ends = {}

    def proc(name, size, link):
        yield net.transfer([(size, (link,), math.inf)])
        ends[name] = env.now
    env.process(proc("h2d", 100.0, 0))
    env.process(proc("d2h", 48.0, 1))
    env.run()
    assert ends == pytest.approx({"h2d": 2.0 + 76 / 25, "d2h": 2.0})
    assert run_flows([25.0], [(0.0, 100.0, (0,), math.inf)]) == pytest.approx([4.0])


def test_contended_links_of_a_dgx_a100():
    """Each GPU's PCIe link and each switch uplink drop to the duplex figures while the
    opposite direction is busy; a CPU profile has none (a rank copies one way at a time)."""
    from zoplan.sim.links import contended_links, node_links

    hw = load_profile("dgx-a100-80gb")
    links = node_links(hw, 8)
    contended = contended_links(hw, links)
    assert contended["pcie.h2d/3"] == ("pcie.d2h/3", 12e9)
    assert contended["pcie.d2h/3"] == ("pcie.h2d/3", 24e9)
    assert contended["pcie.uplink_h2d/1"] == ("pcie.uplink_d2h/1", 12e9)
    assert links["pcie.duplex/0"] == 36e9
    assert contended_links(fixture("cpu4"), node_links(fixture("cpu4"), 4)) == {}


def test_zo2_baseline_draws_z_four_times_per_block():
    """ZO2 perturbs +eps, -2eps, +eps (restore) in place and updates, a z draw each;
    zoexec draws twice and builds the perturbed weights out of place. The search's ZO2
    baseline prices ZO2's schedule."""
    from zoplan.search.evaluate import zo2_baseline
    from zoplan.search.space import resolve_request

    hw, model = load_profile("dgx-a100-80gb"), get_model("opt-1.3b")
    numels, n = model.block_tensor_numels(), model.block_params
    z = gpu_z_time_s(hw, numels)
    wl = Workload(batch=16, seq=256, param_dtype="fp16", compute_dtype="fp16", update="plain")
    lay = Layout(pertp=1, ddp=1, slices=1, prefetch=2)
    ours = step_costs(model=model, profile=hw, workload=wl, layout=lay)
    zo2 = step_costs(model=model, profile=hw, workload=wl, layout=lay, schedule="zo2")
    assert ours.update_s == pytest.approx(2 * z + 12 * n / A100_HBM)
    assert zo2.update_s == pytest.approx(4 * z + (6 + 3 * 6) * n / A100_HBM)
    assert zo2.forward_s == pytest.approx(ours.forward_s - 6 * n / A100_HBM)
    req = resolve_request(model="opt-1.3b", gpus=8, profile="dgx-a100-80gb", batch=16,
                          seq=256, update="plain")
    cand = zo2_baseline(req, req.workload)
    assert cand.costs.update_s == pytest.approx(zo2.update_s)
    assert cand.step_time_s >= cand.bounds.lower_bound_s * (1 - 1e-9)


def test_duplex_pair_bound_and_a_pcie_bound_layout():
    """Both directions of a contending link need at least the least of running apart and
    overlapping as much as they can: 1.81 GB each way at 25 alone, 12 / 24 together:
    75 ms of overlap, then the rest of H2D alone (111 ms). A layout bound by them is
    simulated within 2% of that bound."""
    from zoplan.sim.bounds import duplex_pair_s

    t = duplex_pair_s(1.81e9, 1.81e9, alone=(25e9, 25e9), contended=(12e9, 24e9))
    assert t == pytest.approx(1.81e9 / 24e9 + (1.81e9 - 12e9 * 1.81e9 / 24e9) / 25e9)
    # directions that hurt each other more than they gain run apart
    assert duplex_pair_s(1.0, 1.0, alone=(2.0, 2.0), contended=(0.5, 0.5)) == pytest.approx(1.0)
    costs = costs_for(load_profile("dgx-a100-80gb"), Layout(pertp=2, ddp=4, slices=8, prefetch=3),
                      model="opt-30b", update="master")
    bounds = step_bounds(costs)
    sim = simulate(build_step_graph(costs), record_spans=False)
    assert bounds.binding == "pcie.uplink_duplex"
    assert bounds.lower_bound_s <= sim.step_time_s <= 1.02 * bounds.lower_bound_s
