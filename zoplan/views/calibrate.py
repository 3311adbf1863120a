"""What `zoplan calibrate` prints: the per-kind table, the step time error in plain
words, the spread of the measured steps, the machine's drift, the largest
contributors to the gap, and the changes of a refit."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from zoplan.calibrate import RefitResult
from zoplan.calibrate.compare import WAITING, Calibration, error_pct, run_seconds, steps_for
from zoplan.execrules import STEADY_RUN_S


def _ms(seconds: float, *, sign: bool = False) -> str:
    value = seconds * 1e3
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def step_line(cal: Calibration) -> str:
    return (f"step time: predicted {cal.pred_step_s:.3f} s, measured {cal.meas_step_s:.3f} s, "
            f"error {cal.error_pct:+.1f}%")


def drift_text(cal: Calibration) -> str:
    d = cal.drift
    assert d is not None, "drift_text needs a calibration with a drift"
    where = (f"during the run ({d.probes} probes between its steps, checks before and after)"
             if d.probes else "around the run (speed checks just before and after it)")
    text = (f"machine speed {where} vs when profiled: GEMM-bound forward x{d.gemm:.2f}, "
            f"memory-bound forward x{d.memory:.2f}, z draw x{d.z:.2f} (> 1: slower now)")
    if d.adjusted_pred_s:
        text += (f"; the plan on the machine as it ran: {d.adjusted_pred_s:.3f} s, error "
                 f"{error_pct(d.adjusted_pred_s, cal.meas_step_s):+.1f}%")
    return text


def spread_line(cal: Calibration) -> str | None:
    """The measured steps' spread, when it is wide enough to matter (> 10% of the
    median between the fastest and the slowest kept step): the machine changed speed
    during the run. On a shared or virtual machine whose speed moves every few
    seconds, a run of STEADY_RUN_S or more gives a median that averages the speeds
    (docs/measurements.md)."""
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


def render(cal: Calibration, console: Console) -> None:
    for warning in cal.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
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



def render_refit(result: RefitResult, cal: Calibration, console: Console) -> None:
    """The figures a refit changed, the layout's step on the refitted profile, the file."""
    for figure, old, value, why in result.refit.changes:
        console.print(f"  {figure}: {old:g} -> {value:g}  ({why})", highlight=False)
    again = result.resimulated_s
    if again:
        console.print(f"refitted profile: predicted {again:.3f} s for this layout "
                      f"(error {error_pct(again, cal.meas_step_s):+.1f}%)", highlight=False)
    console.print(f"wrote {result.path}", highlight=False)
