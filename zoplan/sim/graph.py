"""Task graph of one steady-state training step for one layout, on ONE node.

All nodes of a job are identical (DDP across nodes, each node holds its own host copy),
so the graph covers the local ranks of node 0; the inter-node part of the scalar
all-reduce is added analytically to the all-reduce task (see `internode_allreduce_s`).

Per rank r and block b (execution semantics of docs/execution.md):
    h2d(b)  upload r's slice (1/slices of the block) from the node's host store
    slice_update(b)  Layout.slice_update (slices > 1): step t-1's deferred update of r's
              own slice (z for 1/slices of the block), before the all-gather
    allgather(b)  slice group exchanges slices (absent when slices == 1)
    update(b)  deferred update of step t-1 + perturbation of step t (with slice_update:
              the perturbation alone; a resident block without it also copies r's slice
              of the updated block back into its shard)
    forward(b)  "+-": both perturbations; "+" / "-": one
    d2h(b)  write back r's 1/local_ranks share of the updated block
    fence(b)  CUDA, 1 < local ranks and slices < local ranks: a node all-reduce of a
              token once the block is ready (zoexec's Trainer._fence), on the collective
              engine; simulated but not a span (the executor does not trace it)
plus embed (before block 0), head (after the last block) and allreduce (ends the step).
A resident block (StepCosts.resident: kept as shards on the slice group's devices) has
no h2d, d2h or fence: [slice_update], [allgather], update, forward.

Edges carry `why`:
    "data"    data flow (h2d -> [slice_update] -> allgather -> update -> forward -> d2h;
              last forward -> head)
    "buffer"  the task that fills a block buffer (h2d; the all-gather of a resident
              block) waits until the block `prefetch` buffer-using blocks earlier has
              released it (d2h; the forward of a resident block): `prefetch` buffers
    "fence"   d2h(b) waits for EVERY local rank's h2d(b) (write-back fence): directly
              (CPU), or through the fence collective (CUDA)
    "order"   program order on one engine (an engine does one thing at a time)
The slice update runs where the executor issues it: on a CUDA rank's collective stream,
right before the block's all-gather (it overlaps the compute stream's work; the HBM
bandwidth the two share is not priced), on a CPU rank in its serial order.
Collectives (allgather, allreduce) are one node per member rank with a shared `group`;
the simulator starts a group when all members have reached it.

Each node carries the work of the task: `dur_s` (compute time, or the fixed latency of
a collective) and `flows` ((bytes, route of link names, private cap in bytes/s), ...):
transfers whose rate the simulator decides by max-min fair sharing of the links. The
graph's `links` give each link's capacity, `contended` the capacity of a direction link
while the opposite direction of the same PCIe link or switch uplink is busy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import networkx as nx

from zoplan.execrules import chunk_bounds, fence_needed, sr_chunk, z_range_draws
from zoplan.hardware import HardwareProfile, gpu_block_bytes
from zoplan.layout import Layout
from zoplan.memory import store_stride
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.trace import KIND_LANE, NO_BLOCK, task_id
from zoplan.workload import Workload

INF = math.inf
SERIAL_LANE = "serial"   # engine name of a rank whose tasks run one at a time (CPU)
GBPS = 1e9               # profile bandwidths are GB/s = 1e9 bytes/s
# Operators of an embedding lookup and of the head + loss, as a share of a block
# forward's (~40 for an OPT block, ~4 and ~10): their share of its dispatch cost.
EMBED_OPS, HEAD_OPS = 0.1, 0.25

# Link classes: the profile figure that sets their capacity.
HOST_MEM = "host.mem_bw"
PCIE_H2D = "pcie.h2d"
PCIE_D2H = "pcie.d2h"
PCIE_DUPLEX = "pcie.duplex"
UPLINK_H2D = "pcie.uplink_h2d"
UPLINK_D2H = "pcie.uplink_d2h"
NVLINK = "fabric.nvlink"


def link_class(name: str) -> str:
    """`pcie.h2d/3` -> `pcie.h2d`."""
    return name.split("/", 1)[0]


@dataclass(frozen=True, kw_only=True)
class Flow:
    """One transfer: bytes over a route of links, at most `cap_Bps` on its own."""

    num_bytes: float
    route: tuple[str, ...]
    cap_Bps: float = INF


@dataclass(frozen=True, kw_only=True)
class StepCosts:
    """Every figure the graph, the simulator and the bounds need for one layout."""

    layout: Layout
    concurrent: bool                 # device.concurrent_engines
    num_blocks: int
    block_bytes: float               # one block in the stored precision
    tokens_per_rank: int
    streams: int                     # forward passes per rank (2 for "+-", 1 for PertP)
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
        return max((f.num_bytes / self.flow_rate_alone(f) for f in flows), default=0.0)

    def flow_rate_alone(self, flow: Flow) -> float:
        return min([flow.cap_Bps] + [self.links[name] for name in flow.route])

    def flow_rate_worst(self, flow: Flow) -> float:
        """A flow's rate alone on links whose opposite direction is busy (contended)."""
        return min([flow.cap_Bps] + [self.contended.get(name, (None, self.links[name]))[1]
                                     for name in flow.route])

    def allgather_alone_s(self, local_rank: int) -> float:
        """All-gather of the rank's group with the fabric to itself (latency + bytes)."""
        flows = [f for lr in self.slice_group(local_rank) for f in self.allgather[lr]]
        if not flows:
            return 0.0
        return self.allgather_latency_s + self.alone_s(tuple(flows))

    def slice_group(self, local_rank: int) -> range:
        """Local ranks of the rank's slice group."""
        s = self.layout.slices
        first = local_rank // s * s
        return range(first, first + s)


# ---- costs ------------------------------------------------------------------------
def internode_allreduce_s(profile: HardwareProfile, nodes: int) -> float:
    """Inter-node part of the scalar all-reduce: latency-bound recursive doubling,
    ceil(log2(nodes)) rounds of one network latency each (Thakur, Rabenseifner and
    Gropp, "Optimization of Collective Communication Operations in MPICH", 2005)."""
    if nodes <= 1:
        return 0.0
    return profile.network["latency_us"] * 1e-6 * math.ceil(math.log2(nodes))


def step_costs(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               layout: Layout, schedule: str = "zoexec", resident: tuple[bool, ...] = (),
               period: int | None = None) -> StepCosts:
    """Per-task times and per-transfer flows of one step of `layout` (`schedule`: see
    task_times; "zo2" prices ZO2's four z draws per block). `resident`: per block,
    whether it stays on the devices (() or all False: every block offloaded); `period`:
    after how many blocks that pattern repeats (None: work it out; 0: it does not)."""
    lr = layout.local_ranks
    tokens = workload.batch // layout.ddp * workload.seq
    streams = 2 if layout.pertp == 1 else 1
    block = float(model.block_bytes(workload.param_dtype))
    work = task_times(model=model, profile=profile, workload=workload, tokens=tokens,
                      streams=streams, local_ranks=lr, schedule=schedule)
    parts = work.pop("parts")
    work.update(_placement_work(model=model, profile=profile, workload=workload,
                                layout=layout, parts=parts, resident=resident,
                                period=period, update_s=work["update_s"]))
    links = node_links(profile, lr)
    internode = internode_allreduce_s(profile, layout.nodes)
    small_s = profile.collective["allreduce_small_us"] * 1e-6
    return StepCosts(
        layout=layout, concurrent=bool(profile.device.get("concurrent_engines", True)),
        num_blocks=model.num_layers, block_bytes=block, tokens_per_rank=tokens,
        streams=streams, **work,
        allreduce_s=(small_s + internode if layout.world_size > 1 else 0.0),  # zoexec skips a world of one
        internode_s=internode, allgather_latency_s=profile.collective["latency_us"] * 1e-6,
        links=links, rank_factors=rank_factors(profile, lr),
        fence_s=small_s if not profile.is_cpu and fence_needed(layout) else 0.0,
        contended=contended_links(profile, links), **_transfer_flows(profile, layout, block))


def _placement_work(*, model, profile, workload, layout, parts, resident, period,
                    update_s) -> dict:
    """The tasks that placement and slice_update change: the update task of offloaded
    and resident blocks, the slice update per local rank, and the pattern."""
    resident = tuple(bool(r) for r in resident) if any(resident) else ()
    if resident and len(resident) != model.num_layers:
        raise ValueError(f"resident has {len(resident)} entries for {model.num_layers} blocks")
    out = {"resident": resident,
           "period": (placement_period(resident) if period is None else period)
           if resident else 1}
    split = layout.slice_update and layout.slices > 1 and parts is not None
    if split:
        out["update_s"] = parts["perturb"]
        one = [parts["deferred"](*draws) for draws in
               _slice_draws(model, layout.slices, layout.local_ranks, profile.device["kind"])]
        out["slice_update_s"] = tuple(one[lr % layout.slices] for lr in range(layout.local_ranks))
        out["resident_update_s"] = parts["perturb"]
    else:   # the owner copies its slice of the updated block back into its shard
        out["resident_update_s"] = update_s + shard_copy_s(model, profile, workload, layout)
    return out


@functools.lru_cache(maxsize=256)
def _slice_draws(model: ModelSpec, slices: int, local_ranks: int, device_kind: str) -> tuple:
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
    if profile.is_cpu:
        return nbytes / (profile.compute["mem_gbps"] * GBPS)
    return profile.hbm_time_s(nbytes)


def rank_factors(profile: HardwareProfile, local_ranks: int) -> tuple[float, ...]:
    """Ranks that run at once do not run alike: on a CPU profile with
    compute.rank_jitter (j: how far the slowest of the node's ranks runs above their
    mean, measured by `zoplan profile`), local rank r's compute tasks take
    1 + j * (2r / (k - 1) - 1) of their time (the slowest +j, the mean 1), so the
    simulator's ranks wait for each other at the write-back fence and the collectives
    as measured ranks do. 1 for every rank elsewhere."""
    jitter = profile.compute.get("rank_jitter", 0.0) if profile.is_cpu else 0.0
    if local_ranks < 2 or not jitter:
        return ()
    return tuple(1.0 + jitter * (2 * r / (local_ranks - 1) - 1) for r in range(local_ranks))


# Bytes per parameter of the zo passes on a GPU (the executor's passes, docs/precision.md;
# p: the stored (param) dtype's bytes, c: the compute dtype's, in which z is drawn):
#   update pass    theta -= lr*g*z (zo.apply_update): reads theta and z, writes theta  2p + c
#   perturb pass   work = theta + eps*z (zo.perturb_into): reads theta and z, writes work
#                  in the compute dtype                                                p + 2c
#   ZO2 in place   theta += s*eps*z: reads theta and z, writes theta                   2p + c
# The stochastic update (zo.apply_update_stochastic; 16-bit theta and z) works per chunk
# of execrules.sr_chunk elements in fp32 scratch: copy theta in (6 bytes per element),
# add lr*g*z (10), draw the integer noise (one generator launch per chunk, priced like
# z), and round on the bits (zo.round_stochastic_: add the noise 12, shift or mask 8, copy
# into the 16-bit store 6): SR_BYTES per element in SR_KERNELS element-wise kernels per
# chunk, in place of the update pass (weight decay, when set, adds a multiply: not priced).
SR_BYTES = 6 + 10 + 12 + 8 + 6
SR_KERNELS = 5
CPU_PASS_BYTES = 12   # an fp32 pass, what compute.zo_pass_ns is measured on (CPU profiles)
SCHEDULES = ("zoexec", "zo2")   # z twice per block and step, or ZO2's four times


def zo_pass_bytes(*, param_bytes: int, compute_bytes: int) -> tuple[int, int]:
    """(update pass, perturb pass) bytes per parameter on a GPU (plain and master; the
    stochastic update replaces the update pass by SR_BYTES)."""
    p, c = param_bytes, compute_bytes
    return 2 * p + c, p + 2 * c


def sr_chunks(tensor_numels: list[int], device_kind: str) -> int:
    """Chunks of the stochastic update over these tensors (a noise draw and SR_KERNELS
    kernels each)."""
    chunk = sr_chunk(device_kind)
    return sum(len(chunk_bounds(n, chunk)) for n in tensor_numels)


def task_times(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               tokens: int, streams: int, local_ranks: int, schedule: str = "zoexec") -> dict:
    """embed_s, update_s, forward_s and head_s of one rank (the schedule of
    docs/execution.md): `tokens` per perturbation stream, `streams` forwards per block.

    update: the deferred update (a z draw + a pass) and the next perturbation (a z draw
    + a pass); `parts` splits it for slice_update: "deferred"(z draw sizes, tensor
    pieces, rounding noise draw sizes) prices the deferred update of a slice, "perturb" the perturbation alone
    (None for schedule "zo2"); forward: one block forward per stream, and the second stream's
    perturbation pass; embed: the resident parts' update, z and one perturbation pass
    per stream, and one embedding lookup per stream; head: one final norm + LM head +
    loss per stream and the resident perturbation pass between them. The update mode
    stochastic replaces the update pass by the fp32 update, its noise and the rounding's
    passes (SR_BYTES).
    schedule "zo2": ZO2 as published (zo-algorithms.md; zoexec.reference) perturbs
    +eps, -2eps, +eps (restore) in place and updates, each with a fresh z draw: four
    draws and four in-place passes per block and step."""
    assert schedule in SCHEDULES, schedule
    hw = profile
    cbytes = dtype_bytes(workload.compute_dtype)
    gpu = dict(compute_dtype=workload.compute_dtype, tf32=workload.tf32)
    if not hw.is_cpu:
        attn_bytes, _ = gpu_block_bytes(attn_dim=model.attn_dim, kv_dim=model.kv_dim,
                                        elems_per_token=0.0, tokens=tokens,
                                        dtype_bytes=cbytes)
        gpu["attn_bytes"] = attn_bytes
    fwd = hw.forward_time_s(flops=tokens * model.block_gemm_flops_per_token(),
                            attn_flops=tokens * model.block_attn_flops_per_token(workload.seq),
                            elems=tokens * model.block_elems_per_token(),
                            weight_bytes=model.block_params * cbytes, tokens=tokens,
                            local_ranks=local_ranks, family=model.family, **gpu)
    gpu.pop("attn_bytes", None)
    # the embedding lookup: per stream, its rows' bytes (GPU) or the element-wise terms
    # (measured CPU); the default CPU profile prices one call for all streams' rows
    per_call = hw.has_z_model or not hw.is_cpu
    rows = 0.0 if hw.has_z_model else tokens * model.hidden * cbytes
    lookup = hw.forward_time_s(flops=0.0, elems=tokens * model.embed_elems_per_token(),
                               weight_bytes=rows if per_call else streams * rows,
                               tokens=tokens, local_ranks=local_ranks,
                               overhead_share=EMBED_OPS if per_call else 1.0, **gpu)
    head_fwd = hw.forward_time_s(flops=tokens * model.head_flops_per_token(),
                                 elems=tokens * model.head_elems_per_token(),
                                 weight_bytes=model.vocab * model.hidden * cbytes,
                                 tokens=tokens, local_ranks=local_ranks,
                                 overhead_share=HEAD_OPS if per_call else 1.0, **gpu)
    args = dict(model=model, profile=hw, workload=workload, local_ranks=local_ranks,
                streams=streams, schedule=schedule)
    zo = (_gpu_zo if not hw.is_cpu else _cpu_zo_z_model if hw.has_z_model
          else _cpu_zo_per_param)(**args)
    lookups = streams * lookup if per_call else lookup
    return {"embed_s": zo["embed"] + lookups, "update_s": zo["update"],
            "forward_s": streams * fwd + zo["forward"],
            "head_s": streams * head_fwd + zo["head"], "parts": zo.get("parts")}


def _cpu_zo_per_param(*, model, profile, workload, local_ranks, streams, schedule) -> dict:
    """CPU profiles without the z model: compute.zo_ns_per_param prices the update
    task's 2 draws + 2 passes; ZO2's 4 + 4 cost twice that; the stochastic update's noise
    draw and rounding passes are taken to cost as much as the task again (a rough
    figure: a measured profile's z model prices them)."""
    factor = 2.0 if schedule == "zo2" else 1.0
    stochastic = 1.0 if workload.update == "stochastic" else 0.0
    factor += stochastic

    def deferred(_z_numels: list[int], pieces: list[int], _noise: list[int]) -> float:
        # half the task (a draw and a pass) and the rounding's share, on the slice
        return (0.5 + stochastic) * profile.zo_time_s(sum(pieces), local_ranks)
    parts = None if schedule == "zo2" else {
        "deferred": deferred, "perturb": 0.5 * profile.zo_time_s(model.block_params, local_ranks)}
    return {"embed": factor * profile.zo_time_s(model.embed_params, local_ranks),
            "update": factor * profile.zo_time_s(model.block_params, local_ranks),
            "forward": 0.0,
            "head": factor * profile.zo_time_s(model.head_params, local_ranks),
            "parts": parts}


def _cpu_zo_z_model(*, model, profile, workload, local_ranks, streams, schedule) -> dict:
    """CPU profiles with the z model: z draws and passes as measured (zoexec's schedule:
    2 draws + 2 passes per block, the second stream's perturbation in the forward). The
    stochastic update replaces the update pass by its noise, drawn chunk by chunk on
    one thread (z_chunk_us a chunk, z_ns_per_elem an element), and SR_BYTES of
    element-wise work (SR_BYTES / CPU_PASS_BYTES passes)."""
    hw, lr = profile, local_ranks
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()
    z_block, z_res = hw.z_time_s(block, lr), hw.z_time_s(resident, lr)
    pass_block = hw.pass_time_s(model.block_params, lr)
    pass_res = hw.pass_time_s(model.resident_params, lr)
    upd_block, upd_res = pass_block, pass_res

    def rounding(numels: list[int], one_pass: float) -> float:
        c = hw.compute
        noise = (sr_chunks(numels, "cpu") * c.get("z_chunk_us", 0.0) * 1e-6
                 + sum(numels) * c["z_ns_per_elem"] * 1e-9)
        return noise + SR_BYTES / CPU_PASS_BYTES * one_pass
    if workload.update == "stochastic":
        upd_block, upd_res = rounding(block, pass_block), rounding(resident, pass_res)

    def deferred(z_numels: list[int], pieces: list[int], noise: list[int]) -> float:
        """A slice's deferred update: z and the rounding's noise for every chunk it
        touches, the passes over its elements."""
        one_pass = hw.pass_time_s(sum(pieces), lr)
        upd = rounding(noise, one_pass) if workload.update == "stochastic" else one_pass
        return hw.z_time_s(z_numels, lr) + upd
    parts = {"deferred": deferred, "perturb": z_block + pass_block}
    if schedule == "zo2":
        return {"embed": 4 * z_res + upd_res + 3 * pass_res,
                "update": 4 * z_block + upd_block + 3 * pass_block,
                "forward": 0.0, "head": 0.0}
    if workload.update != "stochastic":   # as before the update modes (same floats)
        return {"embed": 2 * z_res + (1 + streams) * pass_res,
                "update": 2 * (z_block + pass_block),
                "forward": (streams - 1) * pass_block, "head": (streams - 1) * pass_res,
                "parts": parts}
    return {"embed": 2 * z_res + upd_res + streams * pass_res,
            "update": 2 * z_block + upd_block + pass_block,
            "forward": (streams - 1) * pass_block, "head": (streams - 1) * pass_res,
            "parts": parts}


def _gpu_zo(*, model, profile, workload, local_ranks, streams, schedule) -> dict:
    """GPU: z draws at z_launch_us per launch + z_ns_per_elem per element (one launch
    per 2**24-element chunk of a tensor, zoplan.execrules.z_draw_calls), passes by their bytes at HBM bandwidth
    (zo_pass_bytes), the stochastic update as SR_BYTES at HBM bandwidth, its noise drawn
    like z and SR_KERNELS launches a chunk (sr_chunks)."""
    hw = profile
    p, c = dtype_bytes(workload.param_dtype), dtype_bytes(workload.compute_dtype)
    upd, pert = zo_pass_bytes(param_bytes=p, compute_bytes=c)
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()
    z_block, z_res = hw.z_time_s(block), hw.z_time_s(resident)

    def update(numels: list[int]) -> float:
        if workload.update != "stochastic":
            return hw.hbm_time_s(upd * sum(numels))
        chunks = sr_chunks(numels, "cuda")
        return ((1 + SR_KERNELS) * chunks * hw.compute["z_launch_us"] * 1e-6
                + sum(numels) * hw.compute["z_ns_per_elem"] * 1e-9
                + hw.hbm_time_s(SR_BYTES * sum(numels)))
    upd_block, upd_res = update(block), update(resident)
    def deferred(z_numels: list[int], pieces: list[int], noise: list[int]) -> float:
        """A slice's deferred update: z of every chunk it touches (drawn whole); the
        stochastic update's noise of every rounding chunk it touches (whole), its passes
        over the slice's elements."""
        if workload.update != "stochastic":
            return hw.z_time_s(z_numels) + update(pieces)
        return (hw.z_time_s(z_numels) + (1 + SR_KERNELS) * len(noise) * hw.compute["z_launch_us"] * 1e-6
                + sum(noise) * hw.compute["z_ns_per_elem"] * 1e-9
                + hw.hbm_time_s(SR_BYTES * sum(pieces)))
    parts = {"deferred": deferred, "perturb": z_block + hw.hbm_time_s(pert * model.block_params)}
    if schedule == "zo2":   # in place: perturb, -2 eps, restore; a cast per stream
        extra = 3 * (2 * p + c) + (streams * (p + c) if p != c else 0)
        return {"embed": 4 * z_res + upd_res + hw.hbm_time_s(extra * model.resident_params),
                "update": 4 * z_block + upd_block + hw.hbm_time_s(extra * model.block_params),
                "forward": 0.0, "head": 0.0}
    return {"embed": 2 * z_res + upd_res + hw.hbm_time_s(streams * pert * model.resident_params),
            "update": 2 * z_block + upd_block + hw.hbm_time_s(pert * model.block_params),
            "forward": (streams - 1) * hw.hbm_time_s(pert * model.block_params),
            "head": (streams - 1) * hw.hbm_time_s(pert * model.resident_params),
            "parts": parts}


def node_links(profile: HardwareProfile, local_ranks: int) -> dict[str, float]:
    """Every shared link of one node, name -> capacity in bytes/s (alone; see
    contended_links for the capacities while the opposite direction runs)."""
    p = profile.pcie
    links = {HOST_MEM: profile.host["mem_bw_gbps"] * GBPS}
    for lr in range(local_ranks):
        links[f"{PCIE_H2D}/{lr}"] = p["h2d_gbps"] * GBPS
        links[f"{PCIE_D2H}/{lr}"] = p["d2h_gbps"] * GBPS
        links[f"{PCIE_DUPLEX}/{lr}"] = profile.duplex_gbps * GBPS
        if profile.fabric["kind"] in ("nvswitch", "bridge"):
            links[f"{NVLINK}/out{lr}"] = profile.fabric["p2p_gbps"] * GBPS
            links[f"{NVLINK}/in{lr}"] = profile.fabric["p2p_gbps"] * GBPS
    for g, group in enumerate(p.get("switch_groups") or []):
        if any(r < local_ranks for r in group):
            links[f"{UPLINK_H2D}/{g}"] = p["switch_uplink_gbps"] * GBPS
            links[f"{UPLINK_D2H}/{g}"] = p["switch_uplink_gbps"] * GBPS
    return links


def contended_links(profile: HardwareProfile, links: dict[str, float]
                    ) -> dict[str, tuple[str, float]]:
    """Direction links whose capacity drops while the opposite direction of the same
    link carries a transfer: link -> (opposite link, capacity then, bytes/s). A GPU's
    PCIe link (pcie.h2d_duplex_gbps / d2h_duplex_gbps: A100s measure H2D at 11-13 GB/s
    while D2H stays near 24) and, where the profile gives its figures, a switch uplink.
    Never above the capacity alone."""
    out: dict[str, tuple[str, float]] = {}
    pairs = [(PCIE_H2D, PCIE_D2H, "gpu"), (UPLINK_H2D, UPLINK_D2H, "uplink")]
    for h2d_class, d2h_class, kind in pairs:
        rates = profile.duplex_rates_gbps(kind)
        if rates is None:
            continue
        for name in links:
            if link_class(name) != h2d_class:
                continue
            other = f"{d2h_class}/{name.split('/', 1)[1]}"
            out[name] = (other, min(links[name], rates[0] * GBPS))
            out[other] = (name, min(links[other], rates[1] * GBPS))
    return out


def _switch_index(profile: HardwareProfile, local_rank: int) -> int | None:
    for g, group in enumerate(profile.pcie.get("switch_groups") or []):
        if local_rank in group:
            return g
    return None


def host_route(profile: HardwareProfile, local_rank: int, direction: str) -> tuple[str, ...]:
    """Links a host<->device copy of `local_rank` crosses ("h2d" or "d2h")."""
    own = PCIE_H2D if direction == "h2d" else PCIE_D2H
    route = [HOST_MEM, f"{own}/{local_rank}", f"{PCIE_DUPLEX}/{local_rank}"]
    g = _switch_index(profile, local_rank)
    if g is not None:
        route.append(f"{UPLINK_H2D if direction == 'h2d' else UPLINK_D2H}/{g}")
    return tuple(route)


def _transfer_flows(profile: HardwareProfile, layout: Layout, block: float) -> dict:
    lr, s = layout.local_ranks, layout.slices
    h2d = tuple((Flow(num_bytes=block / s, route=host_route(profile, r, "h2d")),)
                for r in range(lr))
    d2h = tuple((Flow(num_bytes=block / lr, route=host_route(profile, r, "d2h")),)
                for r in range(lr))
    return {"h2d": h2d, "d2h": d2h,
            "allgather": tuple(_allgather_flows(profile, r, s, block) for r in range(lr))}


def _allgather_flows(profile: HardwareProfile, local_rank: int, slices: int,
                     block: float) -> tuple[Flow, ...]:
    """One member's share of a ring all-gather of the block: it sends and receives
    (s-1)/s of the block (NCCL's bus bandwidth convention: time = bytes*(s-1)/s / busbw).
    The collective table caps each member's rate; the fabric decides the links."""
    if slices == 1:
        return ()
    num_bytes = block * (slices - 1) / slices
    cap = profile.allgather_busbw_gbps(block) * GBPS
    kind = profile.fabric["kind"]
    if kind in ("nvswitch", "bridge"):
        route = (f"{NVLINK}/out{local_rank}", f"{NVLINK}/in{local_rank}")
        return (Flow(num_bytes=num_bytes, route=route, cap_Bps=cap),)
    if kind == "host":  # through host memory: the sender's D2H, then the receiver's H2D
        return (Flow(num_bytes=num_bytes, route=host_route(profile, local_rank, "d2h"),
                     cap_Bps=cap),
                Flow(num_bytes=num_bytes, route=host_route(profile, local_rank, "h2d"),
                     cap_Bps=cap))
    return (Flow(num_bytes=num_bytes, route=(HOST_MEM,), cap_Bps=cap),)  # shm


# ---- graph --------------------------------------------------------------------------
_DATA, _BUFFER, _FENCE, _ORDER = ({"why": w} for w in ("data", "buffer", "fence", "order"))
FENCE = "fence"   # the CUDA write-back fence's collective: simulated, not a span of the trace
LANE_OF = {**KIND_LANE, FENCE: KIND_LANE["allgather"]}   # the executor's collective stream


SLICE_UPDATE = "slice_update"


def rank_order(costs: StepCosts, num_blocks: int) -> list[tuple[str, int]]:
    """(kind, block) of one rank's tasks in program order (the CPU's serial order)."""
    order = [("embed", NO_BLOCK)]
    order += [(kind, b) for b in range(num_blocks) for kind in _block_kinds(costs, b)]
    return order + [("head", NO_BLOCK), ("allreduce", NO_BLOCK)]


def _block_kinds(costs: StepCosts, block: int) -> list[str]:
    resident = costs.is_resident(block)
    kinds = [] if resident else ["h2d"]
    kinds += [SLICE_UPDATE] if costs.split_update else []
    kinds += ["allgather"] if costs.layout.slices > 1 else []
    kinds += [FENCE] if costs.fence_s and not resident else []
    return kinds + ["update", "forward"] + ([] if resident else ["d2h"])


def build_step_graph(costs: StepCosts, *, num_blocks: int | None = None):
    """The networkx DiGraph of one step on node 0 (`num_blocks` < the model's blocks
    gives the reduced graphs the search extrapolates from)."""
    num_blocks = costs.num_blocks if num_blocks is None else num_blocks
    graph = nx.DiGraph(links=dict(costs.links), contended=dict(costs.contended),
                       concurrent=costs.concurrent, num_blocks=num_blocks,
                       local_ranks=costs.local_ranks)
    order = rank_order(costs, num_blocks)
    nodes, edges = [], []
    for lr in range(costs.local_ranks):
        nodes += _rank_nodes(costs, lr, order)
        edges += _order_edges(costs, lr, order)   # first: a data edge's label wins
        edges += _rank_edges(costs, lr, num_blocks)
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    return graph


def _engine_of(costs: StepCosts, rank: int, kind: str) -> str:
    return f"r{rank}/{LANE_OF[kind] if costs.concurrent else SERIAL_LANE}"


def _rank_nodes(costs: StepCosts, lr: int, order: list[tuple[str, int]]) -> list:
    engines = {kind: _engine_of(costs, lr, kind) for kind in LANE_OF}
    work = {kind: _work(costs, lr, kind) for kind in LANE_OF}
    resident_update = {**work["update"], "dur_s": costs.resident_update_s * costs.factor(lr)}
    nodes, seq = [], dict.fromkeys(engines.values(), -1)
    for kind, block in order:
        engine = engines[kind]
        seq[engine] += 1
        task = (resident_update if kind == "update" and costs.is_resident(block)
                else work[kind])
        attrs = {"kind": kind, "rank": lr, "block": block, "lane": LANE_OF[kind],
                 "engine": engine, "seq": seq[engine], "record": kind != FENCE, **task}
        if kind == "allgather":
            attrs["group"] = ("allgather", block, lr // costs.layout.slices)
        elif kind == FENCE:
            attrs["group"] = (FENCE, block, 0)   # every local rank of the node
        nodes.append((task_id(kind, lr, block), attrs))
    return nodes


def _work(costs: StepCosts, lr: int, kind: str) -> dict:
    """The work of a task of this kind on this rank (the same for every block)."""
    work = {"dur_s": 0.0, "flows": (), "group": None}
    if kind in ("embed", "update", "forward", "head"):
        work["dur_s"] = getattr(costs, f"{kind}_s") * costs.factor(lr)
    elif kind == SLICE_UPDATE:
        work["dur_s"] = costs.slice_s(lr) * costs.factor(lr)
    elif kind in ("h2d", "d2h"):
        work["flows"] = getattr(costs, kind)[lr]
    elif kind == "allgather":
        work.update(dur_s=costs.allgather_latency_s, flows=costs.allgather[lr])
    elif kind == FENCE:
        work["dur_s"] = costs.fence_s
    elif kind == "allreduce":
        work.update(dur_s=costs.allreduce_s, group=("allreduce", NO_BLOCK, 0))
    return work


def _rank_edges(costs: StepCosts, lr: int, num_blocks: int) -> list:
    """Data, buffer and fence edges into the rank's tasks."""
    lay = costs.layout
    group = list(costs.slice_group(lr))
    outside = [m for m in range(lay.local_ranks) if m not in group]
    edges = []
    for b in range(num_blocks):
        edges += _block_edges(costs, lr, b, group, outside)
    edges += _buffer_edges(costs, lr, num_blocks)
    first = f"forward/b0/r{lr}" if num_blocks else task_id("head", lr)
    last = f"forward/b{num_blocks - 1}/r{lr}" if num_blocks else task_id("embed", lr)
    edges += [(task_id("embed", lr), first, _DATA), (last, task_id("head", lr), _DATA)]
    edges += [(task_id("head", m), task_id("allreduce", lr), _DATA)
              for m in range(lay.local_ranks)]
    return edges


def _block_edges(costs: StepCosts, lr: int, b: int, group: list[int],
                 outside: list[int]) -> list:
    """Data and fence edges of one block on one rank."""
    resident = costs.is_resident(b)
    upd, fwd = task_id("update", lr, b), task_id("forward", lr, b)
    edges = [(upd, fwd, _DATA)]
    # what each member contributes to the block: its uploaded (and updated) slice
    source = {m: task_id(SLICE_UPDATE if costs.split_update else "h2d", m, b) for m in group}
    if costs.split_update and not resident:
        edges.append((task_id("h2d", lr, b), source[lr], _DATA))
    if costs.layout.slices > 1:
        ready = task_id("allgather", lr, b)
        edges += [(source[m], ready, _DATA) for m in group
                  if not (resident and not costs.split_update)]
    else:
        ready = None if resident else task_id("h2d", lr, b)
    if ready is not None:
        edges.append((ready, upd, _DATA))
    if resident:
        return edges
    d2h = task_id("d2h", lr, b)
    edges.append((fwd, d2h, _DATA))
    if costs.fence_s:   # CUDA: a node collective issued once the block is ready
        fence = task_id(FENCE, lr, b)
        edges += [(ready, fence, _DATA), (fence, d2h, _FENCE)]
    else:   # the slice group's h2d already precede d2h via the all-gather
        edges += [(task_id("h2d", m, b), d2h, _FENCE) for m in outside]
    return edges


def _buffer_edges(costs: StepCosts, lr: int, num_blocks: int) -> list:
    """The task that fills a buffer waits for the block `prefetch` buffer-using blocks
    earlier to release it (module docstring)."""
    using = [b for b in range(num_blocks) if costs.uses_buffer(b)]
    p = costs.layout.prefetch
    edges = []
    for i in range(p, len(using)):
        before, b = using[i - p], using[i]
        release = task_id("forward" if costs.is_resident(before) else "d2h", lr, before)
        fill = task_id("allgather" if costs.is_resident(b) else "h2d", lr, b)
        edges.append((release, fill, _BUFFER))
    return edges


def _order_edges(costs: StepCosts, lr: int, order: list) -> list:
    """Program order on each engine (where a data edge joins the same pair, it is added
    after these and its label wins)."""
    last_on: dict[str, tuple[str, str]] = {}
    edges = []
    for kind, block in order:
        engine, node = _engine_of(costs, lr, kind), task_id(kind, lr, block)
        prev = last_on.get(engine)
        if prev is not None:
            edges.append((prev[0], node, _ORDER))
        last_on[engine] = (node, kind)
    return edges
