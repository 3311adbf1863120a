"""Per-block placement (resident shards or offloaded) and the update on the slice, in
the memory model, the task graph and the search.

- the resident pattern: the most blocks that fit, spread among the offloaded ones, with
  a short period; the capacity is what the device has left (fp32 masters: half the blocks);
- a resident block moves nothing over PCIe and has no h2d, d2h or fence;
- the update on the slice draws z for 1 + 1/k of a block per step and rank, exactly the
  chunks zoexec draws (zoplan.execrules.z_range_draws), on the lane zoplan.trace gives;
- the search keeps blocks resident on a DGX A100 for OPT-175B (>= 1.5x the best
  all-offloaded plan, both in the plan and the report), --placement host keeps none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.execrules import z_chunk
from zoplan.hardware import load_profile
from zoplan.layout import Layout
from zoplan.memory import rank_memory, resident_shard_bytes, store_stride
from zoplan.models import get_model
from zoplan.plan import Plan
from zoplan.pricing.memory import estimate_memory, resident_capacity, resident_margin_bytes
from zoplan.search import resolve_request, search
from zoplan.search.placement import MAX_PERIOD, resident_pattern
from zoplan.sim.bounds import link_bytes, step_bounds
from zoplan.sim.costs import slice_z_numels, step_costs
from zoplan.sim.graph import build_step_graph
from zoplan.sim.simulate import simulate
from zoplan.trace import KIND_LANE
from zoplan.workload import Workload

DGX = load_profile("dgx-a100-80gb")
OPT175 = get_model("opt-175b")


def _workload(update: str, *, batch: int = 16, seq: int = 256) -> Workload:
    return Workload.for_update(batch=batch, seq=seq, compute_dtype="fp16", update=update)


# ---- which blocks, how many --------------------------------------------------------
@pytest.mark.parametrize("blocks,capacity", [(96, 96), (96, 200), (10, 5), (24, 7), (96, 50),
                                             (7, 1), (12, 11)])
def test_the_pattern_is_the_most_that_fit_spread_and_periodic(blocks, capacity):
    pattern, period = resident_pattern(blocks, capacity)
    count = sum(pattern)
    assert count <= capacity and len(pattern) == blocks
    assert pattern[0], "a resident first block lets the step start without an upload"
    assert 1 <= period <= MAX_PERIOD
    assert all(pattern[b] == pattern[b % period] for b in range(blocks))
    # spread: the scarcer kind never comes two in a row
    marks = "".join("r" if r else "." for r in pattern)
    scarce = "rr" if 2 * count <= blocks else ".."
    assert scarce not in marks + marks[:1], marks
    # r in q with q <= MAX_PERIOD: the fractions are at most 1/MAX_PERIOD apart
    assert count == blocks if capacity >= blocks else count >= capacity - blocks / MAX_PERIOD - 1


def test_nothing_resident_when_not_one_block_fits():
    assert resident_pattern(96, 0) == ((), 1)


@pytest.mark.parametrize("update", ["master", "stochastic", "plain"])
def test_capacity_is_the_device_left_over_in_the_stored_precision(update):
    """Shards of stride / slices elements in the stored dtype (fp32 masters: twice the
    16-bit bytes) fill what buffers, activations and the margin leave, and no more."""
    layout = Layout(pertp=2, ddp=4, slices=8, prefetch=2, slice_update=True)
    wl = _workload(update)
    base = estimate_memory(model=OPT175, profile=DGX, workload=wl, layout=layout)
    count = resident_capacity(model=OPT175, profile=DGX, workload=wl, layout=layout, base=base)
    shard = resident_shard_bytes(OPT175, wl, layout)
    stride = store_stride(OPT175.block_params, slices=8, local_ranks=8)
    assert shard == stride // 8 * (4 if update == "master" else 2)
    room = base.gpu_limit_bytes - resident_margin_bytes(DGX)

    def peak(blocks: int) -> float:
        return estimate_memory(model=OPT175, profile=DGX, workload=wl, layout=layout,
                               resident_blocks=blocks).gpu_bytes
    assert peak(count) <= room and (count == 96 or peak(count + 1) > room)
    assert peak(count) - peak(count - 1) == shard   # past the set-up's module copies
    if update == "master":
        assert 0 < count < 96   # fp32 masters: not every block fits
    else:
        assert count == 96


def test_the_memory_model_counts_one_shard_per_resident_block():
    layout = Layout(pertp=2, ddp=4, slices=8, prefetch=2)
    wl = _workload("stochastic")
    one = rank_memory(model=OPT175, workload=wl, layout=layout, device_kind="cuda")
    ten = rank_memory(model=OPT175, workload=wl, layout=layout, device_kind="cuda",
                      resident_blocks=10)
    assert ten.steady_bytes - one.steady_bytes == 10 * resident_shard_bytes(OPT175, wl, layout)
    with pytest.raises(ValueError, match="resident_blocks must be 0..96"):
        rank_memory(model=OPT175, workload=wl, layout=layout, device_kind="cuda",
                    resident_blocks=97)


# ---- the graph ---------------------------------------------------------------------
def _costs(layout: Layout, resident=(), *, model=OPT175, profile=DGX, update="stochastic"):
    return step_costs(model=model, profile=profile, workload=_workload(update), layout=layout,
                      resident=resident)


def test_resident_blocks_move_nothing_over_pcie_and_have_no_copies():
    layout = Layout(pertp=2, ddp=4, slices=8, prefetch=2)
    half = tuple(b % 2 == 0 for b in range(96))
    offloaded, mixed = _costs(layout), _costs(layout, half)
    pcie = [name for name in offloaded.links if "pcie" in name or "uplink" in name]
    assert pcie, offloaded.links
    for name in pcie:
        assert link_bytes(mixed)[name] == pytest.approx(link_bytes(offloaded)[name] / 2)
    graph = build_step_graph(mixed)
    kinds = {(d["kind"], d["block"]) for _, d in graph.nodes(data=True) if d["rank"] == 0}
    assert ("h2d", 0) not in kinds and ("d2h", 0) not in kinds and ("allgather", 0) in kinds
    assert ("h2d", 1) in kinds and ("d2h", 1) in kinds
    # a buffer is filled by the h2d of an offloaded block or the all-gather of a
    # resident one, and freed by the d2h of an offloaded block or a resident one's forward
    buffer = [(graph.nodes[u], graph.nodes[v]) for u, v, why in graph.edges(data="why")
              if why == "buffer"]
    assert buffer
    for freed, filled in buffer:
        assert freed["kind"] == ("forward" if half[freed["block"]] else "d2h")
        assert filled["kind"] == ("allgather" if half[filled["block"]] else "h2d")
        assert filled["block"] - freed["block"] == layout.prefetch
    sim = simulate(graph, record_spans=True)
    assert step_bounds(mixed).lower_bound_s <= sim.step_time_s * (1 + 1e-9)
    assert sim.step_time_s < simulate(build_step_graph(offloaded)).step_time_s


@pytest.mark.parametrize("device,slices", [("cuda", 8), ("cuda", 2), ("cpu", 4)])
def test_the_update_on_the_slice_draws_z_for_one_plus_one_over_k_of_a_block(device, slices):
    """Per block and rank: the perturbation's z (the whole block) and the slice's
    share of the deferred update, drawn in whole chunks (execrules.z_range_draws): the
    k slices together draw each chunk once, or twice where a slice edge cuts it."""
    model = get_model("opt-13b" if device == "cuda" else "small-opt")
    layout = Layout(pertp=1, ddp=slices, slices=slices, slice_update=True)
    block, chunk = model.block_params, z_chunk(device)
    drawn = [sum(slice_z_numels(model, layout, k, device)) for k in range(slices)]
    assert block <= sum(drawn) <= block + (slices - 1) * chunk
    for k, z in enumerate(drawn):
        share = store_stride(block, slices=slices, local_ranks=slices) // slices
        assert z <= share + 2 * chunk, (k, z, share)
        generations = (block + z) / block   # perturbation + the slice's update
        assert generations <= 1 + 1 / slices + 2 * chunk / block


def test_slice_update_is_a_task_of_its_own_before_the_all_gather_on_the_trace_lane():
    layout = Layout(pertp=2, ddp=4, slices=8, prefetch=2, slice_update=True)
    plain = _costs(Layout(pertp=2, ddp=4, slices=8, prefetch=2))
    split = _costs(layout)
    # the update task keeps only the perturbation; the slice's update is ~1/8 of the
    # deferred update's z and passes
    deferred = plain.update_s - split.update_s
    assert deferred > 0
    assert 0 < split.slice_s(0) < deferred / 8 * 1.5
    graph = build_step_graph(split, num_blocks=3)
    for node, d in graph.nodes(data=True):
        if d["kind"] == "slice_update":
            assert d["lane"] == KIND_LANE["slice_update"]
            gather = f"allgather/b{d['block']}/r{d['rank']}"
            assert graph.has_edge(node, gather)
    spans = simulate(graph, record_spans=True).spans
    assert {s.kind for s in spans} <= set(KIND_LANE)
    assert sum(s.kind == "slice_update" for s in spans) == 3 * 8
    assert simulate(build_step_graph(split)).step_time_s < simulate(
        build_step_graph(plain)).step_time_s


# ---- the search and the report -------------------------------------------------------
@pytest.fixture(scope="module")
def dgx_result():
    req = resolve_request(model="opt-175b", gpus=8, profile="dgx-a100-80gb", batch=16, seq=256)
    return search(req)


def test_opt175b_on_a_dgx_keeps_blocks_resident_and_beats_every_block_offloaded(dgx_result):
    win, off = dgx_result.winner, dgx_result.offloaded
    assert win.num_resident > 0 and off.num_resident == 0
    assert off.step_time_s / win.step_time_s >= 1.5
    assert win.memory.gpu_bytes <= win.memory.gpu_limit_bytes - resident_margin_bytes(DGX)


def test_the_plan_records_each_blocks_placement_and_the_report_both_plans(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["optimize", "--model", "opt-175b", "--gpus", "8",
                                      "--batch", "16", "--seq", "256", "--profile",
                                      "dgx-a100-80gb", "-o", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    resident = plan.resident_blocks
    assert len(resident) == plan.data["predicted"]["resident_blocks"] > 0
    assert plan.data["candidates"][0]["label"].endswith(f" r{len(resident)}")
    off = plan.data["baselines"]["offloaded"]
    assert off["resident_blocks"] == 0
    text = " ".join(result.output.split())
    assert f"best plan with every block offloaded: {off['label']}" in text
    assert "memory headroom" in text and "safety margin" in text
    ratio = off["step_time_s"] / plan.data["predicted"]["step_time_s"]
    assert f"winner is {ratio:.2f}x faster" in text


def test_placement_host_keeps_every_block_offloaded(tmp_path):
    out = tmp_path / "host.json"
    result = CliRunner().invoke(app, ["optimize", "--model", "opt-13b", "--gpus", "8",
                                      "--batch", "16", "--seq", "256", "--profile",
                                      "dgx-a100-80gb", "--placement", "host", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    assert not plan.resident_blocks
    assert all(c["resident_blocks"] == 0 for c in plan.data["candidates"])
    assert plan.data["search"]["fixed"]["placement"] == "host"


def test_an_unknown_placement_is_one_line(tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["optimize", "--model", "tiny-opt", "--gpus", "1",
                                      "--profile", "cpu", "--placement", "gpu", "-o", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "error: --placement must be one of auto, host, got 'gpu'")
    assert not out.exists()


def test_no_docstring_points_outside_the_repository():
    root = Path(__file__).resolve().parents[2] / "zoplan"
    for path in root.rglob("*.py"):
        assert "../shared" not in path.read_text(), path
