"""The panels under `zoplan show`'s chart: busy time per lane (predicted vs measured),
and the summary (step time, tokens/s, utilisation, bottleneck, memory against
capacity, speed-up over the baselines, the critical path's make-up)."""

from __future__ import annotations

from typing import Any

from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from zoplan.errors import ZoError
from zoplan.hardware import load_profile
from zoplan.plan import Plan
from zoplan.trace import Span, step_time
from zoplan.views.common import fmt_gib, fmt_time, layout_label
from zoplan.views.gantt import critical_breakdown, span_label
from zoplan.views.inputs import ShowInput


def ranks_of(spans: list[Span]) -> list[int]:
    return sorted({s.rank for s in spans})


def lane_busy(spans: list[Span], ranks: set[int]) -> dict[str, float]:
    """Busy seconds per lane, averaged over `ranks`."""
    busy: dict[str, float] = {}
    for span in spans:
        if span.rank in ranks:
            busy[span.lane] = busy.get(span.lane, 0.0) + span.dur_s
    return {lane: total / max(1, len(ranks)) for lane, total in busy.items()}


def lane_table(show: ShowInput, lanes: list[str]) -> Table:
    """Busy time per lane (mean over the ranks shown in both), predicted vs measured."""
    assert show.measured is not None, "lane_table needs a measured step"
    pred, meas = show.predicted, show.measured.spans
    common = set(show.ranks) & set(ranks_of(pred)) & set(ranks_of(meas))
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
    ranks = set(ranks_of(spans))
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
    found = plan.predicted.get("memory")
    memory: dict[str, Any] = found if isinstance(found, dict) else {}
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


def _first(data: dict[str, Any], keys: tuple[str, ...]) -> float | None:
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
    found = pred.get("memory")
    memory: dict[str, Any] = found if isinstance(found, dict) else {}
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
