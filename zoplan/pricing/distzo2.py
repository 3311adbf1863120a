"""DistZO2's own configurations as baselines, lane by lane: the naive one (every rank
uploads and offloads the whole block, as ZO2 does on one GPU) and the sliced one (each
rank uploads 1/slices of the block, the slice group all-gathers the rest over the fast
fabric, each rank offloads its slice). DistZO2 (arXiv 2507.03211: perturbation and data
parallelism over ZO2's scheduler, "slices parameter blocks and redistributes them
across GPUs via high-speed interconnects such as NVLink") is priced as
zoplan.pricing.baselines.distzo2_step prices it: ZO2's lock-step per block, a block's
period max(issue + upload (+ all-gather), compute).

Each stream's share of a step's GPU activity is counted as a profiler's per-stream view
counts it (Nsight Systems' "% of GPU activity" per stream): the busy seconds of the lane
over the step. The lanes: compute (both forwards or one, the zo maths, the embeddings
and heads), h2d (the upload stream's copies), d2h (the offload stream's copies),
collective (the all-gathers and the loss all-reduce). A copy is busy for as long as it
takes, beside the other direction and its neighbours behind the same switch uplink.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoplan.hardware import HardwareProfile
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.pricing.baselines import BaselineStep, distzo2_step
from zoplan.pricing.collectives import allreduce_small_s
from zoplan.pricing.copies import duplex_rates_gbps
from zoplan.pricing.figures import given
from zoplan.pricing.units import GBPS

LANES = ("compute", "h2d", "d2h", "collective")
CONFIGS = ("naive", "sliced")


@dataclass(frozen=True, kw_only=True)
class LaneStep:
    """One DistZO2 configuration's step and each lane's busy seconds in it."""

    config: str
    step_s: float
    busy_s: dict[str, float]
    program: BaselineStep
    slices: int

    @property
    def shares(self) -> dict[str, float]:
        """Each lane's busy seconds over the step (a profiler's per-stream share)."""
        return {lane: self.busy_s[lane] / self.step_s for lane in LANES}

    @property
    def order(self) -> list[str]:
        """The lanes from the busiest to the idlest."""
        return sorted(LANES, key=lambda lane: -self.busy_s[lane])


def offload_s(profile: HardwareProfile, num_bytes: float, ranks: int, *,
              pinned: bool = True) -> float:
    """One rank's offload of `num_bytes` beside its upload, while `ranks` GPUs of the
    node do the same: the D2H rate while H2D runs (pcie.d2h_duplex_gbps), the switch
    uplink shared by the GPUs behind it, host memory by all; pageable copies at
    pcie.pageable_d2h_gbps (staged by the host, one at a time)."""
    f = profile.figures()
    p = f.pcie
    if not pinned:
        return float(num_bytes / (given(p.pageable_d2h_gbps, "pcie.pageable_d2h_gbps") * GBPS))
    both = duplex_rates_gbps(profile, "gpu")
    d2h = (both[1] if both else p.d2h_gbps) * GBPS
    groups = p.switch_groups or ()
    sharing = max([sum(1 for r in g if r < ranks) for g in groups] or [1])
    uplink = p.switch_uplink_gbps * GBPS
    host = f.host.mem_bw_gbps * GBPS
    return float(max(num_bytes / d2h, sharing * num_bytes / uplink, 2 * ranks * num_bytes / host))


def lane_step(model: ModelSpec, profile: HardwareProfile, *, config: str, batch: int, seq: int,
              pertp: int, ddp: int, dtype: str = "fp16", pinned: bool = True) -> LaneStep:
    """A DistZO2 configuration on pertp x ddp GPUs of one node: naive (slices 1) or
    sliced (slices over every rank the fast fabric joins)."""
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {', '.join(CONFIGS)}, got {config!r}")
    ranks = pertp * ddp
    slices = 1 if config == "naive" else profile.max_slices(ranks)
    program = distzo2_step(model, profile, batch=batch, seq=seq, pertp=pertp, ddp=ddp,
                           slices=slices, dtype=dtype, pinned=pinned)
    parts, blocks = program.parts, model.num_layers
    piece = model.block_params * dtype_bytes(dtype) / slices
    ends = program.step_s - blocks * parts["period_s"] - parts["upload_s"]
    busy = {"compute": blocks * parts["compute_s"] + ends,
            "h2d": (blocks + 1) * parts["upload_s"],
            "d2h": blocks * offload_s(profile, piece, ranks, pinned=pinned),
            "collective": blocks * parts["allgather_s"] + (allreduce_small_s(profile)
                                                          if ranks > 1 else 0.0)}
    busy = {lane: min(seconds, program.step_s) for lane, seconds in busy.items()}
    return LaneStep(config=config, step_s=program.step_s, busy_s=busy, program=program,
                    slices=slices)


def both_configs(model: ModelSpec, profile: HardwareProfile, *, batch: int, seq: int,
                 pertp: int, ddp: int, dtype: str = "fp16", pinned: bool = True
                 ) -> dict[str, LaneStep]:
    """The naive and the sliced configuration of one setup (lane_step's arguments)."""
    return {config: lane_step(model, profile, config=config, batch=batch, seq=seq, pertp=pertp,
                              ddp=ddp, dtype=dtype, pinned=pinned) for config in CONFIGS}
