"""The host lane of a GPU rank: one Python thread issues every task of the step.

The thread enqueues the step's tasks in program order (zoexec.train.engine) and never
waits for the device inside a step (the lanes wait on events), so the host has issued
task i at the sum of the issue times of the tasks before it: a task cannot start before
its issue starts, nor end before its issue ends (zoplan.sim.graph gives each task that
window). What a task costs the host: two timing events (zoexec.runtime.lanes.CudaLanes.task),
its launches at compute.launch_us, a seeded generator launch per z chunk at
compute.z_launch_us (zoplan.pricing.zo), an HF layer call per perturbation at
compute.overhead_us; the rank's batch (host.batch_us) is assembled before the embed;
where the store is not page-locked (pcie.pinned false) the thread stages every copy
through pinned slots itself (zoplan.pricing.copies.staging_s), and such a copy starts
with its issue instead of after it (zoplan.sim.simulate).
A kernel launch from Python costs some 5-25 us of host time (docs/sources.md, "launch
costs"). Where a block's device time is about a millisecond or less (small hidden
sizes, resident blocks) the host is the bottleneck (zoplan.sim.bounds: "host"). CPU
ranks run their tasks themselves: their measured times include the dispatch, no lane.
"""

from __future__ import annotations

from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.pricing.copies import staging_s
from zoplan.pricing.figures import or_
from zoplan.pricing.units import US

EVENTS_PER_TASK = 2   # CudaLanes.task records a start and an end event per task
ONE_LAUNCH = ("h2d", "d2h", "allgather", "fence", "allreduce")   # a copy or a NCCL call


def launch_s(profile: HardwareProfile) -> float:
    """Host time of one kernel launch or CUDA event record from Python
    (compute.launch_us; 0 on CPU profiles and where absent)."""
    if profile.is_cpu:
        return 0.0
    launch = or_(profile.figures().compute.launch_us, 0.0)
    return launch * US


def forward_issue_s(profile: HardwareProfile, overhead_share: float = 1.0) -> float:
    """Host time to call one block forward (its share for embed and head) on a GPU:
    compute.overhead_us, the launches of one HF layer call."""
    overhead = profile.figures().compute.overhead_us
    return overhead_share * overhead * US


def batch_s(profile: HardwareProfile) -> float:
    """Host time of a rank assembling its batch before the embed (host.batch_us)."""
    batch = or_(profile.figures().host.batch_us, 0.0)
    return batch * US


def host_issue(profile: HardwareProfile, issue: dict[str, float] | None,
               parts: dict[str, Any], *, copy_bytes: tuple[float, float] = (0.0, 0.0)
               ) -> dict[str, Any]:
    """Host seconds to issue each task kind of one rank ({} on CPU profiles: a CPU rank
    runs its tasks itself, their times include the dispatch). `issue`: task_times'
    "issue"; `parts`: the placement's (update and slice update with slice_update, the
    shard copy of a resident block without it); `copy_bytes`: the rank's (h2d, d2h)
    bytes of one block, which its thread stages itself where the store is not
    page-locked (zoplan.pricing.copies.staging_s)."""
    if profile.is_cpu or issue is None:
        return {}
    launch = launch_s(profile)
    events = EVENTS_PER_TASK * launch
    update = parts.get("update", issue["update"])
    out: dict[str, Any] = {
        "embed": events + batch_s(profile) + issue["embed"], "update": events + update,
        "resident_update": events + parts.get(
            "resident_update", update + parts.get("resident_copy", 0.0)),
        "forward": events + issue["forward"], "head": events + issue["head"],
        "slice_update": tuple(events + h for h in parts.get("slice_update", ()))}
    out.update({kind: events + launch for kind in ONE_LAUNCH})
    for kind, num_bytes in zip(("h2d", "d2h"), copy_bytes):
        out[kind] += staging_s(profile, num_bytes, kind)
    return out
