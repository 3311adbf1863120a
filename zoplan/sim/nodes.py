"""Many identical nodes: what the nodes add to a step, and how well a job scales.

Every node of a job runs the same per-node plan (zoplan.sim.graph simulates one), and
every step ends in a global barrier (the scalar all-reduce), so the job runs at the pace
of its slowest node each step: the simulated node step times
zoplan.pricing.stragglers.straggler_factor (a node's spread, compute.node_spread, and
the heavy tail of slow nodes). T_node is the simulated node step (the inter-node
all-reduce's latency included, zoplan.pricing.collectives.internode_allreduce_s).

Scaling efficiency (weak scaling: the per-node batch held) = the step of one node
running the same per-node plan alone / the step of the job: what the inter-node
all-reduce and the slowest node cost. Tokens per second grow with nodes times it.
"""

from __future__ import annotations

import math

from zoplan.hardware import HardwareProfile
from zoplan.pricing.stragglers import straggler_factor


def job_step_s(profile: HardwareProfile, nodes: int, node_step_s: float) -> float:
    return node_step_s * straggler_factor(profile, nodes)


def one_node_step_s(node_step_s: float, internode_s: float) -> float:
    """The same per-node plan on one node alone: no inter-node all-reduce."""
    return node_step_s - internode_s


def scaling_efficiency(*, one_node_s: float, step_s: float) -> float:
    return one_node_s / step_s if step_s > 0 else 1.0


def sweep_counts(nodes: int, *, least_top: int = 1024) -> list[int]:
    """Node counts of a sweep: powers of two up to the larger of `nodes` and
    `least_top`, and `nodes` itself."""
    top = max(nodes, least_top)
    return sorted({1 << k for k in range(int(math.log2(top)) + 1)} | {nodes})
