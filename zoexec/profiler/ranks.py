"""Spawned ranks of the profiler (gloo processes on the CPU, one NCCL process per GPU):
one spawner for both, each rank writing its results as JSON for the parent."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from zoexec.profiler.settings import Settings
from zoplan.errors import ZoError


def spawn_ranks(target: Callable[[int, Settings, str, float | None], None], settings: Settings, *,
                what: str, deadline: float | None = None) -> list[dict[str, Any] | None]:
    """Run `target(rank, settings, tmp, deadline)` on settings.ranks processes
    (`deadline`: the time budget's for this stage, perf_counter seconds); a rank's
    results are what it wrote to tmp/rank<r>.json (None where it wrote nothing). A
    failing rank is one ZoError line: "profiling <what> failed: <its last line>"."""
    with tempfile.TemporaryDirectory(prefix="zoplan-profile-") as tmp:
        try:
            mp.spawn(target, args=(settings, tmp, deadline), nprocs=settings.ranks, join=True)
        except Exception as exc:  # ProcessRaisedException carries the rank's traceback
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ZoError(f"profiling {what} failed: {last}") from None
        files = [Path(tmp) / f"rank{r}.json" for r in range(settings.ranks)]
        return [json.loads(f.read_text()) if f.exists() else None for f in files]


def write_rank_result(tmp: str, rank: int, result: dict[str, Any]) -> None:
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(result))


def rendezvous(tmp: str) -> str:
    """The init_method of the spawned ranks' process group."""
    return f"file://{tmp}/rendezvous"
