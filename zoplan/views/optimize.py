"""What `zoplan optimize` prints: a progress bar while it searches, then the winner, the
baselines and the top candidates, and a short timeline of the winner."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from zoplan.errors import ZoError
from zoplan.hardware import GIB
from zoplan.layout import axes_label
from zoplan.plan import Plan


@contextlib.contextmanager
def search_progress(*, enabled: bool):
    """Yields `progress(total) -> tick`, drawing a rich bar on stderr (or None). The bar
    starts with the search: a request refused before it prints nothing but its error."""
    if not enabled:
        yield None
        return
    bar = Progress(TextColumn("searching layouts"), BarColumn(), MofNCompleteColumn(),
                   console=Console(stderr=True), transient=True)

    def progress(total: int):
        bar.start()
        task = bar.add_task("search", total=total)
        return lambda: bar.advance(task)
    try:
        yield progress
    finally:
        if bar.live.is_started:
            bar.stop()


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f}"


def _secs(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.3f}" if seconds < 100 else f"{seconds:.1f}"


MAX_TOP = 10_000


def check_top(top: int) -> None:
    """--top: the candidates shown, 0..MAX_TOP (check it before searching)."""
    if not 0 <= top <= MAX_TOP:
        raise ZoError(f"--top {top}: show 0..{MAX_TOP} candidates")


def render_optimize(plan: Plan, console, *, top: int, output: Path,
                    profile_arg: str | None) -> None:
    check_top(top)
    d = plan.data
    console.print(_headline(d, profile_arg), highlight=False)
    shown = min(top, len(d["candidates"]))
    table = Table(title=f"top {shown} of {len(d['candidates'])} simulated layouts "
                        "(memory in GiB: per GPU, per node's host)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  collapse_padding=True)
    for col in ("#", "layout", "update", "step s", "tok/s", "xZO2", "GPU", "host", "bottleneck"):
        table.add_column(col, justify="left" if col in ("layout", "update", "bottleneck")
                         else "right", no_wrap=col != "bottleneck")
    zo2 = d["baselines"]["zo2"]["step_time_s"]
    for i, cand in enumerate(d["candidates"][:top], 1):
        table.add_row(*_row(str(i), cand, zo2), style="bold green" if i == 1 else None)
    table.add_section()
    for key, title in (("zo2", "ZO2"), ("unsliced", "s1")):
        base = d["baselines"][key]
        if base.get("step_time_s") is not None:
            table.add_row(*_row(title, base, zo2), style="dim")
    console.print(table)
    for line in _summary(d, output):
        console.print(line, highlight=False)


def _headline(d: dict, profile_arg: str | None) -> str:
    w, s = d["workload"], d["search"]
    prof = d["profile"]["name"] + ("" if profile_arg else " (default profile)")
    nodes = f" ({s['nodes']} nodes)" if s["nodes"] > 1 else ""
    gpus = f"{s['gpus']} GPU" + ("s" if s["gpus"] != 1 else "")
    return (f"[bold]{d['model']['name']}[/] on {gpus}{nodes}, {prof}; "
            f"batch {w['batch']} x seq {w['seq']}; precision {s['precision']}")


UPDATE_SHORT = {"stochastic": "stoch"}   # the table's update column


def _row(first: str, cand: dict, zo2: float | None) -> list[str]:
    speed = _ratio(zo2 / cand["step_time_s"]) if zo2 else "-"
    util = cand.get("bottleneck_utilisation")
    neck = cand["bottleneck"] + (f" {util:.0%}" if util is not None else "")
    approx = "~" if cand.get("method") == "extrapolated" else ""
    update = cand.get("update") or (cand.get("workload") or {}).get("update", "")
    return [first, cand["label"], UPDATE_SHORT.get(update, update),
            approx + _secs(cand["step_time_s"]),
            f"{cand['tokens_per_s']:,.0f}", speed, _gib(cand["gpu_mem_bytes"]),
            f"{cand['host_mem_bytes'] / GIB:.0f}", neck]


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _faster(ratio: float) -> str:
    return f"{_ratio(ratio)}x faster" if ratio >= 1 else f"{_ratio(1 / ratio)}x slower"


def _summary(d: dict, output: Path) -> list[str]:
    p, base = d["predicted"], d["baselines"]
    lines = [f"[bold]winner[/] {d['candidates'][0]['label']}, update {d['workload']['update']}: "
             f"{_secs(p['step_time_s'])} s/step "
             f"(lower bound {_secs(p['lower_bound_s'])} s, bottleneck {p['bottleneck']}), "
             f"GPU {_gib(p['gpu_mem_bytes'])} of {_gib(p['memory']['gpu_usable_bytes'])} GiB, "
             f"host {_gib(p['host_mem_bytes'])} of {_gib(p['memory']['host_bytes_limit'])} GiB"]
    for key, title in (("zo2", "ZO2 baseline (1 GPU, whole batch)"),
                       ("unsliced", "unsliced baseline (slices 1)")):
        b = base[key]
        if b.get("step_time_s") is None:
            lines.append(f"{title}: none ({b.get('reason', '')})")
            continue
        note = "" if b.get("fits", True) else " - " + b.get("reason", "")
        lines.append(f"{title}: {b['label']} {_secs(b['step_time_s'])} s/step, winner is "
                     f"{_faster(b['step_time_s'] / p['step_time_s'])}{note}")
    lines.append("~ extrapolated from reduced-block simulations (two extrapolations agree "
                 "within 0.5%); ZO2 = one GPU, whole batch; s1 = best unsliced layout; "
                 "update: master = fp32 master weights, stoch = 16-bit with stochastic "
                 "rounding, plain = 16-bit rounded to nearest (docs/precision.md)")
    lines += _pruned_lines(d.get("pruned", []))
    lines.append(f"plan written to {output}")
    return lines


def _pruned_lines(pruned: list[dict], *, examples: int = 3) -> list[str]:
    """Counts of pruned layouts by reason, and the first few reasons that are not the
    bound (those say what does not fit or is invalid, with the numbers)."""
    kinds: dict[str, int] = {}
    for p in pruned:
        kind = p["reason"].split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return ["pruned: none"]
    lines = ["pruned: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))]
    shown: set[str] = set()
    for p in pruned:
        if p["reason"].startswith("bound") or p["reason"] in shown or len(shown) == examples:
            continue
        shown.add(p["reason"])
        lines.append(f"  {axes_label(p['layout'])}: {p['reason']}")
    return lines
