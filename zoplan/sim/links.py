"""The node's shared links and the flows one step's copies put on them.

Link classes name the profile figure that sets a link's capacity (host memory, each
GPU's PCIe directions and their duplex sum, each switch uplink per direction, each
GPU's NVLink ports). A transfer is one or more `Flow`s: bytes over a route of links,
optionally capped on its own (the collective table); the simulator (zoplan.sim.simulate)
shares the links max-min fairly. `contended_links` gives the capacity of a direction
link while the opposite direction of the same PCIe link or switch uplink is busy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoplan.hardware import HardwareProfile
from zoplan.layout import Layout

INF = math.inf
GBPS = 1e9               # profile bandwidths are GB/s = 1e9 bytes/s

# Link classes: the profile figure that sets their capacity.
HOST_MEM = "host.mem_bw"
PCIE_H2D = "pcie.h2d"
PCIE_D2H = "pcie.d2h"
PCIE_DUPLEX = "pcie.duplex"
UPLINK_H2D = "pcie.uplink_h2d"
UPLINK_D2H = "pcie.uplink_d2h"
NVLINK = "fabric.nvlink"
# The link between the sockets of a two-socket host, per direction: the store's pages
# spread over the sockets, so every host<->device flow sends HardwareProfile.remote_share
# of its bytes across it; its capacity is counted in the flows' bytes (the link's own
# GB/s / remote_share), so fair sharing among those flows stays exact.
SOCKET_H2D = "host.socket_h2d"
SOCKET_D2H = "host.socket_d2h"


def link_class(name: str) -> str:
    """`pcie.h2d/3` -> `pcie.h2d`."""
    return name.split("/", 1)[0]


@dataclass(frozen=True, kw_only=True)
class Flow:
    """One transfer: bytes over a route of links, at most `cap_Bps` on its own."""

    num_bytes: float
    route: tuple[str, ...]
    cap_Bps: float = INF


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
    if profile.remote_share:
        cap = profile.host["socket_link_gbps"] * GBPS / profile.remote_share
        links[SOCKET_H2D] = links[SOCKET_D2H] = cap
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
    if profile.remote_share:
        route.append(SOCKET_H2D if direction == "h2d" else SOCKET_D2H)
    return tuple(route)


def transfer_flows(profile: HardwareProfile, layout: Layout, block: float) -> dict:
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
