"""zoplan.sim.bounds computes per-rank figures once where ranks share their inputs: the
all-gather alone once per slice group, the host lane once per slice-update issue. Both
give every rank what the per-rank computation gives, on layouts of every slice group
and slice update, GPU and CPU profiles, and ranks whose figures differ on purpose."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from zoplan.hardware import load_profile
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.sim.bounds import _host_lanes, _ranks_alone, host_lane_s
from zoplan.sim.costs import step_costs
from zoplan.workload import Workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WL = Workload(batch=16, seq=512, param_dtype="fp16", compute_dtype="fp16", update="stochastic")
CPU_WL = Workload(batch=16, seq=128, param_dtype="fp32", compute_dtype="fp32", update="master")


def _cases():
    """StepCosts of every slice group / slice update on a few node types, and the same
    with each rank's slice-update issue and all-gather bytes made different."""
    for name, workload in (("dgx-a100-80gb", WL), ("8x-rtx4090", WL),
                           ("8x-a100-pcie-nvlink-pairs", WL),
                           (str(FIXTURES / "cpu4.json"), CPU_WL)):
        profile = load_profile(name)
        local = profile.gpus_per_node
        for slices, su in itertools.product((1, 2, 4, 8), (False, True)):
            if local % slices or (su and slices == 1):
                continue
            layout = Layout(ddp=local, slices=slices, slice_update=su)
            costs = step_costs(model=get_model("opt-1.3b"), profile=profile,
                               workload=workload, layout=layout)
            yield costs
            yield _uneven(costs)


def _uneven(costs):
    """`costs` with rank lr's slice issue and all-gather bytes scaled by (1 + lr / 10)."""
    issue = dict(costs.issue_s)
    if issue.get("slice_update"):
        issue["slice_update"] = tuple(s * (1 + lr / 10)
                                      for lr, s in enumerate(issue["slice_update"]))
    gathers = tuple(tuple(dataclasses.replace(f, num_bytes=f.num_bytes * (1 + lr / 10))
                          for f in flows) for lr, flows in enumerate(costs.allgather))
    return dataclasses.replace(costs, issue_s=issue, allgather=gathers)


@pytest.mark.parametrize("costs", list(_cases()), ids=lambda c: c.layout.label())
def test_per_rank_shortcuts_equal_the_per_rank_computation(costs):
    ranks = range(costs.local_ranks)
    assert _ranks_alone(costs) == [
        {"h2d": costs.alone_s(costs.h2d[lr]), "d2h": costs.alone_s(costs.d2h[lr]),
         "allgather": costs.allgather_alone_s(lr)} for lr in ranks]
    assert _host_lanes(costs, costs.num_blocks) == [host_lane_s(costs, lr, costs.num_blocks)
                                                    for lr in ranks]


@pytest.mark.parametrize("costs", list(_cases()), ids=lambda c: c.layout.label())
def test_a_flows_rates_are_the_least_of_its_cap_and_its_links(costs):
    """flow_rate_alone / flow_rate_worst (loops) against min() over the same figures."""
    for flows in costs.h2d + costs.d2h + costs.allgather:
        for f in flows:
            assert costs.flow_rate_alone(f) == min([f.cap_Bps] + [costs.links[n] for n in f.route])
            worst = [costs.contended[n][1] if n in costs.contended else costs.links[n]
                     for n in f.route]
            assert costs.flow_rate_worst(f) == min([f.cap_Bps] + worst)
