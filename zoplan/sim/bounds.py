"""Analytic bounds on the step time of a layout, for pruning and for tests.

Lower bounds (the simulated step can never beat any of them):
- each link: bytes it must carry in one step / its capacity (every rank's PCIe H2D, D2H
  and duplex, each switch uplink per direction, host memory, each NVLink port);
- each pair of directions that contend (a GPU's PCIe link, a switch uplink): the least
  time both directions' bytes need at their alone and duplex rates (duplex_pair_s);
- each rank's compute engine: embed + the blocks' (update + forward) + head;
- each rank's collective engine: the blocks' slice updates and all-gathers alone + the
  CUDA write-back fence's latency of each offloaded block + all-reduce;
- on CPU profiles (one engine per rank): the sum of all the rank's tasks, each alone;
- on GPU profiles, each rank's host lane: the issue of all its tasks (no task ends
  before its issue, the last one's included);
- the dependency chain through the block buffers: with `prefetch` buffers, the block
  `prefetch` buffer-using blocks later waits for a block to release its buffer, so
  each chain of every p-th such block runs its pipelines (h2d, slice update,
  all-gather, update, forward, d2h, each alone; a resident block: no h2d or d2h) back
  to back, then the compute of the blocks after the chain's last, the head and the
  all-reduce.
Offloaded and resident blocks (StepCosts.resident) are counted apart: a resident block
moves no bytes over PCIe or host memory.
Upper bound: the busiest host lane's issue, then every task and every flow of the node
one after the other, each alone
(max-min fair sharing gives each of k concurrent flows at least 1/k of its rate alone,
so the work done per second never falls below one task's worth); a flow on a PCIe
direction whose capacity drops while the other direction runs counts at that lower
rate. The link bounds use each link's capacity alone: a valid, looser bound where
directions contend (the duplex link, both directions' sum, tightens it).
"""

from __future__ import annotations

from dataclasses import dataclass

from zoplan.pricing.copies import PCIE_DUPLEX, PCIE_H2D, UPLINK_H2D
from zoplan.sim.costs import StepCosts
from zoplan.sim.graph import block_kinds
from zoplan.sim.links import link_class

COMPUTE = "compute"
COLLECTIVE = "collective"
SERIAL = "serial engine"
HOST = "host"        # a GPU rank's host thread, issuing every task (zoplan.pricing.host)
CHAIN = "pipeline"   # the dependency chain through the prefetch buffers
# Both directions of a GPU's PCIe link / of a switch uplink, where they contend: the
# resource class their duplex_pair_s bound counts under.
DUPLEX_CLASSES = {PCIE_H2D: PCIE_DUPLEX, UPLINK_H2D: "pcie.uplink_duplex"}


@dataclass(frozen=True, kw_only=True)
class StepBounds:
    resources: dict[str, float]   # resource class -> seconds its busiest instance works
    chain_s: float
    serial_s: float

    @property
    def lower_bound_s(self) -> float:
        return max(max(self.resources.values(), default=0.0), self.chain_s)

    @property
    def binding(self) -> str:
        """The resource (or the buffer chain) that sets the lower bound."""
        best = max(sorted(self.resources.items()), key=lambda kv: kv[1])
        return CHAIN if self.chain_s > best[1] else best[0]

    def utilisation(self, step_time_s: float) -> dict[str, float]:
        """Busy fraction of each resource's busiest instance in a step of that length."""
        return {name: busy / step_time_s for name, busy in sorted(self.resources.items())}


def link_bytes(costs: StepCosts, num_blocks: int | None = None) -> dict[str, float]:
    """Bytes every link of the node carries in one step."""
    blocks = costs.num_blocks if num_blocks is None else num_blocks
    offloaded = blocks - costs.num_resident(blocks)
    out = {name: 0.0 for name in costs.links}
    for lr in range(costs.local_ranks):
        for count, flows in ((offloaded, costs.h2d[lr] + costs.d2h[lr]),
                             (blocks, costs.allgather[lr])):
            for flow in flows:
                for name in flow.route:
                    out[name] += count * flow.num_bytes
    return out


def duplex_pair_s(a_bytes: float, b_bytes: float, *, alone: tuple[float, float],
                  contended: tuple[float, float]) -> float:
    """Least time two opposite directions of one link need for their bytes when each
    runs at `alone` rates by itself and at `contended` rates while both run: t(x) = x +
    (A - ca x) / Ca + (B - cb x) / Cb for x seconds of overlap is linear in x, so its
    least value is at no overlap or at the most (one direction done while overlapping)."""
    (ca_alone, cb_alone), (ca, cb) = alone, contended
    serial = a_bytes / ca_alone + b_bytes / cb_alone
    most = min(a_bytes / ca, b_bytes / cb)
    overlapped = most + (a_bytes - ca * most) / ca_alone + (b_bytes - cb * most) / cb_alone
    return min(serial, overlapped)


def _duplex_busy_s(costs: StepCosts, nbytes: dict[str, float]) -> dict[str, float]:
    """Per class of contended link pair (pcie.h2d: a GPU's link, pcie.uplink_h2d: a
    switch uplink), the busiest pair's duplex_pair_s."""
    out: dict[str, float] = {}
    for name, (other, cap) in costs.contended.items():
        cls = link_class(name)
        if cls not in DUPLEX_CLASSES:
            continue
        busy = duplex_pair_s(nbytes[name], nbytes[other],
                             alone=(costs.links[name], costs.links[other]),
                             contended=(cap, costs.contended[other][1]))
        key = DUPLEX_CLASSES[cls]
        out[key] = max(out.get(key, 0.0), busy)
    return out


def step_bounds(costs: StepCosts, num_blocks: int | None = None) -> StepBounds:
    blocks = costs.num_blocks if num_blocks is None else num_blocks
    resources: dict[str, float] = {}
    nbytes = link_bytes(costs, blocks)
    for name, moved in nbytes.items():
        cls = link_class(name)
        resources[cls] = max(resources.get(cls, 0.0), moved / costs.links[name])
    for cls, busy in _duplex_busy_s(costs, nbytes).items():
        resources[cls] = max(resources.get(cls, 0.0), busy)
    alone = _ranks_alone(costs)
    step = _blocks_of(costs, blocks)
    engines = [_engine_busy(costs, lr, step, alone[lr]) for lr in range(costs.local_ranks)]
    for engine in engines:
        for name, seconds in engine.items():
            resources[name] = max(resources.get(name, 0.0), seconds)
    host = _host_lanes(costs, blocks)
    if costs.issue_s:
        resources[HOST] = max(host)
    shapes = _chain_shapes(costs, blocks)
    chain = max(_chain_s(costs, lr, step, alone[lr], shapes) for lr in range(costs.local_ranks))
    return StepBounds(resources=resources, chain_s=chain,
                      serial_s=_serial_s(costs, step) + max(host))


@dataclass(frozen=True, kw_only=True)
class _Blocks:
    """What the bounds of every rank share: the step's blocks, how many of them are
    offloaded, and their compute before a rank's factor (computed once a step)."""

    count: int
    offloaded: int
    compute_s: float


def _blocks_of(costs: StepCosts, blocks: int) -> _Blocks:
    return _Blocks(count=blocks, offloaded=blocks - costs.num_resident(blocks),
                   compute_s=_blocks_compute_s(costs, 0, blocks))


def host_lane_s(costs: StepCosts, lr: int, blocks: int) -> float:
    """The rank's host thread issuing every task of the step (0 without a host lane):
    the embed, head and all-reduce, and per offloaded and per resident block its
    tasks' issue (zoplan.sim.graph.block_kinds), times how many such blocks there are."""
    if not costs.issue_s:
        return 0.0
    res = costs.num_resident(blocks)
    total = sum(costs.kind_issue(kind, False, lr) for kind in ("embed", "head", "allreduce"))
    for resident, count in ((False, blocks - res), (True, res)):
        if count:
            total += count * sum(costs.kind_issue(kind, resident, lr)
                                 for kind in block_kinds(costs, resident))
    return total


def _host_lanes(costs: StepCosts, blocks: int) -> list[float]:
    """host_lane_s of every local rank, computed once per distinct slice-update issue:
    the one figure of host_lane_s that depends on the rank (every other kind's issue
    is the same for all ranks), so ranks with the same one have the same lane."""
    slice_issue = costs.issue_s.get("slice_update") if costs.issue_s else None
    lanes: dict[float | None, float] = {}
    out = []
    for lr in range(costs.local_ranks):
        key = slice_issue[lr] if slice_issue else None
        if key not in lanes:
            lanes[key] = host_lane_s(costs, lr, blocks)
        out.append(lanes[key])
    return out


def _ranks_alone(costs: StepCosts) -> list[dict[str, float]]:
    """Per local rank, its h2d, d2h and all-gather of one block, each alone; the
    all-gather's computed once per slice group (StepCosts.allgather_alone_s depends on
    the rank only through its group)."""
    gathers: dict[int, float] = {}
    out = []
    for lr in range(costs.local_ranks):
        group = lr // costs.layout.slices
        if group not in gathers:
            gathers[group] = costs.allgather_alone_s(lr)
        out.append({"h2d": costs.alone_s(costs.h2d[lr]), "d2h": costs.alone_s(costs.d2h[lr]),
                    "allgather": gathers[group]})
    return out


def _compute_s(costs: StepCosts, lr: int, step: _Blocks) -> float:
    """The rank's compute engine's work in a step of `step.count` blocks."""
    return (costs.embed_s + step.compute_s + costs.head_s) * costs.factor(lr)


def _blocks_compute_s(costs: StepCosts, first: int, stop: int) -> float:
    """Compute of blocks first..stop-1 (update + forward; before the rank's factor)."""
    count = max(0, stop - first)
    resident = sum(costs.resident[first:stop]) if costs.resident else 0
    return (count * costs.forward_s + resident * costs.resident_update_s
            + (count - resident) * costs.update_s)


def _engine_busy(costs: StepCosts, lr: int, step: _Blocks,
                 alone: dict[str, float]) -> dict[str, float]:
    blocks, offloaded = step.count, step.offloaded
    compute = _compute_s(costs, lr, step)
    slices = blocks * costs.slice_s(lr) * costs.factor(lr)
    if not costs.concurrent:
        moves = offloaded * (alone["h2d"] + alone["d2h"]) + blocks * alone["allgather"]
        return {SERIAL: compute + slices + moves + costs.allreduce_s}
    return {COMPUTE: compute,
            COLLECTIVE: (slices + blocks * alone["allgather"] + offloaded * costs.fence_s
                         + costs.allreduce_s)}


def _chain_shapes(costs: StepCosts, blocks: int) -> list[tuple[int, int, int, int, float]] | None:
    """The chains through the `prefetch` block buffers, the same for every rank: per
    chain (blocks, offloaded, resident, releases, compute of the blocks after its last
    one); None when no block uses a buffer."""
    resident = costs.resident[:blocks] if costs.resident else (False,) * blocks
    if costs.layout.slices > 1:
        using: range | list[int] = range(blocks)
    else:
        using = [b for b in range(blocks) if not resident[b]]
    if not using:
        return None
    p = costs.layout.prefetch
    shapes = []
    for start in range(min(p, len(using))):
        chain = using[start::p]
        n_res = sum(resident[start::p]) if isinstance(using, range) else 0
        n_host = len(chain) - n_res
        releases = n_host - (0 if resident[chain[-1]] else 1)
        shapes.append((len(chain), n_host, n_res, releases,
                       _blocks_compute_s(costs, chain[-1] + 1, blocks)))
    return shapes


def _chain_s(costs: StepCosts, lr: int, step: _Blocks, alone: dict[str, float],
             shapes: list[tuple[int, int, int, int, float]] | None) -> float:
    """Longest dependency path of the rank through its `prefetch` block buffers
    (`shapes`: _chain_shapes): each block of a chain runs its pipeline (fill ..
    compute, each task alone) and, but for the last, releases its buffer (d2h; a
    resident block's release is its forward)."""
    f = costs.factor(lr)
    tail = costs.head_s * f + costs.allreduce_s
    if shapes is None:   # the compute engine's program order alone
        return _compute_s(costs, lr, step) + costs.allreduce_s
    slice_s = costs.slice_s(lr)
    best = 0.0
    for length, n_host, n_res, releases, after in shapes:
        path = ((n_host * (alone["h2d"] + alone["allgather"]) + n_res * alone["allgather"])
                + length * slice_s * f
                + (n_host * costs.update_s + n_res * costs.resident_update_s
                   + length * costs.forward_s) * f
                + releases * alone["d2h"])
        best = max(best, path + after * f)
    return best + tail


def _serial_s(costs: StepCosts, step: _Blocks) -> float:
    """Every task and every flow of the node one after the other, each alone."""
    blocks, offloaded = step.count, step.offloaded
    total = costs.allreduce_s
    num_groups = costs.local_ranks // costs.layout.slices if costs.layout.slices > 1 else 0
    total += blocks * num_groups * costs.allgather_latency_s + offloaded * costs.fence_s
    for lr in range(costs.local_ranks):
        total += _compute_s(costs, lr, step) + blocks * costs.slice_s(lr) * costs.factor(lr)
        moves = ((offloaded, costs.h2d[lr] + costs.d2h[lr]), (blocks, costs.allgather[lr]))
        total += sum(count * sum(f.num_bytes / costs.flow_rate_worst(f) for f in flows)
                     for count, flows in moves)
    return total
