"""zoplan calibrate on synthetic traces made from a plan's own prediction."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.calibrate.compare import compare, effective_spans, error_pct, steps_for
from zoplan.calibrate.drift import Drift, drift_warning, machine_drift
from zoplan.calibrate.refit import refit_profile, resimulate
from zoplan.cli import app
from zoplan.errors import ZoError
from zoplan.execrules import STEADY_RUN_S
from zoplan.hardware import load_profile
from zoplan.io import sha256_json
from zoplan.plan import Plan
from zoplan.pricing.collectives import allgather_busbw_factor, allgather_s
from zoplan.pricing.stragglers import node_spread
from zoplan.trace import Span, write_trace
from zoplan.views.calibrate import spread_line, step_line

runner = CliRunner()


def make_plan(tmp_path, name: str, *args: str) -> Path:
    out = tmp_path / f"{name}.json"
    result = runner.invoke(app, ["optimize", "--model", "tiny-opt", "--profile", "cpu",
                                 "--batch", "8", "--seq", "64", "-q", "-o", str(out),
                                 "--placement", "host", *args])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plans")
    return {"pertp2": make_plan(tmp, "pertp2", "--gpus", "2", "--pertp", "2", "--slices", "1"),
            "sliced": make_plan(tmp, "sliced", "--gpus", "2", "--pertp", "1", "--slices", "2")}


def dilate(plan: Plan, *, steps: int = 4, factor: dict | float = 1.0, gap_s: float = 0.0):
    """The plan's predicted step repeated `steps` times, each span's time scaled by
    factor[kind] (a dict) or one factor, steps laid end to end with `gap_s` between."""
    base = plan.spans()
    scale = (lambda k: factor.get(k, 1.0)) if isinstance(factor, dict) else (lambda k: factor)
    one = [Span(kind=s.kind, rank=s.rank, start_s=s.start_s * scale(s.kind),
                dur_s=s.dur_s * scale(s.kind), block=s.block) for s in base]
    length = max(s.end_s for s in one) - min(s.start_s for s in one)
    out = []
    for t in range(steps):
        off = t * (length + gap_s)
        out += [Span(kind=s.kind, rank=s.rank, start_s=s.start_s + off, dur_s=s.dur_s,
                     block=s.block, step=t) for s in one]
    return out


def test_prediction_against_itself_is_exact(plans):
    plan = Plan.load(plans["pertp2"])
    cal = compare(plan, dilate(plan), skip=1)
    assert cal.steps_used == [1, 2, 3]
    assert abs(cal.error_pct) < 1e-6
    for row in cal.rows:
        assert abs(row.gap_s) < 1e-9, row
    assert "step time: predicted" in step_line(cal)


def test_uniform_dilation_gives_the_error_and_fit_recovers_it(plans):
    plan = Plan.load(plans["pertp2"])
    cal = compare(plan, dilate(plan, factor=1.25), skip=1)
    assert cal.error_pct == pytest.approx(100 * (1 / 1.25 - 1), abs=0.5)
    profile = load_profile("cpu")
    fit = refit_profile(profile, plan, cal, trace="synthetic", date="2000-01-01")
    again = resimulate(plan, fit.profile)
    assert abs(error_pct(again, cal.meas_step_s)) < 5, (again, cal.meas_step_s, fit.changes)
    changed = {c[0] for c in fit.changes}
    assert {"compute.zo_rank_scaling", "compute.rank_scaling", "pcie.h2d_gbps"} <= changed
    assert fit.profile.sources["pcie.h2d_gbps"].startswith("[M] zoplan calibrate")


@pytest.mark.parametrize("update", ["master", "stochastic"])
def test_a_gpu_profile_is_refitted_too(tmp_path, update):
    """A GPU plan (fp16 compute; fp32 masters or 16-bit blocks) whose run was 1.25x
    slower: the refit scales the GEMM rate of the plan's precision, the HBM bandwidth,
    the z costs and the duplex copy rates, and the layout on it predicts the run."""
    out = tmp_path / "gpu.json"
    result = runner.invoke(app, ["optimize", "--model", "opt-1.3b", "--gpus", "8",
                                 "--profile", "dgx-a100-80gb", "--batch", "16", "--seq", "256",
                                 "--update", update, "--placement", "host", "-q", "-o",
                                 str(out)])
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    cal = compare(plan, dilate(plan, factor=1.25), skip=1)
    fit = refit_profile(load_profile("dgx-a100-80gb"), plan, cal, trace="synthetic",
                        date="2000-01-01")
    changed = {c[0] for c in fit.changes}
    assert {"compute.peak_tflops", "device.hbm_gbps", "compute.z_ns_per_elem",
            "pcie.h2d_gbps", "pcie.h2d_duplex_gbps"} <= changed, changed
    again = resimulate(plan, fit.profile)
    assert abs(error_pct(again, cal.meas_step_s)) < 5, (again, cal.meas_step_s, fit.changes)


def test_a_plan_with_resident_blocks_and_slice_update_is_refitted(tmp_path):
    """A GPU plan whose blocks stay on the devices (no h2d, no d2h) and that updates
    the slice: calibrate compares its kinds (slice_update among them), and the refit
    makes the plan, resident blocks and all, predict the 1.25x slower run."""
    out = tmp_path / "resident.json"
    result = runner.invoke(app, ["optimize", "--model", "opt-1.3b", "--gpus", "8",
                                 "--profile", "dgx-a100-80gb", "--batch", "16", "--seq", "256",
                                 "--slices", "8", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    assert plan.resident_blocks and plan.layout.slice_update
    assert not {s.kind for s in plan.spans()} & {"h2d", "d2h"}
    cal = compare(plan, dilate(plan, factor=1.25), skip=1)
    assert cal.row("slice_update").meas_task_s > 0 and cal.row("h2d") is None
    fit = refit_profile(load_profile("dgx-a100-80gb"), plan, cal, trace="synthetic",
                        date="2000-01-01")
    assert {"compute.peak_tflops", "compute.z_ns_per_elem"} <= {c[0] for c in fit.changes}
    again = resimulate(plan, fit.profile)
    assert abs(error_pct(again, cal.meas_step_s)) < 5, (again, cal.meas_step_s, fit.changes)


def test_forward_is_the_largest_contributor(plans):
    plan = Plan.load(plans["pertp2"])
    cal = compare(plan, dilate(plan, factor={"forward": 1.5}), skip=0)
    assert cal.contributors()[0].kind == "forward"
    assert cal.row("forward").task_error_pct == pytest.approx(100 * (1 / 1.5 - 1), abs=0.5)
    assert cal.row("h2d").task_error_pct == pytest.approx(0, abs=1e-6)
    assert cal.error_pct < 0


def test_collective_wait_goes_to_the_waiting_row(plans):
    plan = Plan.load(plans["sliced"])
    spans = dilate(plan, steps=2)
    late = [Span(kind=s.kind, rank=s.rank, start_s=s.start_s - 0.01, dur_s=s.dur_s + 0.01,
                 block=s.block, step=s.step) if s.kind == "allgather" and s.rank == 0 else s
            for s in spans]
    eff = effective_spans(late, plan.layout)
    assert [s.dur_s for s in eff if s.kind == "allgather"] == pytest.approx(
        [s.dur_s for s in spans if s.kind == "allgather"])
    cal = compare(plan, late, skip=0)
    assert cal.row("allgather").gap_s == pytest.approx(0, abs=1e-9)


def test_skip_leaving_nothing_is_an_error(plans):
    plan = Plan.load(plans["pertp2"])
    with pytest.raises(ZoError, match="--skip 4 leaves none"):
        compare(plan, dilate(plan), skip=4)


def _trace(tmp_path, plan_path: Path, spans, **meta) -> Path:
    plan = Plan.load(plan_path)
    directory = tmp_path / "trace"
    write_trace(directory, spans, {"plan_sha256": sha256_json(plan.data),
                                   "layout": plan.data["layout"], **meta})
    return directory


def test_cli_prints_the_step_error_and_fits(plans, tmp_path):
    plan = Plan.load(plans["pertp2"])
    trace = _trace(tmp_path, plans["pertp2"], dilate(plan, factor=1.1))
    out = tmp_path / "fit.json"
    result = runner.invoke(app, ["calibrate", str(plans["pertp2"]), str(trace), "--fit",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "step time: predicted" in result.output and "error -9.1%" in result.output
    assert "warning" not in result.output
    fitted = load_profile(out)
    # two CPU ranks: a slower forward lowers how well ranks share the cores
    assert fitted.figures().compute.rank_scaling < load_profile("cpu").figures().compute.rank_scaling
    assert fitted.extra()["provenance"]["calibrated"]["plan"] == plan.layout.label()


def test_cli_warns_on_other_plan_and_version_drift(plans, tmp_path):
    plan = Plan.load(plans["pertp2"])
    trace = _trace(tmp_path, plans["pertp2"], dilate(plan), plan_sha256="0" * 64)
    data = json.loads(load_profile("cpu").to_json())
    data["provenance"] = {"versions": {"torch": "1.0.0", "zoplan": "0.0.1"}}
    prof = tmp_path / "old.json"
    prof.write_text(json.dumps(data))
    result = runner.invoke(app, ["calibrate", str(plans["pertp2"]), str(trace),
                                 "--profile", str(prof)], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "recorded for another plan" in text
    assert "torch 1.0.0 ->" in text and "re-run `zoplan profile`" in text


def test_cli_refuses_a_trace_of_another_layout(plans, tmp_path):
    plan = Plan.load(plans["sliced"])
    trace = _trace(tmp_path, plans["sliced"], dilate(plan))
    result = runner.invoke(app, ["calibrate", str(plans["pertp2"]), str(trace)],
                           terminal_width=200)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: trace {trace} ran layout {plan.layout.label()}, the plan is "
        f"{Plan.load(plans['pertp2']).layout.label()}: give a trace of a run of this plan"]


def test_cli_fit_without_a_findable_profile_fails_cleanly(plans, tmp_path):
    data = json.loads(plans["pertp2"].read_text())
    data["profile"]["name"] = "not-a-shipped-profile"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    plan = Plan.load(path)
    trace = _trace(tmp_path, path, dilate(plan))
    result = runner.invoke(app, ["calibrate", str(path), str(trace), "--fit"])
    assert result.exit_code == 2
    assert "--profile" in result.output


def test_one_rank_fit_scales_the_compute_constants(tmp_path):
    plan = Plan.load(make_plan(tmp_path, "one", "--gpus", "1"))
    cal = compare(plan, dilate(plan, factor={"forward": 1.3, "update": 0.8}), skip=1)
    fit = refit_profile(load_profile("cpu"), plan, cal, trace="synthetic", date="2000-01-01")
    old, new = (p.to_dict()["compute"] for p in (load_profile("cpu"), fit.profile))
    assert new["peak_tflops"] == pytest.approx(old["peak_tflops"] / 1.3, rel=1e-3)
    assert new["overhead_us"] == pytest.approx(old["overhead_us"] * 1.3, rel=1e-3)
    assert new["zo_ns_per_param"] == pytest.approx(old["zo_ns_per_param"] * 0.8, rel=1e-3)
    assert new["rank_scaling"] == old["rank_scaling"]


def test_machine_drift_from_speed_checks(plans):
    """A machine 30% slower during the run than when profiled: calibrate says so
    (ratios, warning) and prices the plan on the machine as it ran."""
    plan = Plan.load(plans["pertp2"])
    data = json.loads(load_profile("cpu").to_json())
    then = {"threads": 2, "gemm": {"hidden": 512, "batch": 4, "seq": 128, "median_s": 0.010},
            "memory": {"hidden": 128, "batch": 8, "seq": 512, "median_s": 0.020},
            "z": {"hidden": 256, "median_s": 0.004}}
    data["speed_check"] = then
    profile = load_profile_from(data)

    def slower(factor, **change):
        out = json.loads(json.dumps(then))
        for name in ("gemm", "memory", "z"):
            out[name]["median_s"] *= factor
        out.update(change)
        return out
    meta = {"speed_check": [slower(1.28), slower(1.32)]}
    drift = machine_drift(profile, meta, plan)
    assert (drift.gemm, drift.memory, drift.z) == pytest.approx((1.3, 1.3, 1.3))
    cal = compare(plan, dilate(plan, factor=1.3), skip=1)
    assert cal.error_pct == pytest.approx(100 * (1 / 1.3 - 1), abs=0.5)
    assert abs(error_pct(drift.adjusted_pred_s, cal.meas_step_s)) < 3   # copies do not drift
    assert "30% slower" in drift_warning(drift)
    # snapshots around a long run do not tell its average speed: no warning then
    assert drift_warning(drift, run_s=STEADY_RUN_S) is None
    # a drift within what the checks tell apart from noise: no warning
    mild = Drift(gemm=1.2, memory=1.0, z=1.0, adjusted_pred_s=None)
    assert drift_warning(mild) is None
    # another thread count (or no check at all): no comparison
    assert machine_drift(profile, {"speed_check": [slower(1.2, threads=1)]}, plan) is None
    assert machine_drift(profile, {}, plan) is None
    # probes between the steps count as well: the speed of the whole run, not of its ends
    probes = [{"after_step": i, **{n: then[n]["median_s"] * 1.5 for n in ("gemm", "memory", "z")}}
              for i in range(5)]
    probed = machine_drift(profile, {**meta, "speed_probes": probes}, plan)
    assert probed.probes == 5 and probed.gemm == pytest.approx(1.5)
    assert probed.adjusted_pred_s > drift.adjusted_pred_s
    # ... so a long run with probes is warned about as well
    assert "50% slower" in drift_warning(probed, run_s=STEADY_RUN_S)
    # a probe missing a kind is left out
    bad = machine_drift(profile, {**meta, "speed_probes": [{"gemm": 1.0}]}, plan)
    assert bad.probes == 0


def load_profile_from(data: dict):
    from zoplan.hardware import HardwareProfile

    return HardwareProfile.from_dict(data)


def test_wide_step_spread_is_reported(plans):
    plan = Plan.load(plans["pertp2"])
    steady = compare(plan, dilate(plan, steps=5), skip=1)
    assert spread_line(steady) is None
    spans = dilate(plan, steps=4)
    end = max(s.end_s for s in spans)
    spans += [Span(kind=s.kind, rank=s.rank, start_s=end + s.start_s, dur_s=s.dur_s,
                   block=s.block, step=4) for s in dilate(plan, steps=1, factor=1.5)]
    cal = compare(plan, spans, skip=1)
    line = spread_line(cal)
    assert line and "ranged from" in line and "4 steps" in line
    # a short run is told how many steps average the machine's speeds
    steps = steps_for(cal)
    assert f"--steps {steps}" in line
    assert steps * (cal.meas_period_s or cal.meas_step_s) >= STEADY_RUN_S
    long = dataclasses.replace(cal, meas_step_samples=cal.meas_step_samples * (steps // 3))
    assert "averages over them" in spread_line(long)


def test_a_trace_of_two_nodes_measures_the_node_spread_and_the_fit_keeps_it(tmp_path):
    """A 2-node plan; a synthetic trace whose second node runs 10% slower every other
    step: calibrate measures the spread of the nodes' own step times (standard deviation
    over mean, zoplan.pricing.stragglers' sigma) and --fit writes it to compute.node_spread."""
    node4 = str(Path(__file__).resolve().parents[1] / "fixtures" / "node4-nvswitch.json")
    out = tmp_path / "two.json"
    result = runner.invoke(app, ["optimize", "--model", "tiny-opt", "--gpus", "8", "--ddp", "4",
                                 "--batch", "8", "--seq", "64", "--profile", node4,
                                 "--placement", "host", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    assert plan.layout.nodes == 2
    base, local = plan.spans(), plan.layout.local_ranks
    start = min(s.start_s for s in base)
    work = [s for s in base if s.kind != "allreduce"]
    node_time = max(s.end_s for s in work) - start
    spans, times = [], []
    for t in range(5):
        slow = 1.1 if t % 2 else 1.0
        off = t * 2 * node_time * 1.2
        for s in base:
            begin = start + (s.start_s - start) * slow + off   # node 1's copy
            if s.kind == "allreduce":   # the barrier: every rank leaves it together
                end = s.end_s + off + node_time * (slow - 1)
                spans.append(dataclasses.replace(s, start_s=s.start_s + off, step=t,
                                                 dur_s=end - s.start_s - off))
                spans.append(dataclasses.replace(s, rank=s.rank + local, step=t,
                                                 start_s=begin, dur_s=end - begin))
                continue
            spans.append(dataclasses.replace(s, start_s=s.start_s + off, step=t))
            spans.append(dataclasses.replace(s, rank=s.rank + local, step=t, start_s=begin,
                                             dur_s=s.dur_s * slow))
        if t >= 1:
            times += [node_time, node_time * slow]
    cal = compare(plan, spans, skip=1)
    expected = statistics.pstdev(times) / statistics.fmean(times)
    assert cal.node_spread == pytest.approx(expected, rel=1e-6)
    fit = refit_profile(load_profile(node4), plan, cal, trace="synthetic", date="2000-01-01")
    assert node_spread(fit.profile) == pytest.approx(expected, rel=1e-3)   # 4 figures kept
    assert "compute.node_spread" in {c[0] for c in fit.changes}


def test_cli_fit_refuses_a_trace_of_another_plan_and_writes_nothing(plans, tmp_path):
    plan = Plan.load(plans["pertp2"])
    trace = _trace(tmp_path, plans["pertp2"], dilate(plan), plan_sha256="0" * 64)
    out = tmp_path / "fit.json"
    result = runner.invoke(app, ["calibrate", str(plans["pertp2"]), str(trace), "--fit",
                                 "-o", str(out)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "--fit: trace" in result.output and "was recorded for another plan" in result.output
    assert not out.exists()


def test_the_all_gather_refit_is_the_price_inverted():
    """allgather_busbw_factor (what `calibrate --fit` scales the table by) inverts
    allgather_s: the table scaled by it prices the all-gather at the measured time;
    within the latency there is nothing to scale."""
    a100 = load_profile("dgx-a100-80gb")
    block, slices = 64 * 2**20, 4
    predicted = allgather_s(a100, block, slices)
    for measured in (1.7 * predicted, 0.6 * predicted):
        factor = allgather_busbw_factor(a100, predicted_s=predicted, measured_s=measured)
        data = a100.to_dict()
        data["collective"]["allgather_busbw"] = [[size, bw * factor]
                                                 for size, bw in data["collective"]["allgather_busbw"]]
        scaled = type(a100).from_dict(data)
        assert allgather_s(scaled, block, slices) == pytest.approx(measured, rel=1e-9)
    latency = a100.figures().collective.latency_us * 1e-6
    assert allgather_busbw_factor(a100, predicted_s=predicted, measured_s=latency) is None
