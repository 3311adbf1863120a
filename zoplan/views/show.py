"""`zoplan show`: the predicted step (and a measured one) as a Gantt chart; Chrome and SVG exports.

`zoplan show plan.json` draws the predicted step as a Gantt chart (zoplan.views.gantt: cell,
critical-path and rank-folding rules are in its docstring), with `--trace DIR` the
measured step under it on the same time axis and a per-lane table of busy times, and
a summary panel (step time, tokens/s, utilisation, bottleneck, memory against capacity,
speed-up over the ZO2 and unsliced baselines).

Measured step: the trace's steps minus the first (warm-up; kept when it is the only
one); the step whose time is closest to their median is drawn, shifted to start at 0
like the prediction.

Exports (`--chrome`, `--svg`) are built in full before anything is written, and each is
written atomically: a failing command leaves no file behind.
"""

from __future__ import annotations

import hashlib
import io
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, sha256_json
from zoplan.plan import Plan
from zoplan.trace import LANES, Span, read_trace, step_time
from zoplan.views.chrome import ChromeTrace, chrome_json, chrome_trace, measured_pid_offset
from zoplan.views.common import fmt_time, parse_selection
from zoplan.views.gantt import LABEL_WIDTH, Window, critical_path, draw_chart, legend, span_label
from zoplan.views.inputs import MeasuredStep, ShowInput
from zoplan.views.panels import lane_table, ranks_of, summary_panel

MIN_CELLS = 20
MAX_COLUMNS = 1000   # --width, and the terminal's width where it claims more



def load_measured(directory: Path, plan: Plan, plan_path: Path) -> MeasuredStep:
    meta, spans = read_trace(directory)
    if not spans:
        raise ZoError(f"trace {directory} holds no spans")
    plan.check_trace(meta, spans, origin=f"trace {directory}")
    by_step: dict[int, list[Span]] = {}
    for span in spans:
        by_step.setdefault(span.step, []).append(span)
    steps = sorted(by_step)
    pool = steps[1:] if len(steps) > 1 else steps
    times = {st: step_time(by_step[st]) for st in pool}
    median = statistics.median(times.values())
    chosen = min(pool, key=lambda st: (abs(times[st] - median), st))
    notes = _trace_notes(meta, plan, plan_path, steps, chosen, median)
    return MeasuredStep(step=chosen, spans=shift_to_zero(by_step[chosen]), steps=steps,
                        median_s=median, notes=notes)


def _trace_notes(meta: dict[str, Any], plan: Plan, plan_path: Path, steps: list[int], chosen: int,
                 median: float) -> list[str]:
    skipped = f", skipping warm-up step {steps[0]}" if len(steps) > 1 else ""
    notes = [f"measured: step {chosen} of steps {span_label(steps)} (closest to the median "
             f"step time {fmt_time(median)}{skipped})"]
    recorded = meta.get("plan_sha256")
    if recorded:
        digests = {sha256_json(plan.data), hashlib.sha256(plan_path.read_bytes()).hexdigest()}
        if recorded not in digests:
            notes.append("warning: the trace's plan_sha256 does not match this plan")
    return notes


def shift_to_zero(spans: list[Span]) -> list[Span]:
    if not spans:
        return []
    t0 = min(s.start_s for s in spans)
    return [Span(kind=s.kind, rank=s.rank, start_s=s.start_s - t0, dur_s=s.dur_s,
                 block=s.block, step=s.step, lane=s.lane) for s in spans]


def show_command(*, plan: Path, trace: Path | None, ranks: str | None, blocks: str | None,
                 width: int | None, chrome: Path | None, svg: Path | None,
                 console: Console) -> None:
    """`zoplan show`: the chart, the lane table and the summary; then the exports."""
    for path in (Path(p) for p in (chrome, svg) if p is not None):
        check_export(path)
    show = _show_input(Path(plan), trace, ranks, blocks, chart_columns(width, console))
    parts = show_parts(show)
    chrome_text = chrome_json(_chrome(show)) if chrome else None
    columns = LABEL_WIDTH + 1 + show.cells
    svg_text = render_svg(parts, columns, f"zoplan show {show.path.name}") if svg else None
    emit(console, parts)
    for out, text in ((chrome, chrome_text), (svg, svg_text)):
        if out is not None and text is not None:   # text is made whenever out is given
            try:
                atomic_write_text(out, text)
            except OSError as exc:   # a folder the OS refuses: read-only, /proc, a long name
                raise ZoError(f"cannot write {out}: {exc.strerror or exc}") from None
            console.print(f"wrote {out}", highlight=False)


def check_export(path: Path) -> None:
    """Refuse an export path before any work: no such folder, not a regular file, or a
    name the OS refuses (too long)."""
    try:
        if not path.parent.is_dir():
            raise ZoError(f"cannot write {path}: folder {path.parent} does not exist")
        if path.exists() and not path.is_file():
            raise ZoError(f"cannot write {path}: it exists and is not a regular file")
    except OSError as exc:
        raise ZoError(f"cannot write {path}: {exc.strerror or exc}") from None


def chart_columns(width: int | None, console: Console) -> int:
    """--width (at most MAX_COLUMNS), else the terminal's width capped at MAX_COLUMNS."""
    if width is None:
        return min(console.width, MAX_COLUMNS)
    if width > MAX_COLUMNS:
        raise ZoError(f"--width {width}: the chart is drawn at most {MAX_COLUMNS} columns wide")
    return width


def _show_input(path: Path, trace: Path | None, ranks: str | None, blocks: str | None,
                columns: int) -> ShowInput:
    plan = Plan.load(path)
    world, num_blocks = plan.layout.world_size, plan.model.num_layers
    cells = columns - LABEL_WIDTH - 1
    if cells < MIN_CELLS:
        raise ZoError(f"--width {columns}: the chart needs at least "
                      f"{LABEL_WIDTH + 1 + MIN_CELLS} columns")
    rank_sel = parse_selection(ranks, option="--ranks", count=world, owner="plan",
                               what="ranks") or list(range(world))
    block_sel = parse_selection(blocks, option="--blocks", count=num_blocks,
                                owner=f"model {plan.model.name}", what="blocks")
    predicted = shift_to_zero(plan.spans())
    if not predicted:
        raise ZoError(f"plan {path} holds no predicted spans to draw")
    measured = load_measured(Path(trace), plan, path) if trace is not None else None
    return ShowInput(plan=plan, path=path, predicted=predicted,
                     measured=measured, ranks=rank_sel, blocks=block_sel, cells=cells)


def chart_window(show: ShowInput) -> Window:
    """The whole step, or the time covering the selected blocks' tasks (both sources)."""
    sources = [show.predicted] + ([show.measured.spans] if show.measured else [])
    chosen = set(show.ranks)
    spans = [s for src in sources for s in src if s.rank in chosen]
    if show.blocks is not None:
        wanted = set(show.blocks)
        spans = [s for s in spans if s.block in wanted]
        if not spans:
            raise ZoError(f"--blocks {span_label(show.blocks)}: no tasks of these blocks "
                          f"on ranks {span_label(show.ranks)}")
    if not spans:
        raise ZoError(f"--ranks {span_label(show.ranks)}: the plan holds no spans of these "
                      f"ranks (it simulated ranks {span_label(ranks_of(show.predicted))})")
    return Window(start_s=min(s.start_s for s in spans), end_s=max(s.end_s for s in spans),
                  cells=show.cells)


def _lanes(spans: list[Span]) -> list[str]:
    present = {s.lane for s in spans}
    return [lane for lane in LANES if lane in present] or [LANES[0]]


def show_parts(show: ShowInput) -> list[tuple[Any, bool]]:
    """Everything `show` prints, as (renderable, soft_wrap) pairs."""
    window = chart_window(show)
    every = show.predicted + (show.measured.spans if show.measured else [])
    lanes = _lanes(every)
    parts: list[tuple[Any, bool]] = [(_header(show, window), False)]
    notes: list[str] = []
    pred_path = critical_path(show.predicted, show.plan.layout)
    summarised = False
    for title, spans, path in _sources(show, pred_path):
        present = set(ranks_of(spans))
        shown = [r for r in show.ranks if r in present]
        parts.append((Text(title, style="bold"), False))
        if not shown:
            parts.append((Text("  (no spans of the selected ranks)", style="dim"), False))
            continue
        chart = draw_chart(spans=spans, ranks=shown, lanes=lanes, window=window, critical=path)
        parts += [(line, True) for line in chart.lines]
        notes += [f"{title.split()[0]}: {note}" for note in chart.notes]
        summarised |= chart.summarised
    width = LABEL_WIDTH + 1 + show.cells
    parts.append((legend({s.kind for s in every}, summary=summarised, width=width), True))
    parts.append((_notes(show, notes), False))
    if show.measured:
        parts.append((lane_table(show, lanes), False))
    parts.append((summary_panel(show.plan, pred_path, show.predicted), False))
    return parts


def _sources(show: ShowInput,
             pred_path: list[Span]) -> Iterator[tuple[str, list[Span], list[Span]]]:
    yield (f"predicted step: {fmt_time(step_time(show.predicted))}", show.predicted, pred_path)
    if show.measured:
        m = show.measured
        yield (f"measured step {m.step}: {fmt_time(m.step_s)}", m.spans,
               critical_path(m.spans, show.plan.layout))


def _header(show: ShowInput, window: Window) -> Text:
    plan, layout = show.plan, show.plan.layout
    wl = plan.workload
    text = Text()
    text.append(plan.model.name, "cyan")
    devices = "CPU rank" if plan.device_kind == "cpu" else "GPU"
    devices += "" if layout.world_size == 1 else "s"
    resident = len(plan.resident_blocks)
    placed = (f", {resident} of {plan.model.num_layers} blocks resident"
              if resident else "")
    text.append(f" on {layout.world_size:,} {devices}, profile "
                f"{plan.data['profile']['name']}; layout {layout.label()}{placed}; batch "
                f"{wl.batch} x seq {wl.seq}, {wl.param_dtype}\n")
    blocks = f"blocks {span_label(show.blocks)}" if show.blocks else "whole step"
    text.append(f"window {fmt_time(window.start_s)} - {fmt_time(window.end_s)} ({blocks}), "
                f"ranks {span_label(show.ranks)}, one cell = {fmt_time(window.cell_s)}",
                style="dim")
    return text


def _notes(show: ShowInput, chart_notes: list[str]) -> Text:
    notes = list(dict.fromkeys(chart_notes))
    missing = sorted(set(show.ranks) - set(ranks_of(show.predicted)))
    if missing:
        notes.append(f"ranks {span_label(missing)} were not simulated (the plan holds spans "
                     f"of ranks {span_label(ranks_of(show.predicted))})")
    notes.append("critical path: from the last task back through each task's latest-"
                 "finishing predecessor (same rank; slice group for all-gathers, node for "
                 "write-backs, all ranks for the all-reduce)")
    if show.measured:
        notes += show.measured.notes
    return Text("\n".join(notes), style="dim")


def _chrome(show: ShowInput) -> ChromeTrace:
    plan = show.plan
    other: dict[str, object] = {"plan": str(show.path), "model": plan.model.name,
             "layout": plan.layout.label(), "step_time_s": plan.step_time_s,
             "predicted_pids": "rank",
             "measured_pids": f"{measured_pid_offset(plan.layout.world_size)} + rank"}
    if show.measured:
        other["measured_step"] = show.measured.step
    return chrome_trace(predicted=show.predicted,
                        measured=show.measured.spans if show.measured else None,
                        world_size=plan.layout.world_size, other=other)


def emit(console: Console, parts: list[tuple[Any, bool]]) -> None:
    """Print parts; chart lines are printed unwrapped (soft) at their own width."""
    for renderable, soft in parts:
        console.print(renderable, soft_wrap=soft, highlight=False)


def render_svg(parts: list[tuple[Any, bool]], columns: int, title: str) -> str:
    recorder = Console(record=True, width=max(columns, 60), force_terminal=True,
                       color_system="truecolor", file=io.StringIO(), legacy_windows=False)
    emit(recorder, parts)
    return recorder.export_svg(title=title, unique_id="zoplan")


def render_short_timeline(plan: Plan, console: Console) -> None:
    """A few rows: the first simulated rank's lanes, its critical path and the axis."""
    spans = shift_to_zero(plan.spans())
    if not spans:
        return
    rank = min(s.rank for s in spans)
    cells = max(MIN_CELLS, min(console.width, MAX_COLUMNS) - LABEL_WIDTH - 1)
    window = Window(start_s=0.0, end_s=step_time(spans), cells=cells)
    chart = draw_chart(spans=spans, ranks=[rank], lanes=_lanes(spans), window=window,
                       critical=critical_path(spans, plan.layout), blocks_row=False)
    console.print(Text(f"timeline of rank {rank} of {plan.layout.world_size}, step "
                       f"{fmt_time(plan.step_time_s)} (zoplan show PLAN for every rank)",
                       style="bold"), highlight=False)
    for line in chart.lines:
        console.print(line, soft_wrap=True)
    console.print(legend({s.kind for s in spans if s.rank == rank}, summary=False,
                         width=LABEL_WIDTH + 1 + cells))
