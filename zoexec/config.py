"""A run's configuration: everything a rank needs, picklable (the launcher sends it to
the ranks)."""

from __future__ import annotations

from dataclasses import dataclass

from zoplan.layout import Layout
from zoplan.plan import Plan
from zoplan.workload import Workload


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a rank needs; picklable (the launcher sends it to the ranks)."""

    plan: dict
    plan_path: str = "plan.json"
    init: str = "random"
    data: str = "synthetic"
    steps: int = 10
    seed: int = 0
    lr: float = 1e-6
    eps: float = 1e-3
    weight_decay: float = 0.0
    out_dir: str | None = None
    trace_dir: str | None = None
    threads: int | None = None
    run_id: str = "run"
    progress: bool = True
    speed_checks: bool = True   # traced CPU runs: speed checks and probes (SpeedMonitor)
    fail_at: tuple[int, int] | None = None   # for tests: rank `fail_at[0]` raises at step `fail_at[1]`
    delay_h2d: tuple[int, int, float] | None = None   # for tests: (rank, block, seconds) slept before each h2d of it

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        for name in ("lr", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    # typed views of the plan: zoplan.plan.Plan reads them (the plan is validated on load)
    @property
    def layout(self) -> Layout:
        return Plan(self.plan).layout

    @property
    def workload(self) -> Workload:
        return Plan(self.plan).workload

    @property
    def device_kind(self) -> str:
        return Plan(self.plan).device_kind
