"""Copies between host and device, and between devices: the capacity of each class of
link a node's copies share (zoplan.sim.links lays the links out and routes the flows;
the simulator shares them max-min fairly), and the lower capacity of a direction while
the opposite direction of the same link runs (duplex).

Link classes are named after the profile figure that sets their capacity:
  host.mem_bw        host memory, the ceiling of all host<->device traffic of a node
  pcie.h2d, pcie.d2h one GPU's (or CPU rank's) host link, per direction, alone
  pcie.duplex        both directions of one rank's link together
  pcie.uplink_*      a PCIe switch's uplink, per direction, shared by its GPUs
  fabric.nvlink      a GPU's NVLink ports, per direction
  host.socket_*      the link between a two-socket host's sockets, per direction
A store that cannot be page-locked (pcie.pinned false) is copied through a ring of
pinned slots (zoexec.runtime.pinning.Staging): the rank's host thread copies each piece
into a slot (h2d) or out of one (d2h) while the DMA runs at the pinned rates
(staging_s).
"""

from __future__ import annotations

from zoplan.hardware import HardwareProfile
from zoplan.pricing.figures import given, or_
from zoplan.pricing.units import GBPS

HOST_MEM = "host.mem_bw"
PCIE_H2D = "pcie.h2d"
PCIE_D2H = "pcie.d2h"
PCIE_DUPLEX = "pcie.duplex"
UPLINK_H2D = "pcie.uplink_h2d"
UPLINK_D2H = "pcie.uplink_d2h"
NVLINK = "fabric.nvlink"
# The link between the sockets of a two-socket host, per direction: the store's pages
# spread over the sockets, so every host<->device flow sends remote_share of its bytes
# across it; its capacity is counted in the flows' bytes (the link's own GB/s /
# remote_share), so fair sharing among those flows stays exact.
SOCKET_H2D = "host.socket_h2d"
SOCKET_D2H = "host.socket_d2h"


def remote_share(profile: HardwareProfile) -> float:
    """Share of the node store's bytes a GPU reads from the other socket(s): the
    store's pages spread over host.sockets sockets (0 without host.socket_link_gbps)."""
    host = profile.figures().host
    if host.socket_link_gbps is None:
        return 0.0
    sockets = given(host.sockets, "host.sockets")
    return (sockets - 1) / sockets


def duplex_gbps(profile: HardwareProfile) -> float:
    """Both directions of one rank's host link together: pcie.duplex_gbps (CPU), or
    on GPUs the two duplex figures' sum, never below one direction alone (it bounds
    any mix of the two directions)."""
    p = profile.figures().pcie
    if profile.is_cpu:
        return given(p.duplex_gbps, "pcie.duplex_gbps")
    return max(given(p.h2d_duplex_gbps, "pcie.h2d_duplex_gbps")
               + given(p.d2h_duplex_gbps, "pcie.d2h_duplex_gbps"), p.h2d_gbps, p.d2h_gbps)


def duplex_rates_gbps(profile: HardwareProfile, link: str) -> tuple[float, float] | None:
    """(H2D, D2H) rates of a GPU's link ("gpu") or a switch uplink ("uplink") while
    both directions run; None where the profile has no such figures (CPU ranks copy
    one way at a time; uplinks without uplink_*_duplex_gbps)."""
    p = profile.figures().pcie
    if profile.is_cpu:
        return None
    if link == "gpu":
        return (given(p.h2d_duplex_gbps, "pcie.h2d_duplex_gbps"),
                given(p.d2h_duplex_gbps, "pcie.d2h_duplex_gbps"))
    if p.uplink_h2d_duplex_gbps is not None:
        return p.uplink_h2d_duplex_gbps, given(p.uplink_d2h_duplex_gbps, "pcie.uplink_d2h_duplex_gbps")
    return None


def link_capacities(profile: HardwareProfile) -> dict[str, float]:
    """Capacity in bytes/s of one link of each class the profile has (alone)."""
    f = profile.figures()
    p = f.pcie
    caps: dict[str, float] = {HOST_MEM: f.host.mem_bw_gbps * GBPS,
                              PCIE_H2D: p.h2d_gbps * GBPS, PCIE_D2H: p.d2h_gbps * GBPS,
                              PCIE_DUPLEX: duplex_gbps(profile) * GBPS,
                              UPLINK_H2D: p.switch_uplink_gbps * GBPS,
                              UPLINK_D2H: p.switch_uplink_gbps * GBPS}
    if f.fabric.kind in ("nvswitch", "bridge"):
        caps[NVLINK] = f.fabric.p2p_gbps * GBPS
    share = remote_share(profile)
    if share:
        caps[SOCKET_H2D] = caps[SOCKET_D2H] = (
            given(f.host.socket_link_gbps, "host.socket_link_gbps") * GBPS / share)
    return caps


def contended_capacities(profile: HardwareProfile) -> dict[str, tuple[str, float]]:
    """Per direction class whose capacity drops while the opposite direction of the
    same link carries a transfer: class -> (opposite class, capacity then, bytes/s). A
    GPU's PCIe link (pcie.h2d_duplex_gbps / d2h_duplex_gbps) and, where the profile
    gives its figures, a switch uplink. Not yet capped by the capacity alone
    (zoplan.sim.links.contended_links does, per link)."""
    out: dict[str, tuple[str, float]] = {}
    for h2d_class, d2h_class, kind in ((PCIE_H2D, PCIE_D2H, "gpu"),
                                       (UPLINK_H2D, UPLINK_D2H, "uplink")):
        rates = duplex_rates_gbps(profile, kind)
        if rates is None:
            continue
        out[h2d_class] = (d2h_class, rates[0] * GBPS)
        out[d2h_class] = (h2d_class, rates[1] * GBPS)
    return out


def staged(profile: HardwareProfile) -> bool:
    """Whether a GPU rank's copies go through pinned staging slots: the profile says
    its host memory is not page-locked (pcie.pinned false; CPU ranks copy themselves)."""
    pinned = or_(profile.figures().pcie.pinned, True)
    return not profile.is_cpu and not pinned


def staging_s(profile: HardwareProfile, num_bytes: float, direction: str) -> float:
    """Host seconds the rank's thread spends copying `num_bytes` between the store and
    the pinned slots for one copy in `direction` ("h2d" or "d2h"), 0 where the store
    is page-locked: a host memcpy into (out of) pinned memory per chunk, as the CUDA
    driver's own pageable copies do, so at their measured rates
    (pcie.pageable_h2d_gbps / pageable_d2h_gbps; docs/sources.md: cuda-sync). The DMA
    itself runs at the pinned rates beside it, chunk by chunk."""
    if not staged(profile):
        return 0.0
    p = profile.figures().pcie
    rate = given(p.pageable_h2d_gbps if direction == "h2d" else p.pageable_d2h_gbps,
                 f"pcie.pageable_{direction}_gbps")
    return num_bytes / (rate * GBPS)


def pageable_gbps(profile: HardwareProfile) -> tuple[float, float]:
    """(H2D, D2H) GB/s of raw copies of pageable host memory (pcie.pageable_h2d_gbps,
    pageable_d2h_gbps); ValueError where the profile lacks them."""
    p = profile.figures().pcie
    if p.pageable_h2d_gbps is None or p.pageable_d2h_gbps is None:
        raise ValueError(f"profile {profile.name} has no pageable copy figures "
                         f"(pcie.pageable_h2d_gbps, pageable_d2h_gbps)")
    return float(p.pageable_h2d_gbps), float(p.pageable_d2h_gbps)


def pageable_copies_s(profile: HardwareProfile, h2d_bytes: float, d2h_bytes: float) -> float:
    """Seconds of raw pageable copies (`tensor.copy_` / `.to()` of memory that is not
    page-locked, what a baseline's code does): the driver stages each through its own
    pinned buffer and the issuing thread waits until an H2D is staged and a D2H is done
    (docs/sources.md: cuda-sync), so the two directions never overlap, with each other
    or with the thread's other work: each at its pageable rate, one after the other,
    all of it host time. The H200 (pass 2, 256 MiB each way queued on two streams from
    one thread) ran both in 59.2 ms, 9.06 GB/s over both; this prices 58.3 ms (9.21)."""
    h2d, d2h = pageable_gbps(profile)
    return h2d_bytes / (h2d * GBPS) + d2h_bytes / (d2h * GBPS)
