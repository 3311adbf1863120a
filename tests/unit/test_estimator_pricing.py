"""The planner's price of each estimator (zoplan.pricing.estimators, the schedules'
counts of draws and passes): lowrank draws r(m+n) values and writes the product instead
of drawing m*n, sparse adds its thresholds and mask to a z draw, q directions add
their draws and update passes; MeZO-SGD's prices do not move; a plan of an estimator
carries MeZO-SGD on its layout, and `zoplan optimize` says what the estimator costs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.hardware import HardwareProfile, load_profile
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.pricing.estimators import LOWRANK_BYTES, cpu_draw_s, gpu_draw, mask_bytes
from zoplan.pricing.tasks import task_times
from zoplan.pricing.zo import CPU_PASS_BYTES, cpu_z_time_s, pass_time_s
from zoplan.sim.costs import step_costs
from zoplan.workload import Workload

MEASURED = Path(__file__).resolve().parents[1] / "fixtures" / "cpu-measured4.json"
FP32 = Workload(batch=8, seq=64, param_dtype="fp32", compute_dtype="fp32")


def _hw() -> HardwareProfile:
    return HardwareProfile.from_dict(json.loads(MEASURED.read_text()))


def _times(wl: Workload, *, streams: int = 2, here: int = 1, tokens: int = 512,
           model: str = "tiny-opt") -> dict:
    return task_times(model=get_model(model), profile=_hw(), workload=wl,
                      tokens=tokens, streams=streams, local_ranks=1, here=here)


def test_lowrank_draws_its_factors_and_writes_the_product_instead_of_z():
    hw, model = _hw(), get_model("tiny-opt")
    wl = dataclasses.replace(FP32, estimator="lowrank", lowrank_rank=4)
    shapes = model.block_tensor_shapes()
    matrices = [s for s in shapes if len(s) == 2]
    vectors = [math.prod(s) for s in shapes if len(s) == 1]
    factors = sum((m + n) * 4 for m, n in matrices)
    op = 300e-6 / 40                     # overhead_us 300 over an OPT block's 40 operators
    want = (cpu_z_time_s(hw, vectors) + 7 * len(matrices) * op + factors * 5e-9
            + LOWRANK_BYTES / CPU_PASS_BYTES * pass_time_s(hw, sum(m * n for m, n in matrices)))
    assert cpu_draw_s(hw, shapes, wl) == pytest.approx(want)
    d = cpu_draw_s(hw, shapes, wl)
    passes = pass_time_s(hw, model.block_params)
    assert _times(wl)["update_s"] == pytest.approx(2 * d + 2 * passes)
    # tiny-opt's matrices are small: each one's operator calls outweigh its z; not OPT-125m's
    big = get_model("opt-125m")
    assert cpu_draw_s(hw, big.block_tensor_shapes(), wl) < 0.5 * cpu_z_time_s(
        hw, big.block_tensor_numels())
    mezo, low = _times(FP32, model="opt-125m"), _times(wl, model="opt-125m")
    assert low["update_s"] < mezo["update_s"] and low["forward_s"] == mezo["forward_s"]


def test_sparse_adds_thresholds_and_the_mask_to_a_z_draw():
    hw, model = _hw(), get_model("tiny-opt")
    wl = dataclasses.replace(FP32, estimator="sparse")
    numels = model.block_tensor_numels()
    sample = sum(-(-n // 16) for n in numels)
    calls = (4 * len(numels) + 3 * len(numels)) * 300e-6 / 40   # every tensor: one chunk
    want = (cpu_z_time_s(hw, numels) + 4 * pass_time_s(hw, sample) + calls
            + mask_bytes(4, 4) / CPU_PASS_BYTES * pass_time_s(hw, sum(numels)))
    assert cpu_draw_s(hw, model.block_tensor_shapes(), wl) == pytest.approx(want)
    assert _times(wl)["update_s"] > _times(FP32)["update_s"]


def test_directions_add_their_draws_and_update_passes():
    hw, model = _hw(), get_model("tiny-opt")
    z = cpu_z_time_s(hw, model.block_tensor_numels())
    z_res = cpu_z_time_s(hw, model.resident_tensor_numels())
    one, one_res = pass_time_s(hw, model.block_params), pass_time_s(hw, model.resident_params)
    q4 = dataclasses.replace(FP32, directions=4)
    t = _times(q4, streams=8, here=4, tokens=128)   # one rank: every direction, both signs
    alone = _times(FP32, streams=1, tokens=128)       # one stream's forward and head
    assert t["update_s"] == pytest.approx(4 * (z + one) + z + one)
    assert t["forward_s"] - 8 * alone["forward_s"] == pytest.approx(7 * one + 3 * z, rel=1e-6)
    assert t["head_s"] - 8 * alone["head_s"] == pytest.approx(7 * one_res + 3 * z_res, rel=1e-6)
    # DDP 4 with 4 directions: each group owns one; the step's tokens per rank as MeZO's
    costs = step_costs(model=model, profile=hw, workload=q4, layout=Layout(ddp=4))
    plain = step_costs(model=model, profile=hw, workload=FP32, layout=Layout(ddp=4))
    assert (costs.streams, costs.tokens_per_rank) == (plain.streams, plain.tokens_per_rank)
    one_rank = step_costs(model=model, profile=hw, workload=q4, layout=Layout())
    assert (one_rank.streams, one_rank.tokens_per_rank) == (8, FP32.priced_tokens(1) / 4)


def test_mezo_prices_do_not_move_and_the_gpu_prices_each_estimator():
    hw = load_profile("dgx-h100")
    model = get_model("opt-1.3b")
    wl = Workload(batch=16, seq=512, param_dtype="fp16", compute_dtype="fp16",
                  update="stochastic")
    base = task_times(model=model, profile=hw, workload=wl, tokens=4096, streams=2,
                      local_ranks=8)
    same = task_times(model=model, profile=hw, workload=wl, tokens=4096, streams=2,
                      local_ranks=8, here=1)
    assert base["update_s"] == same["update_s"]
    shapes = model.block_tensor_shapes()
    draws = {e: gpu_draw(hw, shapes, dataclasses.replace(wl, estimator=e))
             for e in ("mezo", "lowrank", "sparse")}
    assert draws["sparse"].device_s > draws["mezo"].device_s
    assert all(w.host_s > 0 for w in draws.values())


def test_a_plan_of_an_estimator_carries_mezo_on_its_layout(tmp_path):
    runner = CliRunner()
    args = ["optimize", "--model", "opt-125m", "--gpus", "1", "--profile", str(MEASURED),
            "--batch", "8", "--seq", "64"]
    result = runner.invoke(app, [*args, "--estimator", "lowrank", "--lowrank-rank", "4",
                                 "-o", str(tmp_path / "low.json")])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "low.json").read_text())
    assert plan["workload"]["estimator"] == "lowrank" and plan["workload"]["lowrank_rank"] == 4
    mezo = plan["baselines"]["mezo"]
    assert mezo["workload"].get("estimator") is None
    assert mezo["estimator_update_task_s"] < mezo["update_task_s"]
    assert "estimator lowrank rank 4, V every 50 steps: update task" in " ".join(result.output.split())
    result = runner.invoke(app, [*args, "-q", "-o", str(tmp_path / "mezo.json")])
    assert "mezo" not in json.loads((tmp_path / "mezo.json").read_text())["baselines"]
    result = runner.invoke(app, [*args, "--sparse-share", "0.5", "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "--sparse-share: not a setting of estimator 'mezo'" \
        in result.output
    result = runner.invoke(app, [*args, "--tuning", "prefix", "--directions", "2",
                                 "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "mezo, 2 directions with tuning prefix: prefix tuning " \
        "runs MeZO-SGD with one direction only" in " ".join(result.output.split())
    assert not (tmp_path / "p.json").exists()


def test_lora_prices_the_estimators_draws_over_the_adapters():
    hw, model = _hw(), get_model("tiny-opt")
    lora = Workload.for_lora(batch=8, seq=64, compute_dtype="fp32")
    plain, sparse, q2 = (step_costs(model=model, profile=hw,
                                    workload=dataclasses.replace(lora, **e),
                                    layout=Layout()).update_s
                         for e in ({}, {"estimator": "sparse"}, {"directions": 2}))
    assert sparse > plain and q2 > plain
