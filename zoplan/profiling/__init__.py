"""From measured samples to a hardware profile (torch-free): the fits (fits), the source
notes (sources), the assembly of one profile from several rounds (build), and the
command that runs the executor's profiler and writes the result (profile_machine).

The measuring itself is zoexec.profiler's: `zoplan profile` is the one command of the
planner that calls into the executor package (the CLI passes the profiler in).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from zoplan.hardware import PROFILES_DIR, HardwareProfile
from zoplan.io import atomic_write_text, check_writable
from zoplan.profiling.build import build_profile

__all__ = ["build_profile", "profile_machine"]


def profile_machine(*, profiler: Any, output: Path | None, name: str | None,
                    ranks: int | None, repeats: int, quick: bool, force_cpu: bool,
                    progress: Callable[[], AbstractContextManager[tuple[Callable[..., None], Callable[..., None]]]],
                    time_budget_s: float | None = None) -> tuple[HardwareProfile, Path]:
    """Check the request, measure with `profiler` (zoexec.profiler: make_settings,
    measure) inside `progress()` (which yields tick and warn), build and validate the
    profile and write it atomically (default hwprofiles/<name>.json); returns it and
    where it went. Bad input fails before anything is measured. `time_budget_s`: how
    long the measuring may take (None: the profiler's default for the device)."""
    if output is not None:
        check_writable(output)   # before minutes of measuring
    settings = profiler.make_settings(ranks=ranks, repeats=repeats, quick=quick,
                                      force_cpu=force_cpu, time_budget_s=time_budget_s)
    with progress() as (tick, warn):
        samples = profiler.measure(settings, tick=tick, warn=warn)
    data = build_profile(samples, name=name)
    path = Path(output) if output else PROFILES_DIR / f"{data['name']}.json"
    profile = HardwareProfile.from_dict(data, origin=f"profile {path}")
    atomic_write_text(path, profile.to_json())
    return profile, path
