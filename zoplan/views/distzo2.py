"""`zoplan distzo2`: DistZO2's naive and sliced configurations side by side, each lane's
share of the step's GPU activity (zoplan.pricing.distzo2), and the orderings."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from zoplan.errors import ZoError
from zoplan.hardware import load_profile
from zoplan.models import DTYPE_BYTES, get_model
from zoplan.pricing.distzo2 import LANES, LaneStep, both_configs


def distzo2_configs(*, model: str, gpus: int, profile: str, batch: int, seq: int,
                    pertp: int, precision: str, pageable: bool) -> dict[str, LaneStep]:
    """Both configurations of one setup; a ZoError for a setup that cannot run."""
    if precision not in DTYPE_BYTES:
        raise ZoError(f"--precision must be one of {', '.join(DTYPE_BYTES)}, got {precision!r}")
    if pertp not in (1, 2) or gpus < pertp or gpus % pertp:
        raise ZoError(f"--pertp {pertp} with --gpus {gpus}: pertp is 1 or 2 and divides gpus")
    spec, prof = get_model(model), load_profile(profile)
    if prof.is_cpu:
        raise ZoError(f"profile {prof.name} is a CPU profile: DistZO2 needs CUDA streams")
    if gpus > prof.gpus_per_node:
        raise ZoError(f"--gpus {gpus}: profile {prof.name} has {prof.gpus_per_node} GPUs a node")
    ddp = gpus // pertp
    if batch % ddp:
        raise ZoError(f"--batch {batch} is not divisible by ddp ({ddp} = gpus / pertp)")
    if pageable and "pageable_h2d_gbps" not in prof.to_dict()["pcie"]:
        raise ZoError(f"--pageable: profile {prof.name} has no pcie.pageable_h2d_gbps and "
                      "pageable_d2h_gbps")
    return both_configs(spec, prof, batch=batch, seq=seq, pertp=pertp, ddp=ddp,
                        dtype=precision, pinned=not pageable)


def render_distzo2(configs: dict[str, LaneStep], console: Console, *, title: str) -> None:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    for col in ("config", "slices", "step s", *(f"{lane} %" for lane in LANES), "busiest first"):
        table.add_column(col, justify="left" if col in ("config", "busiest first") else "right")
    for name, lanes in configs.items():
        shares = lanes.shares
        table.add_row(name, str(lanes.slices), f"{lanes.step_s:.3f}",
                      *(f"{100 * shares[lane]:.0f}" for lane in LANES), " > ".join(lanes.order))
    console.print(table)
    naive, sliced = configs["naive"], configs["sliced"]
    console.print(f"sliced over naive: {naive.step_s / sliced.step_s:.2f}x; lane % = busy "
                  f"seconds of the lane / step (a profiler's per-stream view); a block's "
                  f"period is set by {naive.program.bound} (naive) and {sliced.program.bound} "
                  f"(sliced)", highlight=False)
