"""A run's configuration: everything a rank needs, picklable (the launcher sends it to
the ranks)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoexec.maths.schedule import SCHEDULES, lr_at
from zoplan.layout import Layout
from zoplan.models import ModelSpec
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
    # checkpoints (zoexec.run.folder): snapshots every `save_every` steps and/or every
    # `save_every_s` seconds, the newest `keep` kept; a resume starts at `start_step`
    # from `init` after applying `replay` ((seed, g, lr) of the logged updates)
    save_every: int | None = None
    save_every_s: float | None = None
    keep: int = 2
    start_step: int = 0
    replay: tuple = ()
    resumed: bool = False
    on_nonfinite: str = "stop"   # a non-finite loss or g: "stop" the run, or "skip" the step
    lr_schedule: str = "constant"   # zoexec.maths.schedule: constant, linear, cosine
    warmup_steps: int = 0
    source_dir: str | None = None   # the model folder the run started from (its tokenizer)
    # what rank 0 reports (zoexec.run.report): metrics to "none" or "tensorboard" besides
    # metrics.jsonl, a progress line every `log_every` steps off a terminal (None: ~30 s)
    report_to: str = "none"
    log_every: int | None = None
    max_shard_bytes: int = 5 * 10**9   # saved weights: safetensors shards of at most this
    # the task (zoexec.data.tasks.TaskSpec.to_dict(); None: text) and the evaluation: the
    # eval set scored every `eval_every` steps (None: after the last step only)
    task: dict | None = None
    eval_data: str | None = None
    eval_every: int | None = None
    fail_at: tuple[int, int] | None = None   # for tests: rank `fail_at[0]` raises at step `fail_at[1]`
    delay_h2d: tuple[int, int, float] | None = None   # for tests: (rank, block, seconds) slept before each h2d of it

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        for name in ("lr", "eps", "weight_decay"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if not 0 <= self.start_step <= self.steps:   # == steps: a resume that only saves
            raise ValueError(f"start_step must be in 0..{self.steps}, got {self.start_step}")
        if self.save_every is not None and self.save_every < 1:
            raise ValueError(f"save_every must be >= 1 step, got {self.save_every}")
        if self.save_every_s is not None and not self.save_every_s > 0:
            raise ValueError(f"save_every_s must be > 0 seconds, got {self.save_every_s}")
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1, got {self.keep}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {self.lr_schedule!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in 0..{self.steps - 1}, got {self.warmup_steps}")
        if self.on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite must be 'stop' or 'skip', got {self.on_nonfinite!r}")
        if self.report_to not in ("none", "tensorboard"):
            raise ValueError(f"report_to must be 'none' or 'tensorboard', got {self.report_to!r}")
        if self.log_every is not None and self.log_every < 1:
            raise ValueError(f"log_every must be >= 1 step, got {self.log_every}")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1 step, got {self.eval_every}")
        if self.max_shard_bytes < 1:
            raise ValueError(f"max_shard_bytes must be >= 1, got {self.max_shard_bytes}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def lr_of(self, step: int) -> float:
        """The learning rate of `step` (zoexec.maths.schedule)."""
        return lr_at(step, lr=self.lr, schedule=self.lr_schedule, warmup=self.warmup_steps,
                     total=self.steps)

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

    @property
    def model(self) -> ModelSpec:
        return Plan(self.plan).model

    @property
    def tokenizer_dir(self) -> str | None:
        """Where the run's tokenizer is: the model folder it started from, else the
        weights it loads (None with random weights)."""
        return self.source_dir or (self.init if self.init != "random" else None)
