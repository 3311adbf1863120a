"""Predicted vs measured time, per task kind and for the whole step.

Inputs: the plan (its predicted spans: one step) and the spans of a trace written by
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
kept steps); the step period (start to start) is kept too: what lies between steps
(batch, loss bookkeeping) is not part of the prediction.
Several nodes: each node's own step (from the step's first span to the end of the
node's last task before the closing all-reduce) gives the spread of a node's step time
(standard deviation over mean, over every node and kept step): `node_spread`, which
`zoplan calibrate --fit` writes into the profile (compute.node_spread).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from zoplan.errors import ZoError
from zoplan.execrules import STEADY_RUN_S, steps_for_seconds
from zoplan.layout import Layout
from zoplan.plan import Plan
from zoplan.trace import KINDS, Span


@dataclass(frozen=True, kw_only=True)
class Drift:
    """The machine's speed during the run over its speed when profiled (speed checks:
    zoexec.profiler.probe.SpeedProbe; > 1: slower now) for GEMM-bound and memory-bound block
    forwards and z draws, and the plan's layout simulated again on the profile with its
    compute figures scaled by those ratios. `probes`: how many speed probes were taken
    between the run's steps (zoexec.train.speed.SpeedMonitor; 0 in older traces, whose
    checks are only snapshots before and after the run)."""

    gemm: float
    memory: float
    z: float
    adjusted_pred_s: float | None
    probes: int = 0


COLLECTIVES = ("allgather", "allreduce")


WAITING = "waiting"



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
    drift: Drift | None = None
    node_spread: float | None = None     # several nodes: spread of a node's step time

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

    def to_dict(self) -> dict[str, Any]:
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


def collective_group(span: Span, layout: Layout) -> tuple[str, int, int, int]:
    """Key of the collective a span belongs to (members share it)."""
    if span.kind == "allgather":
        return ("allgather", span.step, span.block, layout.slice_group_of(span.rank))
    return ("allreduce", span.step, span.block, 0)


def effective_spans(spans: list[Span], layout: Layout) -> list[Span]:
    """Collective spans start when the last member of their group arrived (the rest of
    the span was waiting); other spans are unchanged."""
    latest: dict[tuple[str, int, int, int], float] = {}
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


def _busy_by_kind(spans: list[Span]) -> tuple[dict[str, float], dict[str, float],
                                               dict[str, list[float]], int]:
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
    by_step: dict[int, list[Span]] = defaultdict(list)
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
                       steps_used=kept, rows=rows,
                       node_spread=node_spread(by_step, layout))


def node_spread(by_step: dict[int, list[Span]], layout: Layout) -> float | None:
    """Standard deviation over mean of the nodes' own step times (module docstring);
    None on one node."""
    if layout.nodes < 2:
        return None
    times = []
    for spans in by_step.values():
        start = min(s.start_s for s in spans)
        ends: dict[int, float] = {}
        for s in spans:
            if s.kind != "allreduce":
                node = layout.node_of(s.rank)
                ends[node] = max(ends.get(node, start), s.end_s)
        times += [end - start for end in ends.values()]
    if len(times) < 2 or statistics.fmean(times) <= 0:
        return None
    return statistics.pstdev(times) / statistics.fmean(times)


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
    starts: dict[int, float] = {}
    for s in spans:
        starts[s.step] = min(starts.get(s.step, s.start_s), s.start_s)
    gaps = [starts[t + 1] - starts[t] for t in kept if t + 1 in starts]
    return statistics.median(gaps) if gaps else None


def run_seconds(cal: Calibration) -> float:
    """How long the kept steps ran (start to start where known)."""
    return cal.period_s * len(cal.meas_step_samples)


def steps_for(cal: Calibration, seconds: float = STEADY_RUN_S) -> int:
    """--steps for a run like this one whose kept steps last `seconds`."""
    return steps_for_seconds(cal.period_s, seconds, skip=cal.steps_used[0])
