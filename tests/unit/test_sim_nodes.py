"""Many nodes: the slowest node's pace, scaling efficiency, the node sweep, the compact
rank table, 65,536 GPUs, what DDP buys, and fewer devices than given.

- E[max of N normals] (Blom) against the exact integral; the job's step is one node's
  times 1 + spread x E[max]; the spread is the profile's (or the default);
- the plan's scaling efficiency is one node's step over the job's; --sweep-nodes prints
  throughput against node count;
- the plan stores the rank table as a rule (its size does not grow with the ranks), and
  Plan.ranks / Plan.rank_row still give every row; version 1 plans still load;
- 65,536 GPUs plan in a few seconds into a file under 1 MB;
- the plan and the report say what ZO-DDP buys;
- --gpus is the most a plan may use: fewer when faster, said plainly; CPU ranks are
  called so; the shipped cpu profile warns that it is a guess.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from statistics import NormalDist

import pytest
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile, shipped_profiles
from zoplan.layout import Layout
from zoplan.plan import Plan
from zoplan.pricing.stragglers import (
    DEFAULT_NODE_SPREAD,
    expected_max_normal,
    node_spread,
    straggler_factor,
)
from zoplan.search import build_plan, resolve_request, search
from zoplan.search.space import world_sizes
from zoplan.sim.nodes import job_step_s, sweep_counts

DGX = load_profile("dgx-a100-80gb")
NODE4 = str(Path(__file__).resolve().parents[1] / "fixtures" / "node4-nvswitch.json")
runner = CliRunner()


def exact_expected_max(n: int) -> float:
    """The integral of x n phi(x) Phi(x)^(n-1) (midpoint rule, fine enough for 1e-4)."""
    dist, h = NormalDist(), 1e-3
    xs = [-9 + (i + 0.5) * h for i in range(int(18 / h))]
    return sum(x * n * dist.pdf(x) * dist.cdf(x) ** (n - 1) for x in xs) * h


@pytest.mark.parametrize("n,tolerance", [(2, 0.05), (3, 0.03), (8, 0.01), (64, 0.01),
                                         (1024, 0.01), (8192, 0.01)])
def test_the_expected_slowest_node_is_within_the_stated_error(n, tolerance):
    exact = exact_expected_max(n)
    assert expected_max_normal(n) == pytest.approx(exact, rel=tolerance)
    assert expected_max_normal(n) < math.sqrt(2 * math.log(n)) or n == 2


def test_one_node_waits_for_nobody_and_more_nodes_wait_longer():
    assert expected_max_normal(1) == 0.0 and straggler_factor(DGX, 1) == 1.0
    factors = [straggler_factor(DGX, n) for n in (2, 8, 128, 8192)]
    assert factors == sorted(factors) and factors[0] > 1
    core = node_spread(DGX) * expected_max_normal(8192)
    tail = 1 - (1 - DGX.figures().compute.slow_node_fraction) ** 8191   # another node is a slow one
    assert job_step_s(DGX, 8192, 2.0) == pytest.approx(
        2.0 * (1 + (1 - tail) * core + tail * max(DGX.figures().compute.slow_node_penalty, core)))


def test_the_spread_comes_from_the_profile_else_the_default():
    data = json.loads(shipped_profiles()["dgx-a100-80gb"].read_text())
    data["compute"]["node_spread"] = 0.05
    wide = HardwareProfile.from_dict(data)
    assert straggler_factor(wide, 1024) - 1 == pytest.approx(0.05 * expected_max_normal(1024))
    del data["compute"]["node_spread"], data["sources"]["compute.node_spread"]
    assert node_spread(HardwareProfile.from_dict(data)) == DEFAULT_NODE_SPREAD


@pytest.fixture(scope="module")
def plan_1024() -> Plan:
    """1,024 GPUs: 256 nodes of the 4-GPU fixture profile (--ddp fixes the world)."""
    return build_plan(search(resolve_request(model="tiny-opt", gpus=1024, profile=NODE4,
                                             batch=1024, seq=64, ddp=512)))


def test_the_job_step_is_the_node_step_at_the_slowest_nodes_pace(plan_1024):
    p, s = plan_1024.data["predicted"], plan_1024.data["scaling"]
    nodes, profile = plan_1024.layout.nodes, load_profile(NODE4)
    assert nodes == 256
    assert p["step_time_s"] == pytest.approx(job_step_s(profile, nodes, p["node_step_s"]),
                                             rel=1e-6)
    assert p["straggler_s"] == pytest.approx(p["step_time_s"] - p["node_step_s"], abs=2e-9)
    one = p["node_step_s"] - p["internode_allreduce_s"]
    assert s["one_node_step_s"] == pytest.approx(one, abs=2e-9)
    assert s["efficiency"] == pytest.approx(one / p["step_time_s"], rel=1e-5)
    rows = {r["nodes"]: r for r in s["sweep"]}
    assert set(rows) == set(sweep_counts(nodes)) and rows[1]["efficiency"] == 1.0
    assert rows[nodes]["step_time_s"] == pytest.approx(p["step_time_s"], rel=1e-6)
    effs = [rows[n]["efficiency"] for n in sorted(rows)]
    assert effs == sorted(effs, reverse=True)
    # tokens/s grows with the nodes, by less than their number
    assert rows[nodes]["tokens_per_s"] == pytest.approx(
        nodes * rows[1]["tokens_per_s"] * rows[nodes]["efficiency"], rel=1e-5)


def test_sweep_nodes_prints_throughput_against_node_count(tmp_path):
    out = tmp_path / "p.json"
    args = ["optimize", "--model", "tiny-opt", "--gpus", "32", "--ddp", "16", "--batch", "32",
            "--seq", "64", "--profile", NODE4, "-o", str(out)]
    result = runner.invoke(app, [*args, "--sweep-nodes"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "throughput against node count" in result.output
    plan = Plan.load(out)
    for row in plan.data["scaling"]["sweep"]:
        assert f"{row['efficiency']:.1%}" in result.output
    assert "8 nodes: scaling efficiency" in " ".join(result.output.split())
    plain = runner.invoke(app, args, terminal_width=200)
    assert "throughput against node count" not in plain.output


# ---- the rank table ---------------------------------------------------------------------
def test_the_rank_table_is_a_rule_and_every_row_is_still_there(plan_1024):
    assert plan_1024.data["ranks"] == {"rule": "layout", "exceptions": []}
    table = plan_1024.layout.rank_table()
    assert plan_1024.ranks == table
    for r in (0, 7, 8, 513, 1023):
        assert plan_1024.rank_row(r) == table[r]
    with pytest.raises(ZoError, match="rank 1024"):
        plan_1024.rank_row(1024)


def test_a_version_1_plan_with_the_whole_table_still_loads(plan_1024):
    data = copy.deepcopy(plan_1024.data)
    data["schema_version"], data["ranks"] = 1, plan_1024.layout.rank_table()
    old = Plan.from_dict(data, origin="old.json")
    assert old.rank_row(1023) == plan_1024.rank_row(1023)
    data["ranks"][5] = {**data["ranks"][5], "node": 99}
    with pytest.raises(ZoError, match="the rank table does not match layout"):
        Plan.from_dict(data, origin="old.json")


def test_rank_exceptions_are_refused_in_this_version(plan_1024):
    data = copy.deepcopy(plan_1024.data)
    data["ranks"]["exceptions"] = [{"rank": 3, "node": 1}]
    with pytest.raises(ZoError, match="ranks.exceptions must be empty"):
        Plan.from_dict(data, origin="x.json")


def test_65536_gpus_plan_into_a_small_file(tmp_path):
    """65,536 GPUs plan into a file under 1 MB with the rank table as a rule (how fast:
    benchmarks/planner/bench_search.py measures it; a timed assertion here would only measure
    how loaded the test machine is)."""
    out = tmp_path / "big.json"
    result = runner.invoke(app, ["optimize", "--model", "opt-175b", "--gpus", "65536",
                                 "--batch", "65536", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size < 1_000_000
    plan = Plan.load(out)
    assert plan.layout.world_size == 65536 and plan.layout.nodes == 8192
    assert plan.rank_row(65535)["node"] == 8191


# ---- what DDP buys -------------------------------------------------------------------------
def test_the_plan_and_report_say_ddp_raises_the_batch_not_the_perturbations(tmp_path):
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["optimize", "--model", "tiny-opt", "--gpus", "8", "--ddp", "4",
                                 "--batch", "16", "--seq", "64", "--profile", NODE4, "-o",
                                 str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    assert plan.layout.ddp > 1
    note = plan.data["notes"]["ddp"]
    assert note.startswith("ZO-DDP raises the batch per perturbation, not the number of "
                           "perturbations")
    assert "raises the batch per perturbation, not the number of perturbations" in " ".join(
        result.output.split())


# ---- fewer devices than given; CPU ranks ----------------------------------------------------
def test_the_search_considers_fewer_devices():
    assert world_sizes(DGX, 4) == ((4, 1), (3, 1), (2, 1), (1, 1))
    assert world_sizes(DGX, 48) == ((48, 6), (32, 4), (16, 2), (8, 1), (4, 1), (2, 1), (1, 1))
    req = resolve_request(model="opt-1.3b", gpus=8, profile=None, batch=16, seq=256, ddp=4)
    assert req.world_sizes == ((8, 1),)   # --ddp fixes the world


def test_two_cpu_ranks_never_report_a_winner_slower_than_one(tmp_path):
    """The trial of issue 14: tiny-opt on 2 CPU ranks of the cpu profile planned a
    winner slower than 1 rank; the search now picks 1 rank when that is faster, and
    says so, calls the devices CPU ranks, and warns that the profile is a guess."""
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["optimize", "--model", "tiny-opt", "--gpus", "2", "--profile",
                                 "cpu", "-o", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    plan, text = Plan.load(out), " ".join(result.output.split())
    step = plan.data["predicted"]["step_time_s"]
    one_rank = [c for c in plan.data["candidates"] if c["layout"]["ddp"] * c["layout"]["pertp"] == 1]
    assert one_rank and step <= min(c["step_time_s"] for c in one_rank)
    assert step <= plan.data["baselines"]["zo2"]["step_time_s"]
    assert not re.search(r"winner is [\d.]+x slower", text)
    assert plan.layout.world_size == 1 and "uses 1 of the 2 CPU ranks given" in text
    assert "GPU" not in text.replace("GPUs", "GPU")   # CPU ranks, not GPUs
    assert "rank memory" in text and "CPU rank" in text
    assert "warning: profile 'cpu' is a rough guess" in text and "zoplan profile" in text


def test_a_measured_or_gpu_profile_gives_no_warning(tmp_path):
    data = json.loads(shipped_profiles()["cpu"].read_text())
    data["compute"]["peak_tflops"] *= 1.01   # not the shipped figures: a measured profile
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    for profile in (str(path), "dgx-a100-80gb"):
        result = runner.invoke(app, ["optimize", "--model", "tiny-opt", "--gpus", "1", "--profile",
                                     profile, "-q", "-o", str(tmp_path / "p.json")])
        assert result.exit_code == 0, result.output
        assert "rough guess" not in result.output
    assert Layout(pertp=1, ddp=1).world_size == 1
