"""The node's shared links and the flows one step's copies put on them.

Link classes name the profile figure that sets a link's capacity (host memory, each
GPU's PCIe directions and their duplex sum, each switch uplink per direction, each
GPU's NVLink ports). A transfer is one or more `Flow`s: bytes over a route of links,
optionally capped on its own (the collective table); the simulator (zoplan.sim.simulate)
shares the links max-min fairly. `contended_links` gives the capacity of a direction
link while the opposite direction of the same PCIe link or switch uplink is busy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypedDict

from zoplan.hardware import HardwareProfile
from zoplan.layout import Layout
from zoplan.pricing.copies import (
    HOST_MEM,
    NVLINK,
    PCIE_D2H,
    PCIE_DUPLEX,
    PCIE_H2D,
    SOCKET_D2H,
    SOCKET_H2D,
    UPLINK_D2H,
    UPLINK_H2D,
    contended_capacities,
    link_capacities,
    remote_share,
)

INF = math.inf


@functools.lru_cache(maxsize=4096)
def link_class(name: str) -> str:
    """`pcie.h2d/3` -> `pcie.h2d` (cached: the bounds ask for every link of every
    layout)."""
    return name.split("/", 1)[0]


@dataclass(frozen=True, kw_only=True)
class Flow:
    """One transfer: bytes over a route of links, at most `cap_Bps` on its own."""

    num_bytes: float
    route: tuple[str, ...]
    cap_Bps: float = INF


def node_links(profile: HardwareProfile, local_ranks: int) -> dict[str, float]:
    """Every shared link of one node, name -> capacity in bytes/s (alone, from
    zoplan.pricing.copies; see contended_links for the capacities while the opposite
    direction runs)."""
    return dict(_node_links(profile, local_ranks))


@functools.lru_cache(maxsize=256)
def _node_links(profile: HardwareProfile, local_ranks: int) -> tuple[tuple[str, float], ...]:
    caps = link_capacities(profile)
    links = {HOST_MEM: caps[HOST_MEM]}
    for lr in range(local_ranks):
        for cls in (PCIE_H2D, PCIE_D2H, PCIE_DUPLEX):
            links[f"{cls}/{lr}"] = caps[cls]
        if NVLINK in caps:
            links[f"{NVLINK}/out{lr}"] = links[f"{NVLINK}/in{lr}"] = caps[NVLINK]
    if SOCKET_H2D in caps:
        links[SOCKET_H2D], links[SOCKET_D2H] = caps[SOCKET_H2D], caps[SOCKET_D2H]
    for g, group in enumerate(profile.switch_groups):
        if any(r < local_ranks for r in group):
            links[f"{UPLINK_H2D}/{g}"] = caps[UPLINK_H2D]
            links[f"{UPLINK_D2H}/{g}"] = caps[UPLINK_D2H]
    return tuple(links.items())


def contended_links(profile: HardwareProfile, links: dict[str, float]
                    ) -> dict[str, tuple[str, float]]:
    """Direction links whose capacity drops while the opposite direction of the same
    link carries a transfer: link -> (opposite link, capacity then, bytes/s), from
    zoplan.pricing.copies.contended_capacities (a GPU's PCIe link, and a switch uplink
    where the profile gives its figures). Never above the capacity alone."""
    return dict(_contended(profile, tuple(links.items())))


@functools.lru_cache(maxsize=256)
def _contended(profile: HardwareProfile, links_items: tuple[tuple[str, float], ...]
               ) -> tuple[tuple[str, tuple[str, float]], ...]:
    links = dict(links_items)
    by_class = contended_capacities(profile)
    out: dict[str, tuple[str, float]] = {}
    for name in links:
        entry = by_class.get(link_class(name))
        if entry is not None:
            other, cap = entry
            out[name] = (f"{other}/{name.split('/', 1)[1]}", min(links[name], cap))
    return tuple(out.items())


def _switch_index(profile: HardwareProfile, local_rank: int) -> int | None:
    for g, group in enumerate(profile.switch_groups):
        if local_rank in group:
            return g
    return None


@functools.lru_cache(maxsize=1024)
def host_route(profile: HardwareProfile, local_rank: int, direction: str) -> tuple[str, ...]:
    """Links a host<->device copy of `local_rank` crosses ("h2d" or "d2h"; cached: the
    same for every layout of a search)."""
    own = PCIE_H2D if direction == "h2d" else PCIE_D2H
    route = [HOST_MEM, f"{own}/{local_rank}", f"{PCIE_DUPLEX}/{local_rank}"]
    g = _switch_index(profile, local_rank)
    if g is not None:
        route.append(f"{UPLINK_H2D if direction == 'h2d' else UPLINK_D2H}/{g}")
    if remote_share(profile):
        route.append(SOCKET_H2D if direction == "h2d" else SOCKET_D2H)
    return tuple(route)


class TransferFlows(TypedDict):
    """transfer_flows': per local rank, the flows of each transfer (StepCosts' fields)."""

    h2d: tuple[tuple[Flow, ...], ...]
    d2h: tuple[tuple[Flow, ...], ...]
    allgather: tuple[tuple[Flow, ...], ...]


def transfer_flows(profile: HardwareProfile, layout: Layout, block: float, *,
                   allgather_cap_Bps: float) -> TransferFlows:
    """Per local rank, the flows of one block's h2d (its slice), d2h (its share) and
    all-gather (each member capped at `allgather_cap_Bps`, the collective table's rate:
    zoplan.pricing.collectives)."""
    lr, s = layout.local_ranks, layout.slices
    h2d = tuple((Flow(num_bytes=block / s, route=host_route(profile, r, "h2d")),)
                for r in range(lr))
    d2h = tuple((Flow(num_bytes=block / lr, route=host_route(profile, r, "d2h")),)
                for r in range(lr))
    return {"h2d": h2d, "d2h": d2h,
            "allgather": tuple(_allgather_flows(profile, r, s, block, allgather_cap_Bps)
                               for r in range(lr))}


def _allgather_flows(profile: HardwareProfile, local_rank: int, slices: int,
                     block: float, cap: float) -> tuple[Flow, ...]:
    """One member's share of a ring all-gather of the block: it sends and receives
    (s-1)/s of the block (NCCL's bus bandwidth convention: time = bytes*(s-1)/s / busbw).
    The collective table caps each member's rate; the fabric decides the links."""
    if slices == 1:
        return ()
    num_bytes = block * (slices - 1) / slices
    kind = profile.fabric_kind
    if kind in ("nvswitch", "bridge"):
        route = (f"{NVLINK}/out{local_rank}", f"{NVLINK}/in{local_rank}")
        return (Flow(num_bytes=num_bytes, route=route, cap_Bps=cap),)
    if kind == "host":  # through host memory: the sender's D2H, then the receiver's H2D
        return (Flow(num_bytes=num_bytes, route=host_route(profile, local_rank, "d2h"),
                     cap_Bps=cap),
                Flow(num_bytes=num_bytes, route=host_route(profile, local_rank, "h2d"),
                     cap_Bps=cap))
    return (Flow(num_bytes=num_bytes, route=(HOST_MEM,), cap_Bps=cap),)  # shm
