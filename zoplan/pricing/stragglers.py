"""Ranks and nodes that do not run alike: the spread of a node's ranks (rank_factors),
and the pace of the slowest of a job's nodes (straggler_factor).

Every node of a job runs the same per-node plan and every step ends in a global
barrier (the scalar all-reduce), so the job runs at the pace of its slowest node each
step. With a spread sigma (one standard deviation of a node's step time over its mean,
compute.node_spread, DEFAULT_NODE_SPREAD where a profile has none) the step of N nodes
is, in expectation, T_node x (1 + sigma x E[max of N standard normals]), plus, where
the profile gives it, a heavy tail of nodes with a persistent slow GPU. E[max] by
Blom's formula, Phi^-1((N - 0.375) / (N + 0.25)) (G. Blom, "Statistical Estimates and
Transformed Beta-Variables", 1958): 4.5% high for 2 nodes, 2.7% for 3, within 1% from
8 nodes on (tests/unit/test_sim_nodes.py checks it against the exact integral).
"""

from __future__ import annotations

from statistics import NormalDist

from zoplan.hardware import HardwareProfile
from zoplan.pricing.figures import given, or_

# A node's step-time spread where a profile gives none: an ASSUMPTION, not a
# measurement. Sinha et al. ("Not All GPUs Are Created Equal", SC'22, arXiv 2208.11035)
# measured an 8% average (22% at most) performance variation among the GPUs of one SKU
# in each of five large clusters: a spread from slowest to fastest, which over hundreds
# of samples is some 4-6 standard deviations, so about 1.5-2% one standard deviation.
# A node of 8 runs at its slowest GPU's pace (the all-gather of every block joins
# them), which narrows the spread between nodes; hosts, links and the network widen it.
# 2% (one standard deviation) is assumed; `zoplan calibrate --fit` on a trace of
# several nodes measures it (compute.node_spread).
DEFAULT_NODE_SPREAD = 0.02
BLOM_ALPHA = 0.375


def node_spread(profile: HardwareProfile) -> float:
    """A node's step-time spread (compute.node_spread, else DEFAULT_NODE_SPREAD)."""
    return float(or_(profile.figures().compute.node_spread, DEFAULT_NODE_SPREAD))


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
    core = node_spread(profile) * expected_max_normal(nodes)
    q = or_(profile.figures().compute.slow_node_fraction, 0.0)
    if nodes <= 1 or not q:
        return 1.0 + core
    tail = 1.0 - (1.0 - q) ** (nodes - 1)
    penalty = given(profile.figures().compute.slow_node_penalty, "compute.slow_node_penalty")
    return 1.0 + (1.0 - tail) * core + tail * max(penalty, core)


def rank_factors(profile: HardwareProfile, local_ranks: int) -> tuple[float, ...]:
    """Ranks that run at once do not run alike: on a profile with
    compute.rank_jitter (j: how far the slowest of the node's ranks runs above their
    mean, measured by `zoplan profile`), local rank r's compute tasks take
    1 + j * (2r / (k - 1) - 1) of their time (the slowest +j, the mean 1), so the
    simulator's ranks wait for each other at the write-back fence and the collectives
    as measured ranks do. On a GPU profile with compute.rank_jitter the GPUs of a node
    differ the same way (the slowest then paces every all-gather of its slice group).
    () (every rank 1) elsewhere."""
    jitter = or_(profile.figures().compute.rank_jitter, 0.0)
    if local_ranks < 2 or not jitter:
        return ()
    return tuple(1.0 + jitter * (2 * r / (local_ranks - 1) - 1) for r in range(local_ranks))
