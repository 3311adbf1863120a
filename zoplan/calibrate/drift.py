"""Machine drift: how much faster or slower the machine ran during a run than when it
was profiled, from the speed checks and probes both carry (CPU: the profile stores a
check, `zoexec run --trace` takes one before and after its steps and probes between
them), and the plan simulated again on the profile scaled by it."""

from __future__ import annotations

import copy
import statistics
from typing import Any

from zoplan.calibrate.compare import Drift
from zoplan.calibrate.refit import resimulate
from zoplan.execrules import SPEED_CHECK_KINDS, STEADY_RUN_S
from zoplan.hardware import HardwareProfile
from zoplan.plan import Plan

# Warn when the machine's speed moved more than this: the speed checks and probes are
# fixed shapes alone on all cores, and a step's mix of work follows them only roughly
# below it (docs/measurements.md).
DRIFT_WARN = 0.25


# A run with this many speed probes between its steps has its speed known over its whole
# length, not only at the snapshots before and after it.
PROBES_STEADY = 3


def drifted_profile(profile: HardwareProfile, *, gemm: float, memory: float,
                    z: float) -> HardwareProfile:
    """`profile` on a machine `gemm` x slower at GEMMs, `memory` x at memory-bound work
    (attention, element-wise operators, dispatch, the zo passes) and `z` x at z draws."""
    data = copy.deepcopy(profile.to_dict())
    c = data["compute"]
    has_terms = "elem_ns" in c
    for key, ratio in (("peak_tflops", gemm), ("attn_tflops", memory),
                       ("mem_gbps", memory if has_terms else gemm)):
        if key in c:
            c[key] /= ratio
    for key, ratio in (("overhead_us", memory if has_terms else gemm),
                       ("rope_overhead_us", memory), ("elem_ns", memory),
                       ("zo_ns_per_param", z), ("z_ns_per_elem", z), ("z_call_us", z),
                       ("z_chunk_us", z),
                       ("zo_pass_ns", memory)):
        if key in c:
            c[key] *= ratio
    return HardwareProfile.from_dict(data, origin="drifted profile")


def machine_drift(profile: HardwareProfile | None, meta: dict[str, Any],
                  plan: Plan | None = None) -> Drift | None:
    """None unless both the profile and the trace carry comparable speed checks."""
    then = (profile.extra().get("speed_check") if profile is not None else None) or {}
    checks = [c for c in meta.get("speed_check") or [] if isinstance(c, dict)]
    names = SPEED_CHECK_KINDS
    if profile is None or not then or not checks:
        return None
    for c in checks:   # another reference shape or thread count: not comparable
        if c.get("threads") != then.get("threads") or any(
                {k: v for k, v in (c.get(n) or {}).items() if k != "median_s"}
                != {k: v for k, v in then[n].items() if k != "median_s"} for n in names):
            return None
    probes = [p for p in meta.get("speed_probes") or []
              if isinstance(p, dict) and all(isinstance(p.get(n), (int, float)) for n in names)]
    now = {n: statistics.median([c[n]["median_s"] for c in checks] + [p[n] for p in probes])
           / then[n]["median_s"] for n in names}
    adjusted = resimulate(plan, drifted_profile(profile, **now)) if plan is not None else None
    return Drift(**now, adjusted_pred_s=adjusted, probes=len(probes))


def drift_warning(drift: Drift, run_s: float = 0.0) -> str | None:
    """A warning when the machine's speed moved by more than DRIFT_WARN. A run of
    STEADY_RUN_S or more without probes through it (older traces) gets none: its
    checks are snapshots of a second before and after it, which tell the speed of a
    short run but not the average of a long one."""
    worst = max((drift.gemm, drift.memory, drift.z), key=lambda r: abs(r - 1.0))
    steady = drift.probes >= PROBES_STEADY
    if run_s >= STEADY_RUN_S and not steady:
        return None
    if abs(worst - 1.0) <= DRIFT_WARN:
        return None
    how = "slower" if worst > 1 else "faster"
    seen = "speed probes through the run" if steady else "speed checks"
    return (f"this machine ran {abs(worst - 1.0):.0%} {how} during the run than when it was "
            f"profiled ({seen}): that part of the error is the machine, not the plan; "
            f"profile right before running, or refit with --fit")
