"""What `zoplan rent` prints: one row per machine (the best layout, the step and its
range over the assumed figures, memory, ZO2 on one GPU, time and cost of 1,000 steps),
the fastest and the cheapest marked, and each profile's assumed figures listed."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from zoplan.hardware import GIB
from zoplan.search.rent import STEPS, Priced


def _secs(seconds: float) -> str:
    return f"{seconds:.3f}" if seconds < 100 else f"{seconds:.1f}"


def marks(rows: list[Priced]) -> dict[int, list[str]]:
    """Row index -> its marks ("fastest", "cheapest")."""
    out: dict[int, list[str]] = {i: [] for i in range(len(rows))}
    ran = [i for i, r in enumerate(rows) if not r.reason]
    if ran:
        out[min(ran, key=lambda i: rows[i].step_s)].append("fastest")
        costed = [i for i in ran if rows[i].cost() is not None]
        if costed:
            out[min(costed, key=lambda i: rows[i].cost()[0])].append("cheapest")  # type: ignore[index]
    return out


def render_rent(rows: list[Priced], console: Console, *, title: str) -> None:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    for col in ("machine", "GPUs", "layout", "step s (range)", "GPU GiB", "host GiB",
                "ZO2 s (xZO2)", f"h / {STEPS:,} steps", f"cost / {STEPS:,} steps", ""):
        table.add_column(col, justify="left" if col in ("machine", "layout", "") else "right")
    marked = marks(rows)
    for i, r in enumerate(rows):
        if r.reason:
            table.add_row(r.name or r.option.profile, str(r.option.gpus), "does not fit",
                          "-", "-", "-", "-", "-", "-", "")
            continue
        low, high = r.step_range_s
        zo2 = ("-" if r.zo2_step_s is None else f"{_secs(r.zo2_step_s)} "
               f"({r.zo2_step_s / r.step_s:.2f}x)" + ("" if r.zo2_fits else " does not fit"))
        hours = r.hours()
        cost = r.cost()
        table.add_row(r.name, f"{r.used_gpus} of {r.option.gpus}", r.layout + (
            "" if r.winner_stays else " (not the winner across the range)"),
            f"{_secs(r.step_s)} ({_secs(low)}-{_secs(high)})", f"{r.gpu_mem_bytes / GIB:.1f}",
            f"{r.host_mem_bytes / GIB:.0f}", zo2, f"{hours[0]:.2f} ({hours[1]:.2f}-{hours[2]:.2f})",
            "-" if cost is None else f"{cost[0]:,.2f} ({cost[1]:,.2f}-{cost[2]:,.2f})",
            ", ".join(marked[i]), style="bold" if marked[i] else None)
    console.print(table)
    for r in rows:
        if r.reason:
            console.print(f"{r.name or r.option.profile}: {r.reason}", highlight=False)
    for r in rows:
        moving = ", ".join(r.moving) or "none by 0.5% or more"
        console.print(f"{r.name}: {len(r.assumed)} assumed figures "
                      f"({', '.join(r.assumed) or 'none'}); those that move the answer: "
                      f"{moving}", highlight=False)
    console.print("step range: the profile's assumed figures across their plausible ranges "
                  "(docs/planner.md); ZO2: one GPU of the machine, the whole batch; cost: "
                  "price per GPU-hour x GPUs the plan uses", highlight=False)
