"""Predictions a user can act on (issue 39): every profile figure measured, public or
assumed; the plan's sensitivity to the assumed ones; DistZO2's naive and sliced
configurations lane by lane; a profile from a spec sheet; `zoplan rent`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile
from zoplan.models import get_model
from zoplan.origins import origin_from_note
from zoplan.pricing.distzo2 import LANES, both_configs
from zoplan.profiling.spec import SpecSheet, build_spec_profile
from zoplan.search import build_plan, resolve_request, search
from zoplan.search.rent import Option, rent
from zoplan.search.sensitivity import plausible_range, with_sensitivity
from zoplan.views.rent import marks
from zoplan.views.sensitivity import sensitivity_lines

runner = CliRunner()
TINY = dict(model="tiny-opt", gpus=2, profile="cpu", batch=8, seq=64)


# ---- origins ----------------------------------------------------------------------------
def test_every_figure_of_a_shipped_profile_has_an_origin():
    a100 = load_profile("dgx-a100-80gb")
    origins = a100.origins
    assert origins["device.memory_gib"].kind == "public"
    assert origins["compute.m_half_tokens"].kind == "assumed"
    assert origins["collective.allgather_busbw"].kind == "public"
    assert "compute.overlap_slowdown" in a100.assumed_figures()
    assert any(o.kind == "measured" for o in load_profile("hgx-h200").origins.values())
    assert origin_from_note("[M] zoplan profile 2026-01-01 median").by == "zoplan profile"
    assert origin_from_note("[D] generic").kind == "assumed"    # no public source named


@pytest.mark.parametrize("origins,words", [
    ({"compute.nope": {"kind": "assumed", "by": "x"}}, "not a figure"),
    ({"compute.peak_tflops": {"kind": "guessed", "by": "x"}}, "kind must be one of"),
    ({"compute.peak_tflops": {"kind": "assumed", "by": " "}}, "must say what it rests on"),
    ({"compute.peak_tflops": "assumed"}, "must be"),
])
def test_a_bad_origins_map_is_refused(origins, words):
    data = load_profile("dgx-a100-80gb").to_dict()
    data["origins"] = origins
    with pytest.raises(ZoError, match=words):
        HardwareProfile.from_dict(data)


# ---- sensitivity ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    result = search(resolve_request(**TINY))
    return result, build_plan(result)


def test_the_sensitivity_is_additive_and_brackets_the_step(tiny):
    result, plan = tiny
    more = with_sensitivity(plan, result)
    extra = {k: v for k, v in more.data.items() if k != "sensitivity"}
    assert json.dumps(extra, sort_keys=True) == json.dumps(plan.data, sort_keys=True)
    sens = more.data["sensitivity"]
    assert sens["step_time_s"]["low"] <= sens["nominal_step_s"] <= sens["step_time_s"]["high"]
    assert sens["step_time_s"]["low"] < sens["step_time_s"]["high"]
    assumed = set(load_profile("cpu").assumed_figures())
    assert sens["figures"] and {f["figure"] for f in sens["figures"]} <= assumed
    assert isinstance(sens["winner_stays"], bool)
    lines = sensitivity_lines(more.data)
    assert "step" in lines[0] and any(f["figure"] in " ".join(lines) for f in sens["figures"])


def test_plausible_ranges_move_the_figure_both_ways():
    low, high, why = plausible_range("compute.m_half_tokens", 256)
    assert low < 256 < high and why
    assert plausible_range("compute.rank_scaling", 1.0) is None
    table = [[1, 10.0], [2, 20.0]]
    low, high, _ = plausible_range("collective.allgather_busbw", table)
    assert low[1][1] < 20.0 < high[1][1]


# ---- DistZO2's configurations -----------------------------------------------------------
def test_the_sliced_configuration_moves_copies_off_each_gpu():
    configs = both_configs(get_model("opt-1.3b"), load_profile("dgx-a100-80gb"), batch=4,
                           seq=2048, pertp=2, ddp=2)
    naive, sliced = configs["naive"], configs["sliced"]
    assert naive.slices == 1 and sliced.slices == 4
    assert sliced.busy_s["h2d"] < naive.busy_s["h2d"] and sliced.busy_s["d2h"] < naive.busy_s["d2h"]
    assert naive.busy_s["collective"] < sliced.busy_s["collective"]
    assert sliced.step_s < naive.step_s
    for lanes in configs.values():
        assert set(lanes.shares) == set(LANES) and all(0 <= s <= 1 for s in lanes.shares.values())
        assert lanes.order[0] == max(LANES, key=lambda lane: lanes.busy_s[lane])


# ---- spec sheet and rent ----------------------------------------------------------------
def test_a_spec_sheet_profile_marks_every_derived_figure_assumed():
    data = build_spec_profile(SpecSheet(gpu="h100-pcie", count=4, host_memory_gb=512,
                                        nvlink=False))
    profile = HardwareProfile.from_dict(data)
    origins = profile.origins
    assert set(origins) == set(data["origins"])
    assert origins["device.hbm_gbps"].kind == "public"
    assert origins["host.memory_gib"].kind == "public"
    for path in ("compute.peak_tflops", "pcie.h2d_gbps", "fabric.p2p_gbps"):
        assert origins[path].kind == "assumed" and origins[path].by
    assert profile.figures().fabric.kind == "host" and profile.gpus_per_node == 4


@pytest.mark.parametrize("sheet,words", [
    (dict(gpu="h900", count=4, host_memory_gb=512), "unknown GPU model"),
    (dict(gpu="l40s", count=4, host_memory_gb=512, nvlink=True), "no NVLink"),
    (dict(gpu="a100-pcie-80", count=4, host_memory_gb=512, per_switch=3), "does not divide"),
])
def test_a_bad_spec_sheet_is_one_line(sheet, words):
    with pytest.raises(ZoError, match=words):
        build_spec_profile(SpecSheet(**sheet))


@pytest.mark.parametrize("text", ["cpu", "cpu:x", "cpu:0", "cpu:2:-1"])
def test_a_bad_machine_is_refused(text):
    with pytest.raises(ZoError, match="--on"):
        Option.parse(text)


def test_rent_marks_the_fastest_and_the_cheapest():
    rows = rent([Option.parse("cpu:2:3.0"), Option.parse("cpu:1:0.5")], model="tiny-opt",
                batch=8, seq=64)
    assert all(not r.reason and r.step_range_s[0] <= r.step_s <= r.step_range_s[1] for r in rows)
    marked = marks(rows)
    fastest = min(range(2), key=lambda i: rows[i].step_s)
    cheapest = min(range(2), key=lambda i: rows[i].cost()[0])
    assert "fastest" in marked[fastest] and "cheapest" in marked[cheapest]


def test_the_commands_write_and_refuse_in_one_line(tmp_path):
    out = tmp_path / "spec.json"
    ok = runner.invoke(app, ["spec", "--gpu", "a100-sxm-80", "--count", "8",
                             "--host-memory-gb", "2048", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert load_profile(out).figures().fabric.kind == "nvswitch"
    bad = runner.invoke(app, ["spec", "--gpu", "h900", "--count", "8", "--host-memory-gb",
                              "2048", "-o", str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and "unknown GPU model" in bad.output
    assert not (tmp_path / "x.json").exists()
    shares = runner.invoke(app, ["distzo2", "--gpus", "2", "--batch", "2", "--seq", "128"])
    assert shares.exit_code == 0 and "naive" in shares.output and "sliced" in shares.output, \
        shares.output
    refused = runner.invoke(app, ["distzo2", "--gpus", "3"])
    assert refused.exit_code == 2 and "--pertp" in refused.output
