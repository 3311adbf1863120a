"""Many identical nodes: the pace of the slowest, and what the nodes add to a step.

Every node of a job runs the same per-node plan (zoplan.sim.graph simulates one), and
every step ends in a global barrier (the scalar all-reduce), so the job runs at the pace
of its slowest node each step. A node's step time varies from node to node and step to
step (GPUs of one model differ in speed by a few percent under power and thermal
management; hosts, links and the network add their own noise): with a spread sigma (one
standard deviation of a node's step time over its mean, the profile's
compute.node_spread [D], or a calibration's) the step of N nodes is, in expectation,

    T_N = T_node * (1 + sigma * E[max of N standard normals])

plus, where the profile gives it, a heavy tail: a share of nodes carries a persistent
slow GPU (Sinha et al., SC'22: 8% slower on average, 22% at worst; straggler_factor).
E[max] by Blom's formula, Phi^-1((N - 0.375) / (N + 0.25)) (G. Blom, "Statistical
Estimates and Transformed Beta-Variables", 1958). Against the exact value (the integral
of x N phi(x) Phi(x)^(N-1), checked by tests/unit/test_sim_nodes.py) it is 4.5% high
for 2 nodes, 2.7% for 3, and within 1% from 8 nodes on (3.787 against 3.802 for 8,192
nodes), where the classic sqrt(2 ln N) overstates it (4.245). T_node is the simulated node step (the inter-node all-reduce's latency
included, zoplan.sim.costs.internode_allreduce_s).

Scaling efficiency (weak scaling: the per-node batch held) = the step of one node
running the same per-node plan alone / the step of the job: what the inter-node
all-reduce and the slowest node cost. Tokens per second grow with nodes times it.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from zoplan.hardware import HardwareProfile

BLOM_ALPHA = 0.375


def expected_max_normal(count: int) -> float:
    """E[max of `count` independent standard normal draws] (Blom's approximation; 0
    for one draw)."""
    if count <= 1:
        return 0.0
    return NormalDist().inv_cdf((count - BLOM_ALPHA) / (count - 2 * BLOM_ALPHA + 1))


def straggler_factor(profile: HardwareProfile, nodes: int) -> float:
    """The job's step over one node's: 1 + spread x E[max of `nodes` normals], with the
    heavy tail where the profile gives it (compute.slow_node_fraction q and
    slow_node_penalty s): with probability P = 1 - (1 - q)^(nodes - 1) another node of
    the job carries a persistent slow GPU and paces the job at 1 + max(s, the Gaussian
    core's lead)."""
    core = profile.node_spread * expected_max_normal(nodes)
    q = profile.compute.get("slow_node_fraction", 0.0)
    if nodes <= 1 or not q:
        return 1.0 + core
    tail = 1.0 - (1.0 - q) ** (nodes - 1)
    return 1.0 + (1.0 - tail) * core + tail * max(profile.compute["slow_node_penalty"], core)


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
