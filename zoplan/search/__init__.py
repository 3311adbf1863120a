"""Layout search behind `zoplan optimize`: enumerate -> is_valid (with a reason) ->
memory -> bound -> simulate -> rank (space, evaluate), and the plan of the winner
(build).

    plan = optimize(model="opt-175b", gpus=8, profile=None, batch=16, seq=512, ...)

resolves and checks the request, searches, and writes plan.json; the views print it
(zoplan.views.optimize).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoplan.io import check_writable
from zoplan.names import AUTO_TUNING
from zoplan.plan import Plan
from zoplan.request import PlanRequest, TuningOptions, option_fields
from zoplan.search.build import build_plan
from zoplan.search.evaluate import Progress, SearchResult, paused_gc, search
from zoplan.search.sensitivity import with_sensitivity
from zoplan.search.space import Request, resolve, resolve_request
from zoplan.search.tuning import faster

__all__ = ["Request", "SearchResult", "build_plan", "optimize", "plan_request", "resolve",
           "resolve_request", "search"]


def plan_request(request: PlanRequest, *, progress: Progress | None = None
                 ) -> tuple[Plan, dict[str, Plan] | None]:
    """Search for a checked request (zoplan.request) and write the winner's plan to its
    --out. `progress(total) -> tick` (zoplan.views.optimize.search_progress) follows the
    search. With --tuning auto: the best full plan and the best LoRA plan (--update
    applies to the full search only), the faster written; returned beside it as
    {"full": ..., "lora": ...} (None otherwise)."""
    output = Path(request.output.output)
    if request.tuning.tuning == AUTO_TUNING:
        check_output(output, inputs=_inputs(request))
        defaults = {f.name: f.default for f in option_fields(TuningOptions)}
        plans = {"full": build_plan(search(resolve(request.replaced(**defaults)),
                                           progress=progress)),
                 "lora": build_plan(search(resolve(request.replaced(tuning="lora", update=None)),
                                           progress=progress))}
        chosen = plans[faster(plans)]
        chosen.save(output)
        return chosen, plans
    req = resolve(request)
    check_output(output, inputs=_inputs(request))
    with paused_gc():   # the plan of a large search is built beside all its objects too
        result = search(req, progress=progress)
        plan = build_plan(result)
        if request.output.sensitivity:
            plan = with_sensitivity(plan, result)
        plan.save(output)
    return plan, None


def optimize(*, output: Path, progress: Progress | None = None,
             estimator: dict[str, Any] | None = None, **values: Any) -> Plan:
    """plan_request of the request made of `values` (zoplan.request's fields by name:
    model, gpus, profile, batch, seq, ...; `estimator`: a dict of its settings), written
    to `output`. The library's default leaves the sensitivity out (`sensitivity=True`
    adds it, as `zoplan optimize` does by default: zoplan.search.sensitivity)."""
    values.setdefault("sensitivity", False)
    request = PlanRequest.make(output=Path(output), **values, **(estimator or {}))
    return plan_request(request, progress=progress)[0]


def _inputs(request: PlanRequest) -> tuple[str | Path | None, ...]:
    """The files a plan must never replace: the profile, the model's config, the lengths."""
    lengths = request.workload.lengths
    return (request.hardware.profile, request.workload.model,
            None if lengths is None else str(lengths))


def check_output(output: Path, *, inputs: tuple[str | Path | None, ...] = ()) -> None:
    """Fail before searching, and never replace a device, a folder or an input (a
    profile, a model config, a lengths file) with a plan."""
    check_writable(output, what="the plan to", inputs=inputs)
