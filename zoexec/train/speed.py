"""The machine's speed through a traced CPU run: zoexec.profiler's speed check before
and after the steps and a probe between steps, on rank 0 with all cores while the other
ranks wait at a barrier. `zoplan calibrate` compares them with the profile's check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from zoexec.config import RunConfig
from zoexec.profiler.probe import SpeedProbe
from zoexec.runtime import groups as zgroups
from zoexec.runtime.errors import failing
from zoplan.execrules import probe_every, usable_cores
from zoplan.plan import Plan


@dataclass(kw_only=True, eq=False)
class SpeedMonitor:
    """The machine's speed through a traced CPU run, on rank 0 with all cores while the
    other ranks wait at a barrier: zoexec.profiler's speed check before and after the
    steps, and a probe (SpeedProbe.sample) after every `every` steps, between steps (not
    inside a step's time). `zoplan calibrate` compares them with the profile's speed
    check, to tell a machine that got slower from a wrong prediction. Does nothing on
    CUDA, without --trace, or with RunConfig.speed_checks off (rank 0 holds the probe's
    blocks and the allocator keeps their activations: about 90 MiB of host memory on
    an opt-125m run, which benchmarks/executor/bench_host_memory.py leaves out)."""

    env: zgroups.DistEnv
    threads: int
    every: int = 0                    # steps between probes (0: no probes, no checks)
    probe: SpeedProbe | None = None   # rank 0's SpeedProbe
    checks: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def make(cls, cfg: RunConfig, env: zgroups.DistEnv, threads: int) -> SpeedMonitor:
        if not cfg.logging.trace or env.is_cuda or not cfg.speed_checks:
            return cls(env=env, threads=threads)
        every = probe_every(Plan(cfg.plan).step_time_s)
        probe = None
        if env.rank == 0:
            probe = SpeedProbe()
        return cls(env=env, threads=threads, every=every, probe=probe)

    def check(self) -> None:
        """The full speed check (5 samples of each kind)."""
        if self.every:
            result = self._on_rank0(lambda: cast(SpeedProbe, self.probe).check(repeats=5))   # rank 0's
            if result is not None:
                self.checks.append(result)

    def after_step(self, done: int, steps: int) -> None:
        """A probe once `done` steps are done, every `every` steps, never after the last."""
        if self.every and done % self.every == 0 and done < steps:
            result = self._on_rank0(lambda: cast(SpeedProbe, self.probe).sample())
            if result is not None:
                self.probes.append({"after_step": done - 1, **result})

    def _on_rank0(self, job: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        self._barrier()
        result = None
        if self.env.rank == 0:
            torch.set_num_threads(usable_cores())
            try:
                result = job()
            finally:
                torch.set_num_threads(self.threads)
        self._barrier()
        return result

    def _barrier(self) -> None:
        with failing("speed", rank=self.env.rank):
            zgroups.host_barrier(self.env)

    def meta(self) -> dict[str, Any]:
        """The trace's meta entries: speed_check (before, after) and speed_probes."""
        if not self.every:
            return {}
        return {"speed_check": self.checks, "speed_probes": self.probes}
