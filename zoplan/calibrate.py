"""`zoplan calibrate`: predicted vs measured time, per task kind and for the whole step,
and a profile refitted to the measurement.

Inputs: the plan (its predicted spans: one step) and a trace directory written by
`zoexec run --trace` (every rank, every step). First `skip` steps are left out (warm-up).

Per task kind:
- per task: median duration of one task (predicted over the plan's spans, measured over
  every rank and kept step);
- busy per step: the kind's total duration per rank in one step (median over steps).
Collective spans are measured from the moment the LAST member of the group arrived
(the simulator starts a collective when its last member reaches it): the time a rank
spent waiting inside the collective for the others goes to the "waiting" row, which on
a CPU profile (one task at a time per rank) is step time minus busy time.
Step time: from the first span's start to the last span's end of a step (median over
kept steps); the step period (start to start) is shown too: what lies between steps
(batch, loss bookkeeping) is not part of the prediction.

Machine drift: when the profile and the trace both carry speed checks (CPU: the profile
stores one, `zoexec run --trace` takes one before and after its steps) the machine's
speed during the run over its speed when profiled is printed, with the plan simulated
again on the profile scaled by it; a wide spread of the measured steps is reported too.

--fit scales the profile's constants so that the plan's tasks would take their measured
times: the forward model's terms (or the rank scaling with several CPU ranks), the z
model's figures or zo_ns_per_param (update), copy bandwidths (h2d, d2h),
the all-gather table and latency, and the small all-reduce; each changed figure gets a
"[M] zoplan calibrate ..." note. Warnings: a trace recorded for another plan (sha256),
a profile other than the plan's, and a profile measured with other software versions
than this machine's (Vidur's lesson: a newer engine drifts the figures).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile
from zoplan.io import atomic_write_text, sha256_json
from zoplan.layout import axes_label
from zoplan.plan import Plan
from zoplan.trace import KINDS, Span, read_trace

COLLECTIVES = ("allgather", "allreduce")
WAITING = "waiting"


# ---- the comparison ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class KindRow:
    """Predicted vs measured time of one task kind (seconds)."""

    kind: str
    pred_count: float        # tasks per rank per step
    meas_count: float
    pred_task_s: float       # median duration of one task
    meas_task_s: float
    pred_busy_s: float       # per rank per step
    meas_busy_s: float

    @property
    def task_error_pct(self) -> float:
        return error_pct(self.pred_task_s, self.meas_task_s)

    @property
    def gap_s(self) -> float:
        """Predicted minus measured busy time per rank per step."""
        return self.pred_busy_s - self.meas_busy_s


@dataclass(frozen=True, kw_only=True)
class Calibration:
    plan_label: str
    device_kind: str
    pred_step_s: float
    meas_step_s: float
    meas_step_samples: list[float]
    meas_period_s: float | None
    steps_used: list[int]
    rows: list[KindRow]
    warnings: list[str] = field(default_factory=list)
    drift: "Drift | None" = None

    @property
    def error_pct(self) -> float:
        return error_pct(self.pred_step_s, self.meas_step_s)

    @property
    def gap_s(self) -> float:
        return self.pred_step_s - self.meas_step_s

    @property
    def period_s(self) -> float:
        """Measured step period: start to start where known, else the step time."""
        return self.meas_period_s or self.meas_step_s

    def row(self, kind: str) -> KindRow | None:
        return next((r for r in self.rows if r.kind == kind), None)

    def contributors(self) -> list[KindRow]:
        """Kinds ordered by how much of the busy-time gap they explain."""
        return sorted(self.rows, key=lambda r: abs(r.gap_s), reverse=True)

    def to_dict(self) -> dict:
        drift = None if self.drift is None else {
            **dataclasses.asdict(self.drift),
            "adjusted_error_pct": error_pct(self.drift.adjusted_pred_s, self.meas_step_s)
            if self.drift.adjusted_pred_s else None}
        return {"plan": self.plan_label, "pred_step_s": self.pred_step_s, "drift": drift,
                "meas_step_s": self.meas_step_s, "error_pct": self.error_pct,
                "meas_period_s": self.meas_period_s, "steps_used": self.steps_used,
                "rows": [{**r.__dict__, "task_error_pct": r.task_error_pct} for r in self.rows],
                "warnings": self.warnings}


def error_pct(predicted: float, measured: float) -> float:
    """Signed error of a prediction in percent of the measurement (+: predicted slower)."""
    if measured <= 0:
        return 0.0 if predicted <= 0 else float("inf")
    return 100.0 * (predicted - measured) / measured


def collective_group(span: Span, layout) -> tuple:
    """Key of the collective a span belongs to (members share it)."""
    if span.kind == "allgather":
        return ("allgather", span.step, span.block, layout.slice_group_of(span.rank))
    return ("allreduce", span.step, span.block, 0)


def effective_spans(spans: list[Span], layout) -> list[Span]:
    """Collective spans start when the last member of their group arrived (the rest of
    the span was waiting); other spans are unchanged."""
    latest: dict[tuple, float] = {}
    for s in spans:
        if s.kind in COLLECTIVES:
            key = collective_group(s, layout)
            latest[key] = max(latest.get(key, s.start_s), s.start_s)
    out = []
    for s in spans:
        if s.kind in COLLECTIVES:
            start = min(max(s.start_s, latest[collective_group(s, layout)]), s.end_s)
            s = Span(kind=s.kind, rank=s.rank, start_s=start, dur_s=s.end_s - start,
                     block=s.block, step=s.step, lane=s.lane)
        out.append(s)
    return out


def step_span(spans: list[Span]) -> float:
    return max(s.end_s for s in spans) - min(s.start_s for s in spans)


def _busy_by_kind(spans: list[Span]) -> tuple[dict, dict, dict, int]:
    """Per kind: tasks per rank, busy time per rank, durations; and the rank count."""
    ranks = len({s.rank for s in spans}) or 1
    count: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    durs: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        count[s.kind] += 1 / ranks
        busy[s.kind] += s.dur_s / ranks
        durs[s.kind].append(s.dur_s)
    return count, busy, durs, ranks


def compare(plan: Plan, spans: list[Span], *, skip: int = 1) -> Calibration:
    """Predicted (plan) vs measured (trace spans) per task kind and per step."""
    steps = sorted({s.step for s in spans})
    kept = [t for t in steps if t >= skip]
    if not kept:
        which = (f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1
                 else f"step {steps[0]}" if steps else "no steps")
        raise ZoError(f"the trace has {len(steps)} step(s) ({which}); --skip {skip} leaves "
                      f"none to compare")
    layout, serial = plan.layout, plan.device_kind == "cpu"
    predicted = plan.spans()
    if not predicted:
        raise ZoError("the plan has no predicted spans to compare with")
    pred_step = plan.step_time_s
    p_count, p_busy, p_durs, _ = _busy_by_kind(predicted)
    by_step = defaultdict(list)
    for s in effective_spans([s for s in spans if s.step in kept], layout):
        by_step[s.step].append(s)
    per_step = {t: _busy_by_kind(by_step[t]) for t in kept}
    step_times = [step_span(by_step[t]) for t in kept]
    rows = []
    for kind in KINDS:
        m_durs = [d for t in kept for d in per_step[t][2].get(kind, [])]
        if kind not in p_durs and not m_durs:
            continue
        rows.append(KindRow(
            kind=kind, pred_count=p_count.get(kind, 0.0),
            meas_count=statistics.median(per_step[t][0].get(kind, 0.0) for t in kept),
            pred_task_s=statistics.median(p_durs[kind]) if kind in p_durs else 0.0,
            meas_task_s=statistics.median(m_durs) if m_durs else 0.0,
            pred_busy_s=p_busy.get(kind, 0.0),
            meas_busy_s=statistics.median(per_step[t][1].get(kind, 0.0) for t in kept)))
    if serial:
        rows.append(_waiting_row(rows, pred_step, step_times))
    return Calibration(plan_label=layout.label(), device_kind=plan.device_kind,
                       pred_step_s=pred_step, meas_step_s=statistics.median(step_times),
                       meas_step_samples=step_times, meas_period_s=_period(spans, kept),
                       steps_used=kept, rows=rows)


def _waiting_row(rows: list[KindRow], pred_step: float, step_times: list[float]) -> KindRow:
    """One task at a time per rank: step time = busy + waiting (per rank)."""
    pred_busy = sum(r.pred_busy_s for r in rows)
    meas_busy = sum(r.meas_busy_s for r in rows)
    meas_step = statistics.median(step_times)
    return KindRow(kind=WAITING, pred_count=0.0, meas_count=0.0, pred_task_s=0.0,
                   meas_task_s=0.0, pred_busy_s=max(0.0, pred_step - pred_busy),
                   meas_busy_s=max(0.0, meas_step - meas_busy))


def _period(spans: list[Span], kept: list[int]) -> float | None:
    """Median time from one step's first span to the next one's (None with < 2 steps)."""
    starts = {}
    for s in spans:
        starts[s.step] = min(starts.get(s.step, s.start_s), s.start_s)
    gaps = [starts[t + 1] - starts[t] for t in kept if t + 1 in starts]
    return statistics.median(gaps) if gaps else None


# ---- machine drift -------------------------------------------------------------------------
# Warn when the machine's speed moved more than this. The speed checks and probes are
# block forwards and z draws of fixed shapes, alone on all cores; a step's mix of work
# does not follow them closely: in two loops on a 2-core VM (tiny-opt and tiny-llama,
# 20-25 s runs, 6-10 probes each) they put the runs 4-23% faster than the profile while
# the steps ran 11% slower to 9% faster than predicted. Past 25% the machine has
# changed for sure (a run 44-50% faster on all of them ran 20-77% faster than
# predicted, and within 2-25% of the plan on the machine as it ran).
DRIFT_WARN = 0.25
STEADY_RUN_S = 20.0        # a run this long averages a drifting machine's speeds


@dataclass(frozen=True, kw_only=True)
class Drift:
    """The machine's speed during the run over its speed when profiled (speed checks:
    zoplan.profile.SpeedProbe; > 1: slower now) for GEMM-bound and memory-bound block
    forwards and z draws, and the plan's layout simulated again on the profile with its
    compute figures scaled by those ratios. `probes`: how many speed probes were taken
    between the run's steps (zoexec.engine.SpeedMonitor; 0 in older traces, whose
    checks are only snapshots before and after the run)."""

    gemm: float
    memory: float
    z: float
    adjusted_pred_s: float | None
    probes: int = 0


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


def machine_drift(profile: HardwareProfile | None, meta: dict,
                  plan: Plan | None = None) -> Drift | None:
    """None unless both the profile and the trace carry comparable speed checks."""
    then = (profile.extra.get("speed_check") if profile is not None else None) or {}
    checks = [c for c in meta.get("speed_check") or [] if isinstance(c, dict)]
    names = ("gemm", "memory", "z")
    if not then or not checks:
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


def drift_text(cal: Calibration) -> str:
    d = cal.drift
    where = (f"during the run ({d.probes} probes between its steps, checks before and after)"
             if d.probes else "around the run (speed checks just before and after it)")
    text = (f"machine speed {where} vs when profiled: GEMM-bound forward x{d.gemm:.2f}, "
            f"memory-bound forward x{d.memory:.2f}, z draw x{d.z:.2f} (> 1: slower now)")
    if d.adjusted_pred_s:
        text += (f"; the plan on the machine as it ran: {d.adjusted_pred_s:.3f} s, error "
                 f"{error_pct(d.adjusted_pred_s, cal.meas_step_s):+.1f}%")
    return text


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


# ---- warnings ------------------------------------------------------------------------------
def this_machine_versions() -> dict:
    """Installed versions (read from package metadata: torch is not imported)."""
    out = {"zoplan": __version__}
    for package in ("torch", "transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def version_drift(profile: HardwareProfile) -> list[str]:
    """Packages whose version differs from the one the profile was measured with."""
    measured = (profile.extra.get("provenance") or {}).get("versions") or {}
    here = this_machine_versions()
    out = []
    for package in ("torch", "transformers", "zoplan"):
        then, now = measured.get(package), here.get(package)
        if then and now and str(then).split("+")[0] != str(now).split("+")[0]:
            out.append(f"{package} {then} -> {now}")
    return out


def check_inputs(plan: Plan, meta: dict, profile: HardwareProfile | None) -> list[str]:
    warnings = []
    traced = meta.get("plan_sha256")
    actual = sha256_json(plan.data)
    if traced and traced != actual:
        warnings.append(f"the trace was recorded for another plan (plan sha256 {traced[:12]} "
                        f"in the trace, {actual[:12]} for this plan)")
    if profile is not None:
        if profile.sha256 != plan.data["profile"]["sha256"]:
            warnings.append(f"profile {profile.name} is not the one the plan was made with "
                            f"(sha256 {profile.sha256[:12]} != {plan.data['profile']['sha256'][:12]})")
        drift = version_drift(profile)
        if drift:
            warnings.append(f"profile {profile.name} was measured with other software "
                            f"({'; '.join(drift)}): its figures may have drifted, "
                            f"re-run `zoplan profile`")
    elif meta.get("speed_check"):
        warnings.append(f"profile {plan.data['profile']['name']!r} not found: pass --profile "
                        "with the profile file to compare the run's speed checks with it")
    return warnings


def resolve_profile(plan: Plan, name_or_path: str | None, *, required: bool) -> HardwareProfile | None:
    """--profile, else the plan's profile by name (a shipped one); None if not found and
    not required."""
    try:
        return load_profile(name_or_path or plan.data["profile"]["name"])
    except ZoError as exc:
        if required or name_or_path:
            raise ZoError(f"{exc} (pass --profile with the profile the plan was made with)") from None
        return None


# ---- refit --------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Refit:
    """A profile being refitted: its JSON data and the changes made."""

    data: dict
    date: str
    trace: str
    changes: list[tuple[str, float, float, str]] = field(default_factory=list)

    def set(self, path: str, value: float, why: str) -> None:
        section, key = path.split(".", 1)
        old = self.data[section].get(key, 0.0)
        value = float(f"{value:.4g}")
        if old == value:
            return
        self.data[section][key] = value
        self.changes.append((path, old, value, why))
        self.data["sources"][path] = f"[M] zoplan calibrate {self.date} {why} (trace {self.trace})"

    @property
    def profile(self) -> HardwareProfile:
        return HardwareProfile.from_dict(self.data, origin="refitted profile")


def _task_times(plan: Plan, profile: HardwareProfile) -> dict:
    """The plan's per-task times on `profile` (zoplan.graph.task_times)."""
    from zoplan.graph import task_times

    lay, wl = plan.layout, plan.workload
    return task_times(model=plan.model, profile=profile, workload=wl,
                      tokens=wl.batch // lay.ddp * wl.seq, streams=2 if lay.pertp == 1 else 1,
                      local_ranks=lay.local_ranks)


def refit_forward(fit: Refit, plan: Plan, measured_task_s: float) -> None:
    """Scale the compute model so the forward task takes its measured time:
    compute.rank_scaling with several CPU ranks, else every term of the forward model."""
    hw, lay = fit.profile, plan.layout
    t_pred = _task_times(plan, hw)["forward_s"]
    ratio = measured_task_s / t_pred
    c = hw.compute
    why = f"forward task {measured_task_s * 1e3:.3f} ms measured vs {t_pred * 1e3:.3f} ms"
    if hw.is_cpu and lay.local_ranks > 1:
        fit.set("compute.rank_scaling", c["rank_scaling"] / ratio,
                f"{why} with {lay.local_ranks} ranks")
        return
    for key in ("peak_tflops", "mem_gbps", "attn_tflops"):
        if key in c:
            fit.set(f"compute.{key}", c[key] / ratio, why)
    for key in ("overhead_us", "rope_overhead_us", "elem_ns"):
        if key in c:
            fit.set(f"compute.{key}", c[key] * ratio, why)


def refit_update(fit: Refit, plan: Plan, measured_task_s: float) -> None:
    """Scale the zo cost so the update task takes its measured time: the z model's
    figures (or zo_ns_per_param) for one rank per device, the z (zo) rank scaling for
    several CPU ranks."""
    hw, lr = fit.profile, plan.layout.local_ranks
    t_pred = _task_times(plan, hw)["update_s"]
    ratio = measured_task_s / t_pred
    why = f"update task {measured_task_s * 1e3:.3f} ms measured vs {t_pred * 1e3:.3f} ms"
    c = hw.compute
    if hw.is_cpu and lr > 1:
        key = "z_rank_scaling" if hw.has_z_model else "zo_rank_scaling"
        now = c.get(key, 1.0 if hw.has_z_model else c["rank_scaling"])
        fit.set(f"compute.{key}", now / ratio, f"{why} with {lr} ranks")
        return
    keys = ("z_ns_per_elem", "z_call_us", "zo_pass_ns") if hw.has_z_model else ("zo_ns_per_param",)
    for key in keys:
        fit.set(f"compute.{key}", c[key] * ratio, why)


def refit_copies(fit: Refit, cal: Calibration, plan: Plan) -> None:
    """Scale h2d / d2h bandwidth (and the host ceiling when ranks share it) by
    predicted / measured task time."""
    ratios = []
    for kind, key in (("h2d", "pcie.h2d_gbps"), ("d2h", "pcie.d2h_gbps")):
        row = cal.row(kind)
        if not row or row.meas_task_s <= 0 or row.pred_task_s <= 0:
            continue
        q = row.pred_task_s / row.meas_task_s
        ratios.append(q)
        section, name = key.split(".")
        fit.set(key, fit.data[section][name] * q,
                f"{kind} task {row.meas_task_s * 1e3:.3f} ms measured vs {row.pred_task_s * 1e3:.3f} ms")
    if not ratios:
        return
    q = statistics.geometric_mean(ratios)
    pcie = fit.data["pcie"]
    if plan.layout.local_ranks > 1:
        fit.set("host.mem_bw_gbps", fit.data["host"]["mem_bw_gbps"] * q,
                f"copies of {plan.layout.local_ranks} ranks at once: x{q:.3g}")
    if fit.profile.is_cpu:
        fit.set("pcie.duplex_gbps", max(pcie["h2d_gbps"], pcie["d2h_gbps"]),
                "a CPU rank copies one way at a time: max of the two directions")
    else:
        fit.set("pcie.duplex_gbps", pcie["duplex_gbps"] * q, f"copies x{q:.3g}")
    fit.set("pcie.switch_uplink_gbps", max(pcie["switch_uplink_gbps"], pcie["h2d_gbps"]),
            "not below one rank's link")
    fit.set("host.mem_bw_gbps", max(fit.data["host"]["mem_bw_gbps"], pcie["h2d_gbps"],
                                    pcie["d2h_gbps"]), "not below one rank's link")


def refit_collectives(fit: Refit, cal: Calibration, plan: Plan) -> None:
    coll = fit.data["collective"]
    ar = cal.row("allreduce")
    if ar and ar.meas_task_s > 0:
        fit.set("collective.allreduce_small_us", ar.meas_task_s * 1e6,
                "loss all-reduce (from the last member's arrival), median")
    ag = cal.row("allgather")
    if not ag or ag.meas_task_s <= 0:
        return
    latency = coll["latency_us"] * 1e-6
    if ag.meas_task_s <= latency or ag.pred_task_s <= latency:
        fit.set("collective.latency_us", ag.meas_task_s * 1e6, "all-gather shorter than the latency")
        return
    factor = (ag.pred_task_s - latency) / (ag.meas_task_s - latency)
    table = [[size, float(f"{bw * factor:.4g}")] for size, bw in coll["allgather_busbw"]]
    coll["allgather_busbw"] = table
    fit.changes.append(("collective.allgather_busbw", 1.0, factor, "table scaled"))
    fit.data["sources"]["collective.allgather_busbw"] = (
        f"[M] zoplan calibrate {fit.date} all-gather {ag.meas_task_s * 1e3:.3f} ms measured vs "
        f"{ag.pred_task_s * 1e3:.3f} ms: table x{factor:.3g} (trace {fit.trace})")


def refit_profile(profile: HardwareProfile, plan: Plan, cal: Calibration, *,
                  trace: str, date: str) -> Refit:
    """A copy of `profile` whose constants make the plan's tasks take their measured times."""
    data = copy.deepcopy(profile.to_dict())
    fit = Refit(data=data, date=date, trace=trace)
    fwd, upd = cal.row("forward"), cal.row("update")
    if fwd and fwd.meas_task_s > 0:
        refit_forward(fit, plan, fwd.meas_task_s)
    if upd and upd.meas_task_s > 0:
        refit_update(fit, plan, upd.meas_task_s)
    refit_copies(fit, cal, plan)
    refit_collectives(fit, cal, plan)
    prov = dict(data.get("provenance") or {})
    prov["calibrated"] = {"date": date, "trace": trace, "plan": cal.plan_label,
                          "step_error_pct_before": round(cal.error_pct, 2),
                          "changes": [list(c) for c in fit.changes]}
    data["provenance"] = prov
    return fit


def resimulate(plan: Plan, profile: HardwareProfile) -> float | None:
    """The plan's layout simulated again on `profile` (None if the planner is missing)."""
    try:
        from zoplan.graph import build_step_graph, step_costs
        from zoplan.simulate import simulate
    except ImportError:
        return None
    costs = step_costs(model=plan.model, profile=profile, workload=plan.workload,
                       layout=plan.layout)
    return simulate(build_step_graph(costs), record_spans=False).step_time_s


# ---- the command ----------------------------------------------------------------------------
def _ms(seconds: float, *, sign: bool = False) -> str:
    value = seconds * 1e3
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def step_line(cal: Calibration) -> str:
    return (f"step time: predicted {cal.pred_step_s:.3f} s, measured {cal.meas_step_s:.3f} s, "
            f"error {cal.error_pct:+.1f}%")


def run_seconds(cal: Calibration) -> float:
    """How long the kept steps ran (start to start where known)."""
    return cal.period_s * len(cal.meas_step_samples)


def steps_for_seconds(step_s: float, seconds: float = STEADY_RUN_S, *, skip: int = 1) -> int:
    """--steps for a run whose steps after the first `skip` (which calibrate leaves
    out) last `seconds` at `step_s` each (0 for a step of no time). zoexec's default
    for traced runs and benchmarks/bench_calibration.py size their runs with it."""
    return math.ceil(seconds / step_s) + skip if step_s > 0 else 0


def steps_for(cal: Calibration, seconds: float = STEADY_RUN_S) -> int:
    """--steps for a run like this one whose kept steps last `seconds`."""
    return steps_for_seconds(cal.period_s, seconds, skip=cal.steps_used[0])


def spread_line(cal: Calibration) -> str | None:
    """The measured steps' spread, when it is wide enough to matter (> 10% of the
    median between the fastest and the slowest kept step): the machine changed speed
    during the run. On a shared or virtual machine whose speed moves every few
    seconds, a run of STEADY_RUN_S or more gives a median that averages the speeds
    (on a 2-core VM: 4 layouts within 3% with 25 s runs, -26% to +26% with 3 s runs)."""
    samples = sorted(cal.meas_step_samples)
    if len(samples) < 2 or samples[-1] - samples[0] <= 0.1 * cal.meas_step_s:
        return None
    seconds = run_seconds(cal)
    advice = (f"for a median that averages the machine's speeds, run {STEADY_RUN_S:.0f} s "
              f"or more (--steps {steps_for(cal)})" if seconds < STEADY_RUN_S
              else "the median averages over them")
    return (f"measured steps ranged from {samples[0]:.3f} s to {samples[-1]:.3f} s "
            f"({len(samples)} steps, {seconds:.1f} s): the machine's speed changed while "
            f"it ran; {advice}")


def render(cal: Calibration, console) -> None:
    from rich import box
    from rich.table import Table

    table = Table(title=f"predicted vs measured, ms: {cal.plan_label} ({cal.device_kind}, "
                        f"steps {cal.steps_used[0]}-{cal.steps_used[-1]})",
                  caption="n: tasks per rank per step; task: median per task; busy: per rank "
                          "per step; gap: pred - meas",
                  box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False)  # fits 80 cols
    for col in ("kind", "n", "task pred", "task meas", "error", "busy pred",
                "busy meas", "gap"):
        table.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    for r in cal.rows:
        tasks = "" if r.kind == WAITING else f"{r.meas_count:g}"
        per = ("", "", "") if r.kind == WAITING else (
            _ms(r.pred_task_s), _ms(r.meas_task_s),
            f"{r.task_error_pct:+.1f}%" if r.meas_task_s else "-")
        table.add_row(r.kind, tasks, *per, _ms(r.pred_busy_s), _ms(r.meas_busy_s),
                      _ms(r.gap_s, sign=True))
    console.print(table)
    console.print(step_line(cal), highlight=False)
    spread = spread_line(cal)
    if spread:
        console.print(spread, highlight=False)
    if cal.drift is not None:
        console.print(drift_text(cal), highlight=False)
    if cal.meas_period_s:
        outside = cal.meas_period_s - cal.meas_step_s
        extra = (f"; {outside * 1e3:.1f} ms per step lie between steps (not predicted)"
                 if outside > 0 else "")
        console.print(f"step period (start to start): {cal.meas_period_s:.3f} s{extra}",
                      highlight=False)
    console.print("largest contributors: " + contributors_text(cal), highlight=False)


def contributors_text(cal: Calibration, top: int = 3) -> str:
    gap = cal.gap_s
    parts = []
    for r in cal.contributors()[:top]:
        # a share of a gap that is itself within 2% of the step says nothing
        share = (f" ({100 * r.gap_s / gap:.0f}% of the gap)"
                 if abs(gap) > 0.02 * cal.meas_step_s else "")
        parts.append(f"{r.kind} {r.gap_s * 1e3:+.2f} ms/step{share}")
    return ", ".join(parts)


def calibrate_command(*, plan: Path, trace: Path, fit: bool, output: Path | None,
                      profile: str | None, skip: int, console) -> Calibration:
    """`zoplan calibrate`: compare, print, and with --fit write a refitted profile."""
    if skip < 0:
        raise ZoError(f"--skip must be >= 0, got {skip}")
    the_plan = Plan.load(plan)
    meta, spans = read_trace(Path(trace))
    if meta.get("layout") and meta["layout"] != the_plan.data["layout"]:
        raise ZoError(f"trace {trace} ran layout {axes_label(meta['layout'])}, the plan is "
                      f"{axes_label(the_plan.data['layout'])}: calibrate a plan against a "
                      f"trace of a run of that plan")
    hw = resolve_profile(the_plan, profile, required=fit)
    cal = compare(the_plan, spans, skip=skip)
    cal.warnings.extend(check_inputs(the_plan, meta, hw))
    drift = machine_drift(hw, meta, the_plan)
    if drift is not None:
        cal = dataclasses.replace(cal, drift=drift)
        warning = drift_warning(drift, run_seconds(cal))
        if warning:
            cal.warnings.append(warning)
    for warning in cal.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    render(cal, console)
    if fit:
        write_refit(the_plan, cal, hw, trace=str(trace), output=output, console=console)
    return cal


def write_refit(plan: Plan, cal: Calibration, hw: HardwareProfile, *, trace: str,
                output: Path | None, console) -> Path:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    fit = refit_profile(hw, plan, cal, trace=trace, date=date)
    path = Path(output) if output else Path(f"{hw.name}-fit.json")
    new = fit.profile
    atomic_write_text(path, new.to_json())
    for figure, old, value, why in fit.changes:
        console.print(f"  {figure}: {old:g} -> {value:g}  ({why})", highlight=False)
    again = resimulate(plan, new)
    if again:
        console.print(f"refitted profile: predicted {again:.3f} s for this layout "
                      f"(error {error_pct(again, cal.meas_step_s):+.1f}%)", highlight=False)
    console.print(f"wrote {path}", highlight=False)
    return path
