"""What `zoplan optimize --tuning auto` prints after the search: the best full-parameter
plan and the best LoRA plan side by side (zoplan.search.tuning)."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from zoplan.plan import Plan
from zoplan.search.tuning import TuningRow, tuning_row

GB = 1e9


def _size(num_bytes: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= size:
            return f"{num_bytes / size:,.1f} {unit}"
    return f"{num_bytes:,.0f} B"


def tunings_table(plans: dict[str, Plan], chosen: str) -> Table:
    """One row per tuning: layout, predicted step, PCIe traffic per node and step (h2d
    + d2h), snapshot size, memory."""
    table = Table(title="full-parameter vs LoRA MeZO (best plan of each; PCIe per node "
                        "and step)", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, collapse_padding=True)
    for col in ("tuning", "layout", "step s", "PCIe h2d", "PCIe d2h", "snapshot",
                "GPU GB", "host GB"):
        table.add_column(col, justify="left" if col in ("tuning", "layout") else "right")
    for tuning, plan in plans.items():
        row = tuning_row(plan)
        table.add_row(*_cells(row), style="bold green" if tuning == chosen else None)
    return table


def _cells(row: TuningRow) -> list[str]:
    resident = f" r{row.resident_blocks}" if row.resident_blocks else ""
    return [row.tuning, row.label + resident, f"{row.step_time_s:.3f}", _size(row.h2d_bytes),
            _size(row.d2h_bytes), _size(row.snapshot_bytes), f"{row.gpu_mem_bytes / GB:.1f}",
            f"{row.host_mem_bytes / GB:.1f}"]


def render_tunings(plans: dict[str, Plan], chosen: str, console: Console, *,
                   output: Path) -> None:
    console.print(tunings_table(plans, chosen))
    full, lora = plans["full"], plans["lora"]
    ratio = full.step_time_s / lora.step_time_s
    console.print(f"LoRA's step is {ratio:.2f}x {'faster' if ratio >= 1 else 'slower'} than "
                  f"full MeZO's; wrote the {chosen} plan to {output} (docs/lora.md: "
                  f"accuracy and when to pick which)", highlight=False)
