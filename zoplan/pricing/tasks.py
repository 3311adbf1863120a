"""Per-task work of one rank: the times of the embed, update, forward and head tasks
(block forwards from zoplan.pricing.compute, the zo maths from
zoplan.pricing.schedules) on a GPU or a CPU profile, and on GPUs the host seconds to
issue each (zoplan.pricing.host)."""

from __future__ import annotations

from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.models import ModelSpec
from zoplan.pricing.compute import EMBED_OPS, HEAD_OPS, forward_times
from zoplan.pricing.host import forward_issue_s
from zoplan.pricing.schedules import SCHEDULES, zo_maths_of
from zoplan.workload import Workload


def task_times(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               tokens: int | float, streams: int, local_ranks: int,
               schedule: str = "zoexec") -> dict[str, Any]:
    """embed_s, update_s, forward_s and head_s of one rank (the schedule of
    docs/execution.md): `tokens` per perturbation stream, `streams` forwards per block.

    update: the deferred update (a z draw + a pass) and the next perturbation (a z draw
    + a pass); `parts` splits it for slice_update (zoplan.pricing.schedules; None for
    schedule "zo2"); forward: one block forward per stream, and the second stream's
    perturbation pass; embed: the resident parts' update, z and one perturbation pass
    per stream, and one embedding lookup per stream; head: one final norm + LM head +
    loss per stream and the resident perturbation pass between them. "issue" (GPU
    profiles; None on CPUs): the host seconds to issue each of those tasks (layer calls
    at compute.overhead_us, the zo maths' launches)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    hw = profile
    fwd, lookups, head_fwd = forward_times(model=model, profile=hw, workload=workload,
                                           tokens=tokens, streams=streams,
                                           local_ranks=local_ranks)
    zo = zo_maths_of(hw)(model=model, profile=hw, workload=workload,
                         local_ranks=local_ranks, streams=streams, schedule=schedule)
    out = {"embed_s": zo["embed"] + lookups, "update_s": zo["update"],
           "forward_s": streams * fwd + zo["forward"],
           "head_s": streams * head_fwd + zo["head"], "parts": zo.get("parts"),
           "issue": None}
    if not hw.is_cpu:   # the host lane: layer calls and the zo maths' launches
        issue = zo["issue"]
        out["issue"] = {"embed": issue["embed"] + streams * forward_issue_s(hw, EMBED_OPS),
                        "update": issue["update"],
                        "forward": issue["forward"] + streams * forward_issue_s(hw),
                        "head": issue["head"] + streams * forward_issue_s(hw, HEAD_OPS)}
    return out
