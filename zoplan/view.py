"""What `zoplan show`, `compare`, `models` and `profiles` print; Chrome and SVG exports.

`zoplan show plan.json` draws the predicted step as a Gantt chart (zoplan.gantt: cell,
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
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from zoplan.chrome import chrome_json, chrome_trace, measured_pid_offset
from zoplan.errors import ZoError
from zoplan.gantt import (LABEL_WIDTH, Window, critical_breakdown, critical_path,
                          draw_chart, legend, span_label)
from zoplan.hardware import GIB, load_profile, shipped_profiles
from zoplan.io import atomic_write_text, sha256_json
from zoplan.layout import Layout
from zoplan.models import catalogue
from zoplan.plan import Plan
from zoplan.trace import LANES, Span, read_trace, step_time

MIN_CELLS = 20
MIB = 2**20


# ---- formatting -----------------------------------------------------------------------
def fmt_time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1.0:
        return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def fmt_gib(num_bytes: float) -> str:
    if num_bytes < GIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / GIB:.1f} GiB"


def fmt_count(count: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if count >= div:
            return f"{count / div:.3g}{suffix}"
    return f"{count:.0f}"


def layout_label(layout: Any) -> str:
    """Label of a layout given as a dict (Layout.to_dict) or already as text."""
    if isinstance(layout, dict):
        try:
            return Layout(**layout).label()
        except (TypeError, ValueError):
            return str(layout)
    return str(layout)


# ---- catalogue listings ---------------------------------------------------------------
def render_models(console: Console) -> None:
    """Table of the model catalogue."""
    table = Table(title="model catalogue (zoplan optimize --model NAME); sizes in fp16",
                  title_justify="left")
    for name, justify in (("name", "left"), ("family", "left"), ("blocks", "right"),
                          ("hidden", "right"), ("params", "right"),
                          ("block MiB", "right"), ("resident MiB", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for name, spec in catalogue().items():
        table.add_row(name, spec.family, str(spec.num_layers), str(spec.hidden),
                      fmt_count(spec.total_params), f"{spec.block_bytes('fp16') / MIB:,.1f}",
                      f"{spec.resident_bytes('fp16') / MIB:,.1f}")
    console.print(table)


def render_profiles(console: Console) -> None:
    """Table of the shipped hardware profiles; a broken one shows its error in its row."""
    table = Table(title="shipped hardware profiles (zoplan optimize --profile NAME)",
                  title_justify="left")
    for name in ("name", "device", "GPUs", "GPU GiB", "H2D GB/s", "fabric GB/s", "host GiB"):
        table.add_column(name, justify="left" if name in ("name", "device", "fabric GB/s")
                         else "right", no_wrap=True, overflow="ellipsis",
                         max_width=16 if name in ("name", "device") else None)
    broken = []
    for name, path in shipped_profiles().items():
        try:
            table.add_row(*_profile_row(load_profile(path)))
        except (ZoError, ValueError, TypeError, KeyError) as exc:
            table.add_row(name, Text("broken (see below)", style="red"), "", "", "", "", "")
            broken.append(f"{name}: {exc}")
    if not table.rows:
        table.add_row("(none)", "", "", "", "", "", "")
    console.print(table)
    for line in broken:
        console.print(Text(f"broken profile {line}", style="red"), soft_wrap=True)


def _profile_row(profile) -> tuple[str, ...]:
    device, fabric = profile.device, profile.fabric
    return (profile.name, str(device.get("model") or device["kind"]),
            str(profile.gpus_per_node), f"{device['memory_gib']:.0f}",
            f"{profile.pcie['h2d_gbps']:g}", f"{fabric['kind']} {fabric['p2p_gbps']:g}",
            f"{profile.host['memory_gib']:.0f}")


# ---- selections -----------------------------------------------------------------------
def parse_selection(text: str | None, *, option: str, count: int, owner: str,
                    what: str) -> list[int] | None:
    """"0-3", "0,2,5" or "0-3,8" -> sorted indices; None when not given."""
    if text is None:
        return None
    values: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ZoError(f"{option} {text}: expected a range like 0-3 or a list like 0,2,5")
        lo, hi = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if hi < lo:
            raise ZoError(f"{option} {text}: range {lo}-{hi} runs backwards")
        if hi >= count:
            raise ZoError(f"{option} {text}: {owner} has {index_range(what, count)}")
        values.update(range(lo, hi + 1))
    return sorted(values)


def index_range(what: str, count: int) -> str:
    """("ranks", 4) -> "ranks 0-3"; ("ranks", 1) -> "rank 0"."""
    return f"{what} 0-{count - 1}" if count > 1 else f"{what.rstrip('s')} 0"


# ---- the measured step ----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MeasuredStep:
    """The trace's representative step, shifted to start at 0."""

    step: int
    spans: list[Span]
    steps: list[int]
    median_s: float
    notes: list[str]

    @property
    def step_s(self) -> float:
        return step_time(self.spans)


def load_measured(directory: Path, plan: Plan, plan_path: Path) -> MeasuredStep:
    meta, spans = read_trace(directory)
    world = plan.layout.world_size
    if not spans:
        raise ZoError(f"trace {directory} holds no spans")
    if isinstance(meta.get("world_size"), int) and meta["world_size"] != world:
        raise ZoError(f"trace {directory} was recorded with {meta['world_size']} ranks; "
                      f"plan has {world}")
    top = max(s.rank for s in spans)
    if top >= world or min(s.rank for s in spans) < 0:
        raise ZoError(f"trace {directory} has spans of rank {top}; plan has "
                      f"{index_range('ranks', world)}")
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


def _trace_notes(meta: dict, plan: Plan, plan_path: Path, steps: list[int], chosen: int,
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


# ---- show -----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ShowInput:
    plan: Plan
    path: Path
    predicted: list[Span]
    measured: MeasuredStep | None
    ranks: list[int]
    blocks: list[int] | None
    cells: int


def show_command(*, plan: Path, trace: Path | None, ranks: str | None, blocks: str | None,
                 width: int | None, chrome: Path | None, svg: Path | None,
                 console: Console) -> None:
    """`zoplan show`: the chart, the lane table and the summary; then the exports."""
    outputs = [Path(p) for p in (chrome, svg) if p is not None]
    for path in outputs:
        if not path.parent.is_dir():
            raise ZoError(f"cannot write {path}: folder {path.parent} does not exist")
    show = _show_input(Path(plan), trace, ranks, blocks, width or console.width)
    parts = show_parts(show)
    chrome_text = chrome_json(_chrome(show)) if chrome else None
    columns = LABEL_WIDTH + 1 + show.cells
    svg_text = render_svg(parts, columns, f"zoplan show {show.path.name}") if svg else None
    emit(console, parts)
    for path, text in ((chrome, chrome_text), (svg, svg_text)):
        if path is not None:
            atomic_write_text(path, text)
            console.print(f"wrote {path}", highlight=False)


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
                      f"ranks (it simulated ranks {span_label(_ranks_of(show.predicted))})")
    return Window(start_s=min(s.start_s for s in spans), end_s=max(s.end_s for s in spans),
                  cells=show.cells)


def _ranks_of(spans: list[Span]) -> list[int]:
    return sorted({s.rank for s in spans})


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
        present = set(_ranks_of(spans))
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


def _sources(show: ShowInput, pred_path: list[Span]):
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
    text.append(f" on {layout.world_size} {plan.device_kind} rank(s), profile "
                f"{plan.data['profile']['name']}; layout {layout.label()}; batch {wl.batch} x "
                f"seq {wl.seq}, {wl.param_dtype}\n")
    blocks = f"blocks {span_label(show.blocks)}" if show.blocks else "whole step"
    text.append(f"window {fmt_time(window.start_s)} - {fmt_time(window.end_s)} ({blocks}), "
                f"ranks {span_label(show.ranks)}, one cell = {fmt_time(window.cell_s)}",
                style="dim")
    return text


def _notes(show: ShowInput, chart_notes: list[str]) -> Text:
    notes = list(dict.fromkeys(chart_notes))
    missing = sorted(set(show.ranks) - set(_ranks_of(show.predicted)))
    if missing:
        notes.append(f"ranks {span_label(missing)} were not simulated (the plan holds spans "
                     f"of ranks {span_label(_ranks_of(show.predicted))})")
    notes.append("critical path: from the last task back through each task's latest-"
                 "finishing predecessor (same rank; slice group for all-gathers, node for "
                 "write-backs, all ranks for the all-reduce)")
    if show.measured:
        notes += show.measured.notes
    return Text("\n".join(notes), style="dim")


# ---- tables and panels ----------------------------------------------------------------
def lane_busy(spans: list[Span], ranks: set[int]) -> dict[str, float]:
    """Busy seconds per lane, averaged over `ranks`."""
    busy: dict[str, float] = {}
    for span in spans:
        if span.rank in ranks:
            busy[span.lane] = busy.get(span.lane, 0.0) + span.dur_s
    return {lane: total / max(1, len(ranks)) for lane, total in busy.items()}


def lane_table(show: ShowInput, lanes: list[str]) -> Table:
    """Busy time per lane (mean over the ranks shown in both), predicted vs measured."""
    pred, meas = show.predicted, show.measured.spans
    common = set(show.ranks) & set(_ranks_of(pred)) & set(_ranks_of(meas))
    ranks = common or set(show.ranks)
    p_busy, m_busy = lane_busy(pred, ranks), lane_busy(meas, ranks)
    p_step, m_step = step_time(pred), step_time(meas)
    table = Table(title=f"busy time per lane, mean over ranks {span_label(sorted(ranks))}",
                  title_justify="left")
    for name in ("lane", "predicted", "measured", "meas/pred", "pred util", "meas util"):
        table.add_column(name, justify="left" if name == "lane" else "right")
    for lane in lanes:
        p, m = p_busy.get(lane, 0.0), m_busy.get(lane, 0.0)
        table.add_row(lane, fmt_time(p), fmt_time(m), _ratio(m, p),
                      f"{p / p_step:.0%}", f"{m / m_step:.0%}")
    table.add_row("step", fmt_time(p_step), fmt_time(m_step), _ratio(m_step, p_step), "", "",
                  style="bold")
    return table


def _ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:.2f}x" if predicted > 0 else "-"


def utilisation(plan: Plan, spans: list[Span]) -> tuple[dict[str, float], str]:
    """The plan's predicted.utilisation, else busy time per lane over the step."""
    given = plan.predicted.get("utilisation")
    if isinstance(given, dict) and given:
        return {str(k): float(v) for k, v in given.items()}, "plan"
    ranks = set(_ranks_of(spans))
    step = step_time(spans) or 1.0
    return {lane: busy / step for lane, busy in lane_busy(spans, ranks).items()}, "lanes"


def _bar(fraction: float, width: int = 10) -> Text:
    filled = max(0, min(width, int(round(fraction * width))))
    text = Text("▕")
    text.append("█" * filled, "green" if fraction < 0.9 else "red")
    text.append("░" * (width - filled), "bright_black")
    text.append(f"▏ {fraction:4.0%}")
    return text


def _util_text(plan: Plan, spans: list[Span]) -> Text:
    util, origin = utilisation(plan, spans)
    ordered = sorted(util.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ordered[:10]
    width = max(len(k) for k, _ in shown) if shown else 0
    text = Text()
    for i, (name, value) in enumerate(shown):
        text.append(("\n" if i else "") + f"{name:<{width}} ")
        text.append_text(_bar(value))
    if len(ordered) > len(shown):
        text.append(f"\n+{len(ordered) - len(shown)} more")
    if origin == "lanes":
        text.append("\n(busy share of each lane, from the spans)", style="dim")
    return text


def capacities(plan: Plan) -> tuple[float | None, float | None, str]:
    """(GPU bytes, host bytes per node, note): from the plan (predicted.memory, written
    by zoplan.search, or the profile section), else from its profile loaded by name."""
    prof = plan.data["profile"]
    memory = plan.predicted.get("memory") if isinstance(plan.predicted.get("memory"), dict) else {}
    gpu = _first({**prof, **memory}, ("gpu_usable_bytes", "device_memory_bytes",
                                      "gpu_mem_capacity_bytes"))
    host = _first({**prof, **memory}, ("host_bytes_limit", "host_memory_bytes",
                                       "host_mem_capacity_bytes"))
    if gpu is not None and host is not None:
        return gpu, host, ""
    try:
        hw = load_profile(prof["name"])
    except ZoError:
        return gpu, host, f"capacity unknown: profile {prof['name']!r} not found"
    note = "" if hw.sha256 == prof.get("sha256") else "profile changed since planning"
    return (gpu if gpu is not None else hw.device_memory_bytes,
            host if host is not None else hw.host_memory_bytes, note)


def _first(data: dict, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if isinstance(data.get(key), (int, float)):
            return float(data[key])
    return None


def _mem_text(used: float, capacity: float | None, where: str, parts: Any) -> Text:
    """Use against capacity, then the plan's breakdown (predicted.memory) if any."""
    text = Text(f"{fmt_gib(used)} {where}")
    if capacity is not None:
        share = used / capacity if capacity else float("inf")
        style = "red" if share > 1 else ("yellow" if share > 0.9 else "")
        text = Text(f"{fmt_gib(used)} of {fmt_gib(capacity)} {where} ({share:.0%})", style=style)
    if isinstance(parts, dict) and parts:
        ordered = sorted(((k, v) for k, v in parts.items() if isinstance(v, (int, float))),
                         key=lambda kv: -kv[1])
        text.append("\n" + ", ".join(f"{k} {fmt_gib(v)}" for k, v in ordered), style="dim")
    return text


def _baseline_text(plan: Plan, name: str) -> Text | None:
    base = (plan.data.get("baselines") or {}).get(name)
    if not isinstance(base, dict) or not isinstance(base.get("step_time_s"), (int, float)):
        return None
    speedup = base["step_time_s"] / plan.step_time_s
    style = "green" if speedup >= 1 else "red"
    text = Text()
    text.append(f"{speedup:.2f}x", style)
    text.append(f" (its step: {fmt_time(base['step_time_s'])}"
                + (f", layout {layout_label(base['layout'])}" if base.get("layout") else "")
                + ")")
    return text


def summary_panel(plan: Plan, path: list[Span], spans: list[Span]) -> Panel:
    pred = plan.predicted
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    step = plan.step_time_s
    lower = pred.get("lower_bound_s")
    bound = (f"  (lower bound {fmt_time(lower)}, {step / lower:.2f}x of it)"
             if isinstance(lower, (int, float)) and lower > 0 else "")
    grid.add_row("step time", f"{fmt_time(step)}{bound}")
    grid.add_row("throughput", f"{pred['tokens_per_s']:,.0f} tokens/s "
                 f"({plan.workload.tokens_per_step:,} tokens per step)")
    grid.add_row("bottleneck", Text(str(pred["bottleneck"]), style="bold yellow"))
    grid.add_row("utilisation", _util_text(plan, spans))
    grid.add_row("critical path", _path_text(path))
    gpu_cap, host_cap, note = capacities(plan)
    memory = pred.get("memory") if isinstance(pred.get("memory"), dict) else {}
    device = ("rank memory", "per rank") if plan.device_kind == "cpu" else ("GPU memory",
                                                                          "per GPU")
    grid.add_row(device[0], _mem_text(pred["gpu_mem_bytes"], gpu_cap, device[1],
                                      memory.get("gpu")))
    grid.add_row("host memory", _mem_text(pred["host_mem_bytes"], host_cap, "per node",
                                          memory.get("host")))
    if note:
        grid.add_row("", Text(note, style="dim"))
    for name, label in (("zo2", "speed-up vs ZO2"), ("unsliced", "vs unsliced")):
        grid.add_row(label, _baseline_text(plan, name) or Text("n/a", style="dim"))
    title = f"summary: {plan.model.name}, {plan.layout.label()}"
    return Panel(grid, title=title, title_align="left", expand=False)


def _path_text(path: list[Span]) -> Text:
    parts = critical_breakdown(path)
    total = sum(parts.values())
    if not total:
        return Text("-")
    ordered = sorted(parts.items(), key=lambda kv: -kv[1])
    return Text(", ".join(f"{kind} {sec / total:.0%}" for kind, sec in ordered)
                + f" of {fmt_time(total)}")


# ---- exports --------------------------------------------------------------------------
def _chrome(show: ShowInput) -> dict:
    plan = show.plan
    other = {"plan": str(show.path), "model": plan.model.name,
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


# ---- the optimizer's short timeline ---------------------------------------------------
def render_short_timeline(plan: Plan, console: Console) -> None:
    """A few rows: the first simulated rank's lanes, its critical path and the axis."""
    spans = shift_to_zero(plan.spans())
    if not spans:
        return
    rank = min(s.rank for s in spans)
    cells = max(MIN_CELLS, console.width - LABEL_WIDTH - 1)
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


# ---- compare --------------------------------------------------------------------------
def compare_command(*, plans: list[Path], console: Console) -> None:
    """Plans side by side, or one plan's ranked candidates."""
    if not plans:
        raise ZoError("compare needs at least one plan.json")
    loaded = [Plan.load(p) for p in plans]
    if len(loaded) == 1:
        console.print(candidates_table(loaded[0], Path(plans[0])))
        return
    console.print(plans_table(loaded, [Path(p) for p in plans]))


def plans_table(plans: list[Plan], paths: list[Path]) -> Table:
    """Plans side by side: one column per plan, one row per figure."""
    table = Table(title="plans side by side (speed-up vs the first)", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("", style="bold", no_wrap=True)
    for path in paths:
        table.add_column(path.name, justify="right", overflow="fold")
    first = plans[0].step_time_s
    rows = {"model": [p.model.name for p in plans],
            "profile": [p.data["profile"]["name"] for p in plans],
            "layout": [p.layout.label() for p in plans],
            "step": [fmt_time(p.step_time_s) for p in plans],
            "tokens/s": [f"{p.predicted['tokens_per_s']:,.0f}" for p in plans],
            "GPU mem": [fmt_gib(p.predicted["gpu_mem_bytes"]) for p in plans],
            "host mem": [fmt_gib(p.predicted["host_mem_bytes"]) for p in plans],
            "bottleneck": [str(p.predicted["bottleneck"]) for p in plans],
            "speed-up": [f"{first / p.step_time_s:.2f}x" for p in plans]}
    for name, values in rows.items():
        table.add_row(name, *values)
    return table


def _table(title: str, columns: list[str], caption: str | None = None) -> Table:
    """A compact table: every column but the last (free text) kept on one line."""
    table = Table(title=title, title_justify="left", caption=caption, box=box.SIMPLE_HEAD,
                  show_edge=False, collapse_padding=True)
    numeric = {"#", "step", "tok/s", "GPU GiB", "host GiB", "speed-up", "×best"}
    for i, name in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(name, justify="right" if name in numeric else "left",
                         no_wrap=not last, min_width=10 if last else None)
    return table


def _gib(num_bytes: Any) -> str:
    return f"{num_bytes / GIB:.1f}" if isinstance(num_bytes, (int, float)) else "-"


def candidates_table(plan: Plan, path: Path) -> Table:
    candidates = plan.data.get("candidates") or []
    if not candidates:
        raise ZoError(f"plan {path} lists no candidates; give two or more plans to compare")
    pruned = plan.data.get("pruned") or []
    caption = f"{len(pruned)} layout(s) pruned before simulation" if pruned else None
    table = _table(f"ranked candidates of {path.name} ({plan.model.name}, "
                   f"{plan.layout.world_size} ranks)",
                   ["#", "layout", "step", "tok/s", "GPU GiB", "host GiB", "×best",
                    "bottleneck"], caption)
    best = _num(candidates[0], "step_time_s")
    for i, cand in enumerate(candidates, 1):
        step = _num(cand, "step_time_s")
        table.add_row(str(i), cand.get("label") or layout_label(cand.get("layout")),
                      fmt_time(step) if step else "-", _fmt(cand, "tokens_per_s", "{:,.0f}"),
                      _gib(cand.get("gpu_mem_bytes")), _gib(cand.get("host_mem_bytes")),
                      f"{step / best:.2f}x" if step and best else "-",
                      str(cand.get("bottleneck", "-")))
    return table


def _num(data: dict, key: str) -> float | None:
    value = data.get(key) if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _fmt(data: dict, key: str, pattern: str) -> str:
    value = _num(data, key)
    return "-" if value is None else pattern.format(value)
