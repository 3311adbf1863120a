"""Plans of one CPU layout with three placements, priced by the planner (predicted spans
included), for calibrating the placement and the update on the slice:

    python benchmarks/planner/placement_plans.py PROFILE MODEL OUTDIR

writes OUTDIR/offloaded.json (pertp2 s2 p2, every block offloaded), offloaded-su.json
(the same with the update on the slice) and mixed-su.json (every other block resident,
with the update on the slice). The search offers no resident blocks or as many as fit,
so the mixed plan is built here from the planner's own functions. Then, for each:

    zoexec run OUTDIR/NAME.json --init random --steps 40 --trace OUTDIR/NAME-trace -q
    zoplan calibrate OUTDIR/NAME.json OUTDIR/NAME-trace --profile PROFILE
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from zoplan.layout import Layout
from zoplan.search import build_plan, resolve_request, search
from zoplan.search.evaluate import simulate_full
from zoplan.search.space import make_candidate


def main(profile: str, model: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    req = resolve_request(model=model, gpus=2, profile=profile, batch=4, seq=64, pertp=2,
                          slices=2, prefetch=2, placement="host", precision="fp32",
                          update="master")
    result = search(req)
    blocks = req.model.num_layers
    for name, su, resident in [("offloaded", False, ()), ("offloaded-su", True, ()),
                               ("mixed-su", True, tuple(b % 2 == 1 for b in range(blocks)))]:
        layout = Layout(pertp=2, slices=2, prefetch=2, slice_update=su)
        cand = make_candidate(req, layout, resident=resident, period=0 if resident else 1)
        simulate_full(cand)
        build_plan(dataclasses.replace(result, ranked=[cand])).save(out / f"{name}.json")
        print(f"{name}: {cand.label}, predicted {cand.step_time_s:.4f} s")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
