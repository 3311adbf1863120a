"""What `zoplan profile` shows: progress while it measures, the measured figures after."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from zoplan.hardware import HardwareProfile
from zoplan.profiling import Say

KIB = 2**10
# The figures the summary shows, where the profile has them (CPU and GPU profiles differ).
SUMMARY_FIGURES = (
    ("device", ("hbm_gbps",)),
    ("pcie", ("h2d_gbps", "d2h_gbps", "h2d_duplex_gbps", "d2h_duplex_gbps",
              "uplink_h2d_duplex_gbps", "uplink_d2h_duplex_gbps")),
    ("host", ("mem_bw_gbps",)),
    ("collective", ("latency_us", "allreduce_small_us")),
    ("compute", ("peak_tflops", "tf32_tflops", "fp32_tflops", "m_half_tokens", "overhead_us",
                 "mem_gbps", "zo_ns_per_param", "z_launch_us", "rank_scaling",
                 "zo_rank_scaling", "attn_tflops", "elem_ns", "rope_overhead_us",
                 "z_ns_per_elem", "z_call_us", "z_chunk_us", "zo_pass_ns", "z_rank_scaling",
                 "mem_rank_scaling", "rank_jitter")),
)


@contextlib.contextmanager
def profile_progress(console: Console) -> Iterator[tuple[Say, Say]]:
    """(tick, warn) for zoexec.profiler.measure: a spinner with the current stage on
    stderr, each stage printed as a dim line, warnings in yellow on `console`."""
    stderr = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("[bold]zoplan profile[/]"),
                  TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=stderr, transient=False) as progress:
        task = progress.add_task("measuring", total=None)

        def tick(message: str) -> None:
            progress.update(task, description=escape(message))
            progress.console.print(f"  [dim]{escape(message)}[/]", highlight=False)

        def warn(message: str) -> None:
            console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)
        yield tick, warn
        progress.update(task, description="done")


def render_summary(profile: HardwareProfile, path: Path, console: Console) -> None:
    table = Table(title=f"{profile.name}: measured figures", show_lines=False)
    for col in ("figure", "value", "how it was measured (see sources)"):
        table.add_column(col, no_wrap=col == "figure")
    data = profile.to_dict()   # the file's figures, shown (zoplan.hardware.DATA_READERS)
    rows = [(f"{section}.{key}", data[section][key])
            for section, keys in SUMMARY_FIGURES for key in keys if key in data[section]]
    for key, value in rows:
        how = re.sub(r"^\[M\] zoplan profile \S+ ", "", profile.sources.get(key, ""))
        table.add_row(key, f"{value:g}", how)
    busbw = ", ".join(f"{int(b) // KIB} KiB: {bw:g}" for b, bw in data["collective"]["allgather_busbw"])
    console.print(table)
    console.print(f"all-gather bus bandwidth (GB/s): {busbw}", highlight=False)
    line = (profile.extra().get("provenance") or {}).get("disturbance")
    if line:
        console.print(f"measured in {escape(line)}", highlight=False)
    console.print(f"wrote {path}", highlight=False)
