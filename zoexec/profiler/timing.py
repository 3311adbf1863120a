"""Timing helpers of the profiler: samples, their summary, and the guard that retakes a
sample during which other processes used the CPUs.

Noise: a sample during which OTHER processes used the CPUs is taken again after a pause
(Guard; counted in the samples as rejected) until the stage's deadline of the time
budget (zoexec.profiler.budget); after it a disturbed sample is kept and counted as
such. A full CPU profile measures everything in up to 3 rounds, as many as the budget
holds, whose medians the profile keeps (a shared or virtual machine's speed drifts by
tens of percent from one minute to the next).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import psutil
import torch

from zoexec.profiler.settings import RETRIES

BACKOFF_S = 0.25              # a disturbed sample is retaken after a pause: other work comes in bursts


def gbps(num_bytes: float, seconds: float) -> float:
    return num_bytes / seconds / 1e9 if seconds > 0 else 0.0


def summarize(samples: list[float]) -> dict[str, Any]:
    """Raw samples (s), median and interquartile range of repeated measurements."""
    ordered = sorted(samples)
    med = statistics.median(ordered)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = med
    return {"samples_s": [float(f"{x:.6g}") for x in samples], "median_s": med,
            "iqr_s": [q1, q3], "iqr_pct": 100.0 * (q3 - q1) / med if med > 0 else 0.0}


class Guard:
    """Tells whether OTHER processes used the CPUs during a measurement: busy CPU time
    of the host (/proc/stat) minus that of this profiling run's process tree. Other
    work on the cores slows a measurement by far more than its share (torch threads
    wait for each other), so such samples are taken again."""

    def __init__(self, root_pid: int | None = None, *, retries: int = RETRIES,
                 deadline: float | None = None) -> None:
        self._psutil = psutil
        self.retries = retries
        self.root = psutil.Process(root_pid or os.getpid())
        self.deadline = deadline     # perf_counter time after which nothing is retaken
        self.rejected = 0            # samples retaken
        self.samples = 0             # samples kept
        self.disturbed_kept = 0      # of those, disturbed (kept: the deadline had passed)
        self.cut: list[str] = []     # stages whose passes the deadline cut short

    def in_time(self) -> bool:
        """Before the current stage's deadline (always, without one)?"""
        return self.deadline is None or time.perf_counter() < self.deadline

    def keep(self, disturbed: bool) -> None:
        self.samples += 1
        self.disturbed_kept += int(disturbed)

    def counts(self) -> dict[str, int]:
        return {"samples": self.samples, "rejected": self.rejected,
                "disturbed_kept": self.disturbed_kept}

    def _host_busy(self) -> float:
        t = self._psutil.cpu_times()
        return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))

    def _ours(self) -> float:
        total = 0.0
        for proc in [self.root] + self.root.children(recursive=True):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except self._psutil.Error:
                pass
        return total

    def mark(self) -> tuple[float, float]:
        return self._host_busy(), self._ours()

    def others_s(self, mark: tuple[float, float]) -> float:
        host, ours = self.mark()
        return max(0.0, (host - mark[0]) - (ours - mark[1]))

    def clean(self, mark: tuple[float, float], wall_s: float) -> bool:
        """No more than 2 clock ticks and 10% of the wall time used by others."""
        return self.others_s(mark) <= max(0.02, 0.1 * wall_s)


ACTIVE_GUARD: list[Guard] = []   # the guard of the running `zoplan profile` (this process)


def rank_samples(fn: Callable[[], Any], *, repeats: int, dist: Any, guard: Guard,
                 warmup: int = 1, sync: Callable[[], Any] | None = None) -> list[float]:
    """time_samples for ranks measuring at once: every rank starts a sample after a
    barrier, and all ranks keep or drop it together (an all-reduce of the guard's verdict
    and of whether the deadline has passed), so they stay in step."""
    out: list[float] = []
    flag = torch.zeros(2)
    for tries in range(1, warmup + (guard.retries + 1) * repeats + 1):
        dist.barrier()
        mark = guard.mark()
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        wall = time.perf_counter() - start
        flag[0] = 0.0 if guard.clean(mark, wall) else 1.0
        flag[1] = 0.0 if guard.in_time() else 1.0
        dist.all_reduce(flag)
        if tries <= warmup:
            continue
        disturbed, late = bool(flag[0].item()), bool(flag[1].item())
        if disturbed and not late and tries <= warmup + guard.retries * repeats:
            guard.rejected += 1
            time.sleep(BACKOFF_S)
            continue
        guard.keep(disturbed)
        out.append(wall)
        if len(out) == repeats:
            break
    return out


def time_samples(fn: Callable[[], Any], *, repeats: int, warmup: int = 1,
                 sync: Callable[[], Any] | None = None,
                 before: Callable[[], Any] | None = None,
                 guard: Guard | None = None) -> list[float]:
    """Wall time of `fn` (then `sync`), `repeats` times after `warmup` untimed runs;
    `before` runs untimed ahead of each run (a barrier, say). With a `guard`, a sample
    during which other processes used the CPUs is taken again after a pause (at most
    RETRIES x repeats extra tries, and only before the guard's deadline; the guard
    counts the rejects and the disturbed samples kept)."""
    out: list[float] = []
    tries = 0
    while len(out) < repeats:
        if before:
            before()
        active = guard or (ACTIVE_GUARD[0] if ACTIVE_GUARD else None)
        mark = active.mark() if active else None
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        wall = time.perf_counter() - start
        tries += 1
        if tries <= warmup:
            continue
        disturbed = active is not None and not active.clean(cast(tuple[float, float], mark), wall)
        if disturbed and active is not None and tries <= warmup + active.retries * repeats and active.in_time():
            active.rejected += 1
            time.sleep(BACKOFF_S)
            continue
        if active is not None:
            active.keep(disturbed)
        out.append(wall)
    return out
