"""What a GPU rank's lanes share, priced: the one host thread that issues every task
(the host lane), and the SMs and HBM the compute and collective streams share.

The host lane (CUDA). One Python thread per rank enqueues every task of the step in
program order (zoexec.train.engine) and never waits for the device inside a step (the
lanes wait on events), so the host has issued task i at the sum of the issue times of
the tasks before it: a task cannot start before its issue starts, nor end before its
issue ends (zoplan.sim.graph gives each task that window, the simulator holds to it).
What a task costs the host (hardware.md, "Costs that are easy to miss on GPUs"): two
timing events (zoexec.runtime.lanes.CudaLanes.task), its launches at compute.launch_us,
a seeded generator launch per z chunk at compute.z_launch_us, an HF layer call per
perturbation at compute.overhead_us; the rank's batch (host.batch_us) is assembled
before the embed. Where a block's device time is about a millisecond or less (small
hidden sizes, resident blocks) the host is the bottleneck (zoplan.sim.bounds: "host").

Shared SMs and HBM. A memory-bound kernel on the collective stream (the slice update,
the all-gather's NCCL kernels) beside the compute stream's GEMMs and passes slows both
(Echo, 2024; Galvatron's overlap coefficient ~1.13: reference/simulators.md): each runs
compute.overlap_slowdown (k) slower for the share of its time the other stream is busy.
Per block and rank, with C the compute stream's work and L the collective stream's:
compute tasks x (1 + k min(1, L / C)), the slice update and the all-gather x
(1 + k min(1, C / L)). The copy engines' PCIe traffic (tens of GB/s against HBM's
thousands) is not counted.
"""

from __future__ import annotations

import dataclasses

from zoplan.hardware import HardwareProfile
from zoplan.layout import Layout

EVENTS_PER_TASK = 2   # CudaLanes.task records a start and an end event per task
ONE_LAUNCH = ("h2d", "d2h", "allgather", "fence", "allreduce")   # a copy or a NCCL call


def host_issue(profile: HardwareProfile, layout: Layout, issue: dict | None,
               parts: dict) -> dict:
    """Host seconds to issue each task kind of one rank ({} on CPU profiles: a CPU rank
    runs its tasks itself, their times include the dispatch). `issue`: task_times'
    "issue"; `parts`: the placement's (update and slice update with slice_update, the
    shard copy of a resident block without it)."""
    if profile.is_cpu or issue is None:
        return {}
    events = EVENTS_PER_TASK * profile.launch_s
    batch_s = profile.host.get("batch_us", 0.0) * 1e-6
    update = parts.get("update", issue["update"])
    out = {"embed": events + batch_s + issue["embed"], "update": events + update,
           "resident_update": events + parts.get(
               "resident_update", update + parts.get("resident_copy", 0.0)),
           "forward": events + issue["forward"], "head": events + issue["head"],
           "slice_update": tuple(events + h for h in parts.get("slice_update", ()))}
    out.update({kind: events + profile.launch_s for kind in ONE_LAUNCH})
    return out


def overlap_factors(costs, k: float) -> tuple[float, float]:
    """(compute stream, collective stream) time factors of one rank's block tasks when
    the two streams share the GPU (k = compute.overlap_slowdown; 1 without sharing)."""
    if k <= 0 or not costs.concurrent or not costs.num_blocks:
        return 1.0, 1.0
    blocks = costs.num_blocks
    res = costs.num_resident()
    comp = costs.forward_s + (res * costs.resident_update_s
                              + (blocks - res) * costs.update_s) / blocks
    coll = (costs.slice_s(0) + costs.allgather_alone_s(0)
            + costs.fence_s * (blocks - res) / blocks)
    if comp <= 0 or coll <= 0:
        return 1.0, 1.0
    return 1.0 + k * min(1.0, coll / comp), 1.0 + k * min(1.0, comp / coll)


def shared_gpu(costs, k: float):
    """`costs` (a StepCosts) with its block tasks slowed by sharing the GPU."""
    comp, coll = overlap_factors(costs, k)
    if comp == coll == 1.0:
        return costs
    gather = costs.allgather_alone_s(0) - costs.allgather_latency_s if costs.layout.slices > 1 else 0.0
    return dataclasses.replace(
        costs, update_s=costs.update_s * comp, forward_s=costs.forward_s * comp,
        resident_update_s=costs.resident_update_s * comp,
        slice_update_s=tuple(s * coll for s in costs.slice_update_s),
        allgather_slowdown_s=gather * (coll - 1.0), overlap=(comp, coll))
