"""LoRA in the planner: the workload contract (round trip, full plans' bytes unchanged,
bad settings refused), the step it prices (no d2h, no fence, the zo maths over the
adapters only), its memory (adapters, no z of a block), and `zoplan optimize --tuning`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.hardware import load_profile
from zoplan.layout import Layout
from zoplan.lora import adapter_params, adapter_tensor_numels
from zoplan.memory import rank_memory
from zoplan.models import get_model
from zoplan.plan import Plan
from zoplan.prefix import prefix_params
from zoplan.search.tuning import pcie_bytes_per_step, snapshot_bytes
from zoplan.sim.costs import step_costs
from zoplan.sim.graph import build_step_graph
from zoplan.workload import Workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NODE4 = str(FIXTURES / "node4-nvswitch.json")
LORA = Workload.for_lora(batch=8, seq=64, compute_dtype="fp16")
FULL = Workload.for_update(batch=8, seq=64, compute_dtype="fp16", update="stochastic")


def test_a_full_workload_writes_no_tuning_keys_and_lora_round_trips():
    assert "tuning" not in FULL.to_dict() and "lora_r" not in FULL.to_dict()
    data = json.loads(json.dumps(LORA.to_dict()))
    assert data["tuning"] == "lora" and data["lora_targets"] == ["q_proj", "v_proj"]
    assert Workload.from_dict(data) == LORA
    assert LORA.update == "master" and LORA.param_dtype == "fp16"


@pytest.mark.parametrize("kwargs, message", [
    (dict(tuning="lora", param_dtype="fp16", compute_dtype="fp16", update="stochastic"),
     "trained tensors are fp32 masters"),
    (dict(tuning="lora", param_dtype="fp32", compute_dtype="fp16"), "stored as it computes"),
    (dict(lora_r=4), "settings of tuning 'lora'"),
    (dict(tuning="lora", param_dtype="fp32", compute_dtype="fp32", lora_r=0), "lora_r must be"),
    (dict(tuning="lora", param_dtype="fp32", compute_dtype="fp32", lora_targets=()),
     "lora_targets must be"),
    (dict(tuning="dora"), "tuning must be one of"),
    (dict(tuning="prefix", param_dtype="fp16", compute_dtype="fp16", update="stochastic"),
     "trained tensors are fp32 masters"),
    (dict(tuning="prefix", param_dtype="fp32", compute_dtype="fp32", prefix_tokens=0),
     "prefix_tokens must be a whole number in 1..4096"),
    (dict(prefix_tokens=8), "prefix_tokens is a setting of tuning 'prefix'"),
    (dict(tuning="prefix", param_dtype="fp32", compute_dtype="fp32", lora_r=4),
     "settings of tuning 'lora', got them with tuning 'prefix'"),
])
def test_bad_tuning_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Workload(batch=1, seq=8, **kwargs)


def test_a_plan_with_targets_the_model_has_not_is_refused():
    wl = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32", tuning="lora",
                  lora_targets=("q_proj", "gate_proj"))
    with pytest.raises(ZoError, match="gate_proj: not a linear module of a opt block"):
        hand_plan(model="tiny-opt", layout=Layout(), workload=wl)


def test_the_lora_step_has_no_write_back_and_prices_the_adapters_only():
    model, hw = get_model("tiny-opt"), load_profile(NODE4)
    layout = Layout(pertp=2, ddp=2, slices=2)
    full = step_costs(model=model, profile=hw, workload=FULL, layout=layout)
    lora = step_costs(model=model, profile=hw, workload=LORA, layout=layout)
    kinds = {attrs["kind"] for _, attrs in build_step_graph(lora).nodes(data=True)}
    assert "d2h" not in kinds and "fence" not in kinds and "update" in kinds
    assert "d2h" in {a["kind"] for _, a in build_step_graph(full).nodes(data=True)}
    assert lora.read_only and not lora.split_update
    assert lora.update_s < full.update_s and lora.embed_s < full.embed_s
    assert sum(adapter_tensor_numels(model, r=8, targets=("q_proj", "v_proj"))) == \
        adapter_params(model, r=8, targets=("q_proj", "v_proj")) == 2 * 2 * 8 * model.hidden


def test_lora_memory_holds_adapters_and_no_block_z():
    model, layout = get_model("tiny-opt"), Layout()
    lora = rank_memory(model=model, workload=LORA, layout=layout, device_kind="cuda")
    full = rank_memory(model=model, workload=FULL, layout=layout, device_kind="cuda")
    keys = {t.key for t in lora.held}
    assert "adapters" in keys and "z_block" not in keys and "resident_z" not in keys
    adapters = next(t for t in lora.held if t.key == "adapters")
    assert adapters.bytes == model.num_layers * adapter_params(
        model, r=8, targets=("q_proj", "v_proj")) * 4
    assert lora.steady_bytes < full.steady_bytes


def test_traffic_and_snapshot_figures_of_a_plan():
    model = get_model("tiny-opt")
    layout = Layout(ddp=4, slices=2)
    full = hand_plan(model=model, layout=layout, workload=FULL)
    lora = hand_plan(model=model, layout=layout, workload=LORA)
    block = model.block_bytes("fp16")
    assert pcie_bytes_per_step(full) == (model.num_layers * block * 2, model.num_layers * block)
    assert pcie_bytes_per_step(lora) == (model.num_layers * block * 2, 0.0)
    assert snapshot_bytes(lora) == model.num_layers * adapter_params(
        model, r=8, targets=("q_proj", "v_proj")) * 4
    assert snapshot_bytes(full) == model.total_params * 2


SMALL = ["optimize", "--model", "tiny-opt", "--gpus", "4", "--batch", "8", "--seq", "64",
         "--profile", NODE4]


def test_optimize_tuning_lora_and_auto(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [*SMALL, "--tuning", "lora", "--lora-r", "4", "-o", str(out)])
    assert result.exit_code == 0, result.output
    wl = Plan.load(out).workload
    assert (wl.tuning, wl.lora_r, wl.lora_alpha) == ("lora", 4, 16)
    assert all(not c["layout"]["slice_update"] for c in Plan.load(out).data["candidates"])
    result = CliRunner().invoke(app, [*SMALL, "--tuning", "auto", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "full-parameter vs LoRA" in result.output and "snapshot" in result.output


@pytest.mark.parametrize("args, message", [
    (["--lora-r", "4"], "--lora-r: settings of --tuning lora"),
    (["--tuning", "lora", "--update", "master"], "--update master is for full tuning"),
    (["--tuning", "lora", "--lora-targets", "fc9"], "fc9: not a linear module"),
    (["--tuning", "half"], "--tuning must be one of"),
    (["--prefix-tokens", "8"], "--prefix-tokens 8: a setting of --tuning prefix, not full"),
    (["--tuning", "prefix", "--prefix-tokens", "0"], "--prefix-tokens 0: must be a whole number"),
    (["--tuning", "prefix", "--lora-r", "4"], "settings of --tuning lora, not prefix"),
    (["--tuning", "prefix", "--update", "master"], "--update master is for full tuning"),
    (["--tuning", "prefix", "--seq", "500", "--prefix-tokens", "16"],
     "seq (500) + --prefix-tokens (16) exceeds the 512 positions"),
])
def test_bad_tuning_options_exit_2_with_one_line(tmp_path, args, message):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [*SMALL, *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


# ---- prefix tuning (zoplan.prefix): planned and priced as LoRA is ---------------------------
PREFIX = Workload.for_prefix(batch=8, seq=64, compute_dtype="fp16")


def test_prefix_is_priced_memory_checked_and_written_like_lora(tmp_path):
    """A prefix step writes nothing back and prices its prefix's z and passes, and the
    attention over the prefix's keys; its memory holds every block's fp32 prefix; a
    snapshot is the prefixes; the plan round-trips with its prefix_tokens only."""
    model, hw = get_model("tiny-opt"), load_profile(NODE4)
    layout = Layout(pertp=2, ddp=2, slices=2)
    full = step_costs(model=model, profile=hw, workload=FULL, layout=layout)
    prefix = step_costs(model=model, profile=hw, workload=PREFIX, layout=layout)
    wider = step_costs(model=model, profile=hw, layout=layout,
                       workload=Workload.for_prefix(batch=8, seq=64, compute_dtype="fp16",
                                                    tokens=512))
    kinds = {attrs["kind"] for _, attrs in build_step_graph(prefix).nodes(data=True)}
    assert "d2h" not in kinds and "fence" not in kinds and prefix.read_only
    assert prefix.update_s < full.update_s and wider.forward_s > prefix.forward_s
    assert prefix_params(model, tokens=5) == 2 * 5 * model.kv_dim
    held = {t.key: t.bytes for t in rank_memory(model=model, workload=PREFIX, layout=Layout(),
                                               device_kind="cuda").held}
    assert held["adapters"] == model.num_layers * 2 * 5 * model.kv_dim * 4
    plan = hand_plan(model=model, layout=Layout(ddp=4, slices=2), workload=PREFIX)
    assert snapshot_bytes(plan) == held["adapters"]
    assert pcie_bytes_per_step(plan)[1] == 0.0
    data = json.loads(json.dumps(PREFIX.to_dict()))
    assert (data["tuning"], data["prefix_tokens"]) == ("prefix", 5) and "lora_r" not in data
    assert Workload.from_dict(data) == PREFIX and "prefix_tokens" not in FULL.to_dict()
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [*SMALL, "--tuning", "prefix", "--prefix-tokens", "3",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (Plan.load(out).workload.tuning, Plan.load(out).workload.prefix_tokens) == ("prefix", 3)
