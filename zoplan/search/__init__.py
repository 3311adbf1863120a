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
from zoplan.search.evaluate import SearchResult, paused_gc, search
from zoplan.search.space import Request, resolve_request
from zoplan.search.tuning import faster

__all__ = ["Request", "SearchResult", "build_plan", "optimize", "optimize_tunings",
           "resolve_request", "search"]


def optimize(*, model: str, gpus: int, profile: str | None, batch: int, seq: int,
             precision: str | None = None, update: str | None = None, tf32: bool = True,
             pertp: int | None = None, ddp: int | None = None, slices: int | None = None,
             prefetch: int | None = None, placement: str = "auto", output: Path,
             progress=None, lengths: str | None = None, **tuning) -> Plan:
    """Search the layouts for this request and write the winner's plan to `output`.
    `progress(total) -> tick` (zoplan.views.optimize.search_progress) follows the search.
    `tuning`: the request's other fields (zoplan.request: tuning "full", "lora" or
    "prefix", lora_r, lora_alpha, lora_targets, prefix_tokens, max_gpu_memory) and
    `estimator`, a dict of its settings."""
    req = resolve_request(model=model, gpus=gpus, profile=profile, batch=batch, seq=seq,
                          precision=precision, update=update, tf32=tf32, pertp=pertp,
                          ddp=ddp, slices=slices, prefetch=prefetch, placement=placement,
                          lengths=lengths, **tuning)
    check_output(Path(output), inputs=(profile, model, lengths))
    with paused_gc():   # the plan of a large search is built beside all its objects too
        plan = build_plan(search(req, progress=progress))
        plan.save(output)
    return plan


def optimize_tunings(*, output: Path, update: str | None = None, progress=None,
                     **request) -> tuple[Plan, dict[str, Plan]]:
    """`--tuning auto`: the best full plan and the best LoRA plan of the request (the
    arguments of optimize; --update applies to the full search only); the faster is
    written to `output`. Returns (the written plan, {"full": ..., "lora": ...})."""
    check_output(Path(output), inputs=(request.get("profile"), request.get("model"),
                                       request.get("lengths")))
    lora = {k: request.pop(k) for k in ("lora_r", "lora_alpha", "lora_targets") if k in request}
    request.pop("tuning", None)
    plans = {}
    for tuning in ("full", "lora"):
        extra = {"update": update} if tuning == "full" else {"tuning": "lora", **lora}
        req = resolve_request(**request, **extra)
        plans[tuning] = build_plan(search(req, progress=progress))
    chosen = plans[faster(plans)]
    chosen.save(output)
    return chosen, plans


def check_output(output: Path, *, inputs: tuple = ()) -> None:
    """Fail before searching, and never replace a device, a folder or an input (a
    profile, a model config, a lengths file) with a plan."""
    check_writable(output, what="the plan to", inputs=inputs)
