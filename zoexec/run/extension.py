"""A run extended or shortened on a resume (`--resume DIR --steps N`): run.json's steps,
lr schedule segments and extensions after it, and the line that says what happens to
the lr (zoexec.run.folder reads the segments back to check each logged lr). Torch-free.
"""

from __future__ import annotations

from typing import Any

from zoplan.errors import ZoError


def extend(ident: dict[str, Any], *, steps: int, start_step: int,
           new_schedule: bool) -> tuple[dict[str, Any], str | None]:
    """run.json after `--steps steps` on a resume at `start_step` (a run extended or
    shortened), and the line that says so: a constant schedule (its lr does not depend
    on the total) continues; a decaying one is refused unless `new_schedule`: a new
    schedule of the same kind from `start_step` over the steps left, from the base lr,
    without warm-up."""
    old = ident["steps"]
    if steps == old:
        if new_schedule:
            raise ZoError(f"--new-schedule starts a schedule for more (or fewer) steps: give "
                          f"--steps N other than the run's {old}")
        return ident, None
    schedule = [list(s) for s in ident["schedule"]]
    decays = ident["lr_schedule"] != "constant"
    if decays and not new_schedule:
        raise ZoError(f"--steps {steps}: the run's {ident['lr_schedule']} schedule decays over "
                      f"{old} steps and would change after step {start_step}; give "
                      f"--new-schedule to start a new {ident['lr_schedule']} schedule after step "
                      f"{start_step} over the {steps - start_step} steps left (from lr "
                      f"{ident['lr']}), or --steps {old}")
    if decays:
        schedule.append([start_step, steps])
        how = (f"a new {ident['lr_schedule']} schedule after step {start_step} (lr "
               f"{ident['lr']} decaying over {steps - start_step} steps)")
    else:
        schedule[-1][1] = steps
        how = f"the constant lr {ident['lr']} continues"
    ext = {"at_step": start_step, "from_steps": old, "to_steps": steps, "new_schedule": decays}
    line = f"zoexec: the run goes from {old} to {steps} steps after step {start_step}: {how}"
    return {**ident, "steps": steps, "schedule": schedule,
            "extensions": [*ident.get("extensions", []), ext]}, line
