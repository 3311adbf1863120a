"""The profiler's entry: settings for this machine, the measurement rounds, the
machine's facts; returns the samples described in zoexec.profiler."""

from __future__ import annotations

import platform
import socket
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers

from zoexec.profiler import timing
from zoexec.profiler.budget import Budget, default_budget_s
from zoexec.profiler.cpu import measure_cpu
from zoexec.profiler.cuda import measure_cuda
from zoexec.profiler.probe import SPEED_CHECKS
from zoexec.profiler.settings import GIB, Settings
from zoplan.errors import ZoError
from zoplan.execrules import usable_cores


def make_settings(*, ranks: int | None, repeats: int, quick: bool, force_cpu: bool,
                  time_budget_s: float | None = None) -> Settings:
    """CUDA GPUs where there are any (unless force_cpu), else gloo ranks on the CPU
    (default: one per core); `time_budget_s` None: the device's default
    (zoexec.profiler.budget.default_budget_s)."""
    if ranks is not None and ranks < 1:
        raise ZoError(f"--ranks must be >= 1, got {ranks}")
    cores = usable_cores()
    cuda = not force_cpu and torch.cuda.is_available() and torch.cuda.device_count() > 0
    if cuda:
        count = torch.cuda.device_count()
        if ranks and ranks > count:
            raise ZoError(f"--ranks {ranks} but this machine has {count} CUDA GPUs")
        ranks = ranks or count
    ranks = ranks or cores
    device = "cuda" if cuda else "cpu"
    budget = default_budget_s(device) if time_budget_s is None else float(time_budget_s)
    try:
        return Settings(repeats=min(repeats, 3) if quick else repeats, quick=quick, ranks=ranks,
                        cores=cores, device=device, time_budget_s=budget)
    except ValueError as exc:
        raise ZoError(str(exc)) from None


def measure(settings: Settings, *, tick: Callable[[str], None],
            warn: Callable[[str], None]) -> dict[str, Any]:
    """Measure this machine in as many of settings.rounds rounds as its time budget
    holds (zoexec.profiler.budget); `tick` gets a line of progress per stage (with the
    time so far and the ETA), `warn` a warning. Returns the samples (see
    zoexec.profiler), with what the budget and the load did under "budget"."""
    load = other_load_pct()
    if load > 25:
        warn(f"other processes use {load:.0f}% of the CPUs: the figures will be slow and "
             f"noisy; disturbed samples are retaken only as far as the time budget "
             f"({fmt_s(settings.time_budget_s)}) allows")
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    run = measure_cuda if settings.device == "cuda" else measure_cpu
    budget = Budget(seconds=settings.time_budget_s, device=settings.device,
                    rounds_planned=settings.rounds)
    guard = timing.Guard(retries=settings.retries)
    timing.ACTIVE_GUARD[:] = [guard]

    def stage(name: str) -> float:
        guard.deadline = budget.stage(name)
        return guard.deadline

    def progress(prefix: str, message: str) -> None:
        tick(f"{prefix}{message}  [{fmt_s(budget.elapsed_s)} so far, ETA "
             f"{fmt_s(budget.eta_s())}]")
    def round_tick(message: str) -> None:
        prefix = f"round {budget.rounds_done}/{settings.rounds}: " if settings.rounds > 1 else ""
        progress(prefix, message)
    rounds = []
    try:
        while budget.next_round():
            rounds.append(run(settings, round_tick, stage))
            budget.end_round()
    finally:
        timing.ACTIVE_GUARD.clear()
    ranks = [r for m in rounds for r in (m.get("ranks") or {}).get("per_rank", []) if r]
    counts = {key: guard.counts()[key] + sum(r.get(key, 0) for r in ranks)
              for key in ("samples", "rejected", "disturbed_kept")}
    return {"settings": {**settings.to_dict(), "speed_checks": SPEED_CHECKS}, "rounds": rounds, "date": date,
            "host": host_facts(), "versions": software_versions(),
            "devices": rounds[0].get("devices") or [f"cpu rank {r}" for r in range(settings.ranks)],
            "other_load_pct": load, "rejected_samples": counts["rejected"],
            "budget": budget.report(samples=counts["samples"], retaken=counts["rejected"],
                                    disturbed_kept=counts["disturbed_kept"], cut=guard.cut),
            "command": " ".join(["zoplan"] + sys.argv[1:]) if sys.argv else "zoplan profile"}


def fmt_s(seconds: float) -> str:
    """42s, 3m40s."""
    seconds = max(0, round(seconds))
    return f"{seconds}s" if seconds < 60 else f"{seconds // 60}m{seconds % 60:02d}s"


# ---- facts of the machine --------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict[str, str | float]:
    vm = psutil.virtual_memory()
    return {"name": socket.gethostname(), "cpu_model": cpu_model(), "os": platform.platform(),
            "total_gib": vm.total / GIB, "used_gib": (vm.total - vm.available) / GIB}


def software_versions() -> dict[str, str]:
    """Versions a profile's figures depend on (calibrate warns when they change)."""
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def other_load_pct() -> float:
    """CPU use of OTHER processes right now, percent of all cores (noisy measurements)."""
    me = psutil.Process()
    total: float = psutil.cpu_percent(interval=0.5)
    mine: float = me.cpu_percent(interval=None) / (psutil.cpu_count() or 1)
    return max(0.0, total - mine)
