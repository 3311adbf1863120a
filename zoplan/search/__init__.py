"""Layout search behind `zoplan optimize`: enumerate -> is_valid (with a reason) ->
memory -> bound -> simulate -> rank (space, evaluate), and the plan of the winner
(build).

    plan = optimize(model="opt-175b", gpus=8, profile=None, batch=16, seq=512, ...)

resolves and checks the request, searches, and writes plan.json; the views print it
(zoplan.views.optimize).
"""

from __future__ import annotations

from pathlib import Path

from zoplan.io import check_writable
from zoplan.plan import Plan
from zoplan.search.build import build_plan
from zoplan.search.evaluate import SearchResult, search
from zoplan.search.space import Request, resolve_request

__all__ = ["Request", "SearchResult", "build_plan", "optimize", "resolve_request", "search"]


def optimize(*, model: str, gpus: int, profile: str | None, batch: int, seq: int,
             precision: str | None = None, update: str | None = None, tf32: bool = True,
             pertp: int | None = None, ddp: int | None = None, slices: int | None = None,
             prefetch: int | None = None, placement: str = "auto", output: Path,
             progress=None, lengths: str | None = None) -> Plan:
    """Search the layouts for this request and write the winner's plan to `output`.
    `progress(total) -> tick` (zoplan.views.optimize.search_progress) follows the search."""
    req = resolve_request(model=model, gpus=gpus, profile=profile, batch=batch, seq=seq,
                          precision=precision, update=update, tf32=tf32, pertp=pertp,
                          ddp=ddp, slices=slices, prefetch=prefetch, placement=placement,
                          lengths=lengths)
    check_output(Path(output))
    plan = build_plan(search(req, progress=progress))
    plan.save(output)
    return plan


def check_output(output: Path) -> None:
    """Fail before searching, and never replace a device or a folder with a plan."""
    check_writable(output, what="the plan to")
