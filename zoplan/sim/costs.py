"""StepCosts: every figure the graph, the simulator and the bounds need for one
layout, and `step_costs`, which gathers them from zoplan.pricing (it computes no cost of
its own): the task times (zoplan.pricing.tasks, .lora), the host lane (.host), the
streams sharing a GPU (.overlap), the collectives (.collectives) and the ranks' speed
factors (.stragglers); the links and flows (zoplan.sim.links), the placement of blocks
on the devices, the slices' pieces and the CUDA write-back fence.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from zoplan.estimators import stream_examples
from zoplan.execrules import chunk_bounds, fence_needed, sr_chunk, z_range_draws
from zoplan.hardware import HardwareProfile
from zoplan.layout import Layout
from zoplan.memory import store_stride
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.pricing.collectives import (
    allgather_busbw_gbps,
    allreduce_small_s,
    collective_latency_s,
    internode_allreduce_s,
)
from zoplan.pricing.compute import device_copy_s
from zoplan.pricing.copies import staged
from zoplan.pricing.host import host_issue, launch_s
from zoplan.pricing.lora import lora_task_times
from zoplan.pricing.overlap import Interference, interference, shared_gpu_times
from zoplan.pricing.stragglers import rank_factors
from zoplan.pricing.tasks import task_times
from zoplan.pricing.units import GBPS
from zoplan.pricing.work import Work
from zoplan.sim.links import Flow, contended_links, node_links, transfer_flows
from zoplan.workload import Workload


@dataclass(frozen=True, kw_only=True)
class StepCosts:
    """Every figure the graph, the simulator and the bounds need for one layout."""

    layout: Layout
    concurrent: bool                 # device.concurrent_engines
    num_blocks: int
    block_bytes: float               # one block in the stored precision
    tokens_per_rank: int | float   # per stream, padding included (Workload.priced_tokens;
                                     # with q directions, the rank's part of one)
    streams: int                     # forward passes per rank (2 for "+-", 1 for PertP;
                                     # times the directions that meet its rows)
    embed_s: float
    update_s: float                  # update task of an offloaded block (see module doc)
    forward_s: float                 # all streams of one block on one rank
    head_s: float
    allreduce_s: float               # includes internode_s
    internode_s: float
    allgather_latency_s: float
    links: dict[str, float]          # link name -> capacity in bytes/s
    h2d: tuple[tuple[Flow, ...], ...]        # per local rank: flows of one block's h2d
    d2h: tuple[tuple[Flow, ...], ...]
    allgather: tuple[tuple[Flow, ...], ...]  # per local rank (empty when slices == 1)
    rank_factors: tuple[float, ...] = ()     # per local rank: its compute tasks' time factor
    fence_s: float = 0.0             # CUDA write-back fence collective per block (0: none)
    contended: dict[str, tuple[str, float]] = field(default_factory=dict)  # contended_links
    resident: tuple[bool, ...] = ()  # per block: kept on the devices (() = every block offloaded)
    period: int = 1                  # blocks after which `resident` repeats (0: it does not)
    resident_update_s: float = 0.0   # update task of a resident block
    slice_update_s: tuple[float, ...] = ()   # per local rank: its slice update (() = none)
    read_only: bool = False          # LoRA: the base is never written back (no d2h, no fence)
    # the host lane (CUDA; {} on CPUs): host seconds to issue each task kind (the batch
    # before "embed"), and per local rank its slice update's (zoplan.pricing.host)
    issue_s: dict[str, Any] = field(default_factory=dict)
    allgather_slowdown_s: float = 0.0   # an all-gather beside the compute stream's work
    overlap: tuple[float, float, float] = (1.0, 1.0, 1.0)   # (compute, slice update, all-gather)
    staged: bool = False   # copies through pinned slots (pcie.pinned false): start with their issue

    def factor(self, local_rank: int) -> float:
        return self.rank_factors[local_rank] if self.rank_factors else 1.0

    def is_resident(self, block: int) -> bool:
        return bool(self.resident) and self.resident[block]

    @property
    def split_update(self) -> bool:
        """Whether the deferred update is applied to the slice before the all-gather."""
        return bool(self.slice_update_s)

    def uses_buffer(self, block: int) -> bool:
        """Whether the block passes through a block buffer (every offloaded block; a
        resident one when the slice group all-gathers it)."""
        return not self.is_resident(block) or self.layout.slices > 1

    def update_task_s(self, block: int) -> float:
        return self.resident_update_s if self.is_resident(block) else self.update_s

    def slice_s(self, local_rank: int) -> float:
        """The rank's slice update of one block (0 without slice_update)."""
        return self.slice_update_s[local_rank] if self.slice_update_s else 0.0

    def num_resident(self, num_blocks: int | None = None) -> int:
        blocks = self.num_blocks if num_blocks is None else num_blocks
        return sum(self.resident[:blocks]) if self.resident else 0

    @property
    def local_ranks(self) -> int:
        return self.layout.local_ranks

    def alone_s(self, flows: tuple[Flow, ...]) -> float:
        """Time of a set of flows that start together with the links to themselves
        (a lower bound on their time in any schedule)."""
        return max([f.num_bytes / self.flow_rate_alone(f) for f in flows], default=0.0)

    def flow_rate_alone(self, flow: Flow) -> float:
        rate, links = flow.cap_Bps, self.links
        for name in flow.route:
            if links[name] < rate:   # min(), as min([cap] + capacities) picks it
                rate = links[name]
        return rate

    def flow_rate_worst(self, flow: Flow) -> float:
        """A flow's rate alone on links whose opposite direction is busy (contended)."""
        rate, contended = flow.cap_Bps, self.contended
        for name in flow.route:
            pair = contended.get(name)
            link = self.links[name] if pair is None else pair[1]
            if link < rate:   # min(), first of equals kept
                rate = link
        return rate

    def allgather_alone_s(self, local_rank: int) -> float:
        """All-gather of the rank's group with the fabric to itself (latency + bytes)."""
        flows = [f for lr in self.slice_group(local_rank) for f in self.allgather[lr]]
        if not flows:
            return 0.0
        return self.allgather_latency_s + self.allgather_slowdown_s + self.alone_s(tuple(flows))

    def issue(self, kind: str, block: int, local_rank: int) -> float:
        """Host seconds to issue one task (0 without a host lane)."""
        return self.kind_issue(kind, self.is_resident(block), local_rank)

    def kind_issue(self, kind: str, resident: bool, local_rank: int) -> float:
        """Host seconds to issue a task of `kind` of a resident or an offloaded block."""
        if not self.issue_s:
            return 0.0
        if kind == "update" and resident:
            kind = "resident_update"
        if kind == "slice_update":
            return float(self.issue_s["slice_update"][local_rank])
        return float(self.issue_s.get(kind, 0.0))

    def slice_group(self, local_rank: int) -> range:
        """Local ranks of the rank's slice group."""
        s = self.layout.slices
        first = local_rank // s * s
        return range(first, first + s)


# ---- the step -------------------------------------------------------------------
def step_costs(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               layout: Layout, schedule: str = "zoexec", resident: tuple[bool, ...] = (),
               period: int | None = None) -> StepCosts:
    """Per-task times and per-transfer flows of one step of `layout` (`schedule`: see
    task_times; "zo2" prices ZO2's four z draws per block). `resident`: per block,
    whether it stays on the devices (() or all False: every block offloaded); `period`:
    after how many blocks that pattern repeats (None: work it out; 0: it does not)."""
    lr = layout.local_ranks
    here, _ = stream_examples(examples=workload.batch, directions=workload.directions,
                              num_shards=layout.ddp)
    tokens = workload.priced_tokens(layout.ddp) / here if here > 1 \
        else workload.priced_tokens(layout.ddp)
    streams = (2 if layout.pertp == 1 else 1) * here
    block = float(model.block_bytes(workload.param_dtype))
    work = dict(_task_work(model, profile, workload, tokens, streams, lr, schedule, here))
    parts = work.pop("parts")
    work.update(_placement_work(model=model, profile=profile, workload=workload,
                                layout=layout, parts=parts, resident=resident,
                                period=period, update_s=work["update_s"]))
    if workload.frozen_base:
        work.update(_read_only(work))
    issue = host_issue(profile, work.pop("issue"), work.pop("issue_parts"),
                       copy_bytes=(block / layout.slices, block / lr))
    links = node_links(profile, lr)
    internode = internode_allreduce_s(profile, layout.nodes)
    small_s = allreduce_small_s(profile)
    flows = transfer_flows(profile, layout, block,
                           allgather_cap_Bps=allgather_busbw_gbps(profile, block) * GBPS)
    costs = StepCosts(
        layout=layout, concurrent=profile.concurrent_engines,
        num_blocks=model.num_layers, block_bytes=block, tokens_per_rank=tokens,
        streams=streams, **work, issue_s=issue,
        allreduce_s=(small_s + internode if layout.world_size > 1 else 0.0),  # zoexec skips a world of one
        internode_s=internode, allgather_latency_s=collective_latency_s(profile),
        links=links, rank_factors=rank_factors(profile, lr),
        fence_s=small_s if not profile.is_cpu and fence_needed(layout) else 0.0,
        contended=contended_links(profile, links), staged=staged(profile), **flows)
    if workload.frozen_base:
        costs = dataclasses.replace(costs, read_only=True, fence_s=0.0,
                                    d2h=tuple(() for _ in range(lr)))
    return shared_gpu(costs, interference(profile))


def shared_gpu(costs: StepCosts, k: Interference) -> StepCosts:
    """`costs` with its block tasks as zoplan.pricing.overlap.shared_gpu_times prices
    them while the compute and collective streams share the GPU (k: the profile's
    interference figures); this gathers one rank's work per block on each stream."""
    if not costs.concurrent or not costs.num_blocks:
        return costs
    gather = costs.allgather_alone_s(0) - costs.allgather_latency_s if costs.layout.slices > 1 else 0.0
    shared = shared_gpu_times(
        forward_s=costs.forward_s, update_s=costs.update_s,
        resident_update_s=costs.resident_update_s, slice_update_s=costs.slice_update_s,
        gather_s=gather, compute_stream_s=_compute_stream_s(costs),
        slice_s=costs.slice_s(0), other_s=_collective_other_s(costs), k=k)
    if shared is None:
        return costs
    return dataclasses.replace(
        costs, update_s=shared.update_s, forward_s=shared.forward_s,
        resident_update_s=shared.resident_update_s, slice_update_s=shared.slice_update_s,
        allgather_slowdown_s=shared.allgather_slowdown_s, overlap=shared.factors)


def _compute_stream_s(costs: StepCosts) -> float:
    """Rank 0's compute stream per block: its forward and (mean) update task."""
    blocks, res = costs.num_blocks, costs.num_resident()
    return costs.forward_s + (res * costs.resident_update_s
                              + (blocks - res) * costs.update_s) / blocks


def _collective_other_s(costs: StepCosts) -> float:
    """Rank 0's collective stream per block besides its slice update: the all-gather
    alone and the write-back fence of an offloaded block."""
    blocks, res = costs.num_blocks, costs.num_resident()
    return costs.allgather_alone_s(0) + costs.fence_s * (blocks - res) / blocks


@functools.lru_cache(maxsize=1024)
def _task_work(model: ModelSpec, profile: HardwareProfile, workload: Workload,
               tokens: int | float, streams: int, local_ranks: int, schedule: str,
               here: int = 1) -> dict[str, Any]:
    """The task times of zoplan.pricing (cached: a search asks for the same ones for
    every prefetch depth, slice group and placement; callers copy before changing)."""
    if workload.frozen_base:
        return lora_task_times(model=model, profile=profile, workload=workload, tokens=tokens,
                               streams=streams, local_ranks=local_ranks, here=here)
    return task_times(model=model, profile=profile, workload=workload, tokens=tokens,
                      streams=streams, local_ranks=local_ranks, schedule=schedule, here=here)


def _read_only(work: dict[str, Any]) -> dict[str, Any]:
    """LoRA (the base never changes): a resident block's update is the adapters' alone,
    no slice of the base is copied back into its shard."""
    issue = dict(work["issue_parts"], resident_copy=0.0)
    issue.pop("resident_update", None)
    return {"resident_update_s": work["update_s"], "issue_parts": issue}


def _placement_work(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                    layout: Layout, parts: dict[str, Any] | None, resident: tuple[bool, ...],
                    period: int | None, update_s: float) -> dict[str, Any]:
    """The tasks that placement and slice_update change: the update task of offloaded
    and resident blocks, the slice update per local rank, and the pattern (GPU parts
    are Work: device and host seconds; "issue" keeps the host's)."""
    resident = tuple(bool(r) for r in resident) if any(resident) else ()
    if resident and len(resident) != model.num_layers:
        raise ValueError(f"resident has {len(resident)} entries for {model.num_layers} blocks")
    out: dict[str, Any] = {"resident": resident,
           "period": (placement_period(resident) if period is None else period)
           if resident else 1}
    split = layout.slice_update and layout.slices > 1 and parts is not None
    issue: dict[str, Any] = {}
    if split and parts is not None:
        out["update_s"], issue["update"] = _device_host(parts["perturb"])
        one = [_device_host(parts["deferred"](*draws)) for draws in
               _slice_draws(model, layout.slices, layout.local_ranks, profile.device_kind)]
        mine = [one[lr % layout.slices] for lr in range(layout.local_ranks)]
        out["slice_update_s"] = tuple(d for d, _ in mine)
        issue["slice_update"] = tuple(h for _, h in mine)
        out["resident_update_s"], issue["resident_update"] = out["update_s"], issue["update"]
    else:   # the owner copies its slice of the updated block back into its shard
        # (slices > 1; with one slice the block is updated in place, blocks._resident_pass:
        # no copy, priced so on GPUs since pass 2's resident trace; CPU plans keep the
        # term, byte-identical to their golden files)
        copy = (shard_copy_s(model, profile, workload, layout)
                if layout.slices > 1 or profile.is_cpu else 0.0)
        out["resident_update_s"] = update_s + copy
        issue["resident_copy"] = launch_s(profile) if layout.slices > 1 else 0.0
    out["issue_parts"] = issue
    return out


def _device_host(work: Work | float) -> tuple[float, float]:
    """(device, host) seconds of a part: a GPU part is a Work, a CPU part one float."""
    return (work.device_s, work.host_s) if isinstance(work, Work) else (work, 0.0)


@functools.lru_cache(maxsize=256)
def _slice_draws(model: ModelSpec, slices: int, local_ranks: int, device_kind: str
                 ) -> tuple[tuple[list[int], list[int], list[int]], ...]:
    """Per slice: (z draw sizes, tensor pieces, rounding noise draw sizes) of its update
    (the same for every layout of these slices and local ranks: cached for the search)."""
    layout = Layout(pertp=1, ddp=local_ranks, slices=slices)
    return tuple((slice_z_numels(model, layout, k, device_kind), slice_pieces(model, layout, k),
                  slice_noise_numels(model, layout, k, device_kind)) for k in range(slices))


def placement_period(resident: tuple[bool, ...]) -> int:
    """The smallest p such that resident[b] == resident[b % p] for every block (0 when
    only the whole model repeats: no shorter pattern to extrapolate from)."""
    n = len(resident)
    for p in range(1, n // 2 + 1):
        if all(resident[b] == resident[b % p] for b in range(n)):
            return p
    return 0


def _slice_bounds(model: ModelSpec, layout: Layout, index: int) -> tuple[int, int]:
    """[start, stop) of slice `index` in the flat block (store_stride's slices; the
    last one ends in the padding)."""
    size = store_stride(model.block_params, slices=layout.slices,
                        local_ranks=layout.local_ranks) // layout.slices
    return index * size, (index + 1) * size


def slice_pieces(model: ModelSpec, layout: Layout, index: int) -> list[int]:
    """Elements of each of the block's tensors (laid end to end) in slice `index`."""
    lo, hi = _slice_bounds(model, layout, index)
    out, offset = [], 0
    for numel in model.block_tensor_numels():
        piece = min(hi, offset + numel) - max(lo, offset)
        if piece > 0:
            out.append(piece)
        offset += numel
    return out


def slice_z_numels(model: ModelSpec, layout: Layout, index: int, device_kind: str) -> list[int]:
    """Sizes of the z draws the owner of slice `index` makes to update its slice: every
    chunk of the block's tensors (laid end to end in the flat block) that overlaps the
    slice, drawn whole (zoplan.execrules.z_range_draws, zoexec.maths.zo.z_range)."""
    lo, hi = _slice_bounds(model, layout, index)
    return z_range_draws(model.block_tensor_numels(), lo, hi, device_kind)


def slice_noise_numels(model: ModelSpec, layout: Layout, index: int,
                       device_kind: str) -> list[int]:
    """Sizes of the stochastic rounding's noise draws of slice `index`'s update: every
    rounding chunk (execrules.sr_chunk) that overlaps the slice, drawn whole."""
    lo, hi = _slice_bounds(model, layout, index)
    chunk, out, offset = sr_chunk(device_kind), [], 0
    for numel in model.block_tensor_numels():
        out += [b - a for a, b in chunk_bounds(numel, chunk) if offset + a < hi and offset + b > lo]
        offset += numel
    return out


def shard_copy_s(model: ModelSpec, profile: HardwareProfile, workload: Workload,
                 layout: Layout) -> float:
    """Copy of the rank's slice of an updated, gathered block back into its resident
    shard (read and write, stored precision) at the device's memory bandwidth."""
    nbytes = 2 * dtype_bytes(workload.param_dtype) * model.block_params / layout.slices
    return device_copy_s(profile, nbytes)
