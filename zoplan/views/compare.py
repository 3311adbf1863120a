"""`zoplan compare`: plans side by side, or one plan's ranked candidates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from zoplan.errors import ZoError
from zoplan.hardware import GIB
from zoplan.plan import Plan
from zoplan.views.common import fmt_gib, fmt_time, layout_label


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
            _mem_name(plans) + " mem": [fmt_gib(p.predicted["gpu_mem_bytes"]) for p in plans],
            "host mem": [fmt_gib(p.predicted["host_mem_bytes"]) for p in plans],
            "bottleneck": [str(p.predicted["bottleneck"]) for p in plans],
            "speed-up": [f"{first / p.step_time_s:.2f}x" for p in plans]}
    for name, values in rows.items():
        table.add_row(name, *values)
    return table


def _mem_name(plans: list[Plan]) -> str:
    """The device memory column's name: "GPU", or "rank" when every plan is of CPU ranks."""
    return "rank" if all(p.device_kind == "cpu" for p in plans) else "GPU"


def _table(title: str, columns: list[str], caption: str | None = None) -> Table:
    """A compact table: every column but the last (free text) kept on one line."""
    table = Table(title=title, title_justify="left", caption=caption, box=box.SIMPLE_HEAD,
                  show_edge=False, collapse_padding=True)
    numeric = {"#", "step", "tok/s", "GPU GiB", "rank GiB", "host GiB", "speed-up", "×best"}
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
                   ["#", "layout", "step", "tok/s", f"{_mem_name([plan])} GiB", "host GiB", "×best",
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


def _num(data: object, key: str) -> float | None:
    value = data.get(key) if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _fmt(data: object, key: str, pattern: str) -> str:
    value = _num(data, key)
    return "-" if value is None else pattern.format(value)
