"""The loop of issue 4 end to end on this machine's CPUs: measure it (`zoplan profile
--cpu --quick`), plan the smallest model for 2 gloo ranks on that profile, run the plan
with `zoexec run --trace`, and compare with `zoplan calibrate --fit`. No timing is
asserted (the machine may be busy); benchmarks/planner/bench_calibration.py reports the errors."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.calibrate import calibrate
from zoplan.cli import app
from zoplan.hardware import load_profile
from zoplan.plan import Plan
from zoplan.trace import read_trace

# `serial` (scripts/test.sh runs it alone): `zoplan profile` measures this machine
# within a time budget, and the test asserts on what it measured (every grid point
# kept, the fit's error); a test beside it takes one of the two cores, so passes are
# disturbed, retaken or cut short and the figures are the load's, not the machine's.
pytestmark = pytest.mark.serial

BIN = Path(sys.executable).parent


def zoplan(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), terminal_width=160)
    assert result.exit_code == 0, f"zoplan {' '.join(args)}:\n{result.output}"
    return result.output


def test_profile_plan_run_calibrate(tmp_path):
    profile_path, plan_path = tmp_path / "this-cpu.json", tmp_path / "plan.json"
    zoplan("profile", "--cpu", "--quick", "--ranks", "2", "--name", "this-cpu",
           "-o", str(profile_path))
    profile = load_profile(profile_path)
    assert profile.is_cpu and profile.gpus_per_node == 2
    assert profile.sources["compute.peak_tflops"].startswith("[M] zoplan profile")
    prov, meas = profile.extra()["provenance"], profile.extra()["measurements"]
    assert {"torch", "transformers", "zoplan"} <= set(prov["versions"])
    budget = prov["budget"]   # the time budget and the load, in the profile and in one line
    assert budget["rounds"] == budget["rounds_planned"] == 1 and budget["samples"] > 0
    assert "1 of 1 rounds" in prov["disturbance"]
    fit = meas["fit"]
    assert len(fit["residuals_pct"]) == len(meas["forward_alone"]) >= 10
    assert 0 < fit["rel_rms_pct"] < 100 and fit["peak_tflops"] > 0
    assert profile.figures().compute.peak_tflops == pytest.approx(fit["peak_tflops"], rel=1e-3)
    assert all("median_s" in p and "iqr_s" in p for p in meas["forward_alone"])
    assert profile.extra()["speed_check"]["probes"] >= 1   # probed between the grid's passes

    zoplan("optimize", "--model", "tiny-opt", "--gpus", "2", "--pertp", "2", "--slices", "1",
           "--batch", "4", "--seq", "64", "--profile", str(profile_path), "-q",
           "-o", str(plan_path))
    trace = tmp_path / "trace"
    run = subprocess.run([str(BIN / "zoexec"), "run", str(plan_path), "--init", "random",
                          "--steps", "3", "--trace", str(trace), "-q"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    meta = json.loads((trace / "meta.json").read_text())
    assert len(meta["speed_check"]) == 2 and isinstance(meta["speed_probes"], list)

    fitted = tmp_path / "fit.json"
    out = zoplan("calibrate", str(plan_path), str(trace), "--profile", str(profile_path),
                 "--fit", "-o", str(fitted))
    print(out)
    cal = calibrate(plan=plan_path, trace=trace, profile=str(profile_path), skip=1, fit=False,
                    output=None).calibration
    _, spans = read_trace(trace)
    kept = sorted({s.step for s in spans})[1:]
    step_s = [max(s.end_s for s in spans if s.step == t) - min(s.start_s for s in spans
                                                               if s.step == t) for t in kept]
    assert cal.meas_step_s == pytest.approx(statistics.median(step_s))
    assert cal.pred_step_s == Plan.load(plan_path).step_time_s
    assert cal.error_pct == pytest.approx(100 * (cal.pred_step_s - cal.meas_step_s)
                                          / cal.meas_step_s)
    assert (f"step time: predicted {cal.pred_step_s:.3f} s, measured {cal.meas_step_s:.3f} s, "
            f"error {cal.error_pct:+.1f}%") in out
    # the run's speed checks are compared with the profile's (the machine may drift)
    assert "machine speed around the run" in out and "the plan on the machine as it ran" in out
    # no warning but the machine's drift (the trace, plan and profile belong together)
    warnings = [line for line in out.splitlines() if line.startswith("warning")]
    unexpected = [w for w in warnings if "during the run than when it was profiled" not in w]
    assert unexpected == []
    assert load_profile(fitted).extra()["provenance"]["calibrated"]["plan"] == \
        Plan.load(plan_path).layout.label()
