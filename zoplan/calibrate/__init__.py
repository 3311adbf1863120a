"""`zoplan calibrate`: predicted vs measured time, per task kind and for the whole step
(compare), the machine's drift during the run (drift), warnings about the inputs
(inputs), and a profile refitted to the measurement (refit).

    result = calibrate(plan=Path, trace=Path, profile=None, skip=1, fit=False, output=None)

returns the Calibration (and, with `fit`, the refit written to `output`); the views
print them (zoplan.views.calibrate).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zoplan.calibrate.compare import Calibration, compare, error_pct, run_seconds
from zoplan.calibrate.drift import drift_warning, machine_drift
from zoplan.calibrate.inputs import check_inputs, resolve_profile
from zoplan.calibrate.refit import Refit, refit_profile, resimulate
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile
from zoplan.io import atomic_write_text, check_writable, sha256_json
from zoplan.plan import Plan
from zoplan.trace import read_trace

__all__ = ["Calibration", "CalibrateResult", "RefitResult", "calibrate", "compare", "error_pct"]


@dataclass(frozen=True, kw_only=True)
class RefitResult:
    """A refitted profile written to `path`: its changes, and the layout's step on it."""

    refit: Refit
    path: Path
    resimulated_s: float


@dataclass(frozen=True, kw_only=True)
class CalibrateResult:
    calibration: Calibration
    refit: RefitResult | None = None


def calibrate(*, plan: Path, trace: Path, profile: str | None, skip: int, fit: bool,
              output: Path | None) -> CalibrateResult:
    """Compare the plan with the trace of its run; with `fit`, write a refitted profile."""
    if skip < 0:
        raise ZoError(f"--skip must be >= 0, got {skip}")
    the_plan = Plan.load(plan)
    meta, spans = read_trace(Path(trace))
    the_plan.check_trace(meta, spans, origin=f"trace {trace}")
    if fit:
        _check_fit_trace(the_plan, meta, trace)
    if fit and output is not None:
        check_writable(Path(output), inputs=(plan,))   # before the work, not after it
    hw = resolve_profile(the_plan, profile, required=fit)
    cal = compare(the_plan, spans, skip=skip)
    cal.warnings.extend(check_inputs(the_plan, meta, hw))
    drift = machine_drift(hw, meta, the_plan)
    if drift is not None:
        cal = dataclasses.replace(cal, drift=drift)
        warning = drift_warning(drift, run_seconds(cal))
        if warning:
            cal.warnings.append(warning)
    refit = None
    if fit:
        assert hw is not None, "resolve_profile(required=True) returns a profile or raises"
        refit = write_refit(the_plan, cal, hw, trace=str(trace), output=output)
    return CalibrateResult(calibration=cal, refit=refit)


def _check_fit_trace(plan: Plan, meta: dict[str, Any], trace: Path) -> None:
    """--fit refits a profile from a trace of THIS plan's run only: another plan's spans
    would be priced against the wrong tasks (a warning is too late: the file is written)."""
    traced, actual = meta.get("plan_sha256"), sha256_json(plan.data)
    if traced != actual:
        what = f"plan sha256 {traced[:12]}" if traced else "no plan sha256"
        raise ZoError(f"--fit: trace {trace} was recorded for another plan ({what} in its "
                      f"meta.json, {actual[:12]} for this plan); refit from a trace of this "
                      f"plan's own run (zoexec run PLAN --trace DIR)")


def write_refit(plan: Plan, cal: Calibration, hw: HardwareProfile, *, trace: str,
                output: Path | None) -> RefitResult:
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    fit = refit_profile(hw, plan, cal, trace=trace, date=date)
    path = Path(output) if output else Path(f"{hw.name}-fit.json")
    new = fit.profile
    atomic_write_text(path, new.to_json())
    return RefitResult(refit=fit, path=path, resimulated_s=resimulate(plan, new))
