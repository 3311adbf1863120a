"""A hardware profile's figures, typed: one frozen dataclass per section of the profile's
JSON, each field named as its JSON key with its unit as the suffix (`h2d_gbps`: GB/s,
1e9 bytes/s; `latency_us`: microseconds; `peak_tflops`: 1e12 FLOP/s; `memory_gib`: GiB;
`*_ns*`: nanoseconds; `*_scaling`, `*_fraction`, `*_slowdown`, `*_jitter`, `*_spread`,
`*_penalty`: plain ratios; `m_half_tokens`: GEMM rows; `cores`, `sockets`: counts).
What each figure means is zoplan.hardware's docstring; its checks (kind, range, which
device kind has it) are zoplan.hwcheck's, which builds these from a profile's JSON.

A figure a profile lacks is None (an optional one: zoplan.pricing decides what its
absence costs). The values are kept as the JSON gave them (an int stays an int), so a
profile written back is the file it was read from, byte for byte (`Figures.to_sections`).

Only zoplan.pricing reads these from a profile (zoplan.hardware.HardwareProfile.figures);
any module may name the types.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

Groups = tuple[tuple[int, ...], ...]          # local ranks, one tuple per group
BusbwTable = tuple[tuple[float, float], ...]  # (message bytes, bus GB/s), sizes increasing


@dataclass(frozen=True, kw_only=True)
class Device:
    """One rank's device: a CUDA GPU or, for "cpu", a gloo rank on the host."""

    kind: str                                 # "cuda" or "cpu"
    memory_gib: float
    reserved_gib: float                       # what a rank cannot use, beyond the counted terms
    model: str | None = None
    concurrent_engines: bool | None = None    # None: true
    hbm_gbps: float | None = None             # CUDA
    hbm_fraction: float | None = None         # CUDA: share of hbm_gbps memory-bound kernels reach
    context_gib: float | None = None          # CUDA: the context and its libraries (NVML)
    allocator_slack_gib: float | None = None  # CUDA: the caching allocator's slack
    # CUDA, all four or none: the profile stage's timed zo passes over resident weights,
    # by store (16-bit weights, or fp32 masters; 16-bit z): zoplan.pricing.schedules
    update16_gbps: float | None = None
    perturb16_gbps: float | None = None
    update32_gbps: float | None = None
    perturb32_gbps: float | None = None


@dataclass(frozen=True, kw_only=True)
class Host:
    memory_gib: float
    mem_bw_gbps: float                        # ceiling of all host<->device traffic of a node
    cores: int
    sockets: int | None = None                # CUDA, with socket_link_gbps
    socket_link_gbps: float | None = None
    batch_us: float | None = None             # CUDA: a rank's batch assembled on the host
    disk_write_gbps: float | None = None      # CUDA: a snapshot's write (reported only)


@dataclass(frozen=True, kw_only=True)
class Pcie:
    h2d_gbps: float                           # one rank's host link alone, per direction
    d2h_gbps: float
    switch_uplink_gbps: float                 # one switch uplink, per direction
    pinned: bool | None = None                # None: true
    switch_groups: Groups | None = None       # ranks sharing one switch uplink
    duplex_gbps: float | None = None          # CPU: both directions of one rank together
    h2d_duplex_gbps: float | None = None      # CUDA: each direction while the other runs
    d2h_duplex_gbps: float | None = None
    uplink_h2d_duplex_gbps: float | None = None   # CUDA: the same for a switch uplink
    uplink_d2h_duplex_gbps: float | None = None
    pageable_h2d_gbps: float | None = None    # CUDA: copies of pageable host memory
    pageable_d2h_gbps: float | None = None


@dataclass(frozen=True, kw_only=True)
class Fabric:
    kind: str                                 # "nvswitch", "bridge", "host" or "shm"
    p2p_gbps: float                           # per direction per GPU
    groups: Groups | None = None              # GPUs that reach each other over the fabric


@dataclass(frozen=True, kw_only=True)
class Collective:
    latency_us: float                         # fixed cost of one collective inside a node
    allreduce_small_us: float                 # a scalar all-reduce inside a node
    allgather_busbw: BusbwTable               # (bytes, GB/s): log-interpolated


@dataclass(frozen=True, kw_only=True)
class Network:
    gbps: float                               # inter-node, per node
    latency_us: float


@dataclass(frozen=True, kw_only=True)
class Compute:
    peak_tflops: float                        # GEMMs (fp16 and bf16: one tensor-core rate)
    m_half_tokens: float                      # GEMM rows that reach half the rate
    overhead_us: float                        # host time of one block forward's launches
    rank_scaling: float                       # how k ranks share the host's cores
    tf32_tflops: float | None = None          # CUDA
    fp32_tflops: float | None = None          # CUDA
    z_launch_us: float | None = None          # CUDA: host time of one z chunk's launch
    z_ns_per_elem: float | None = None        # CUDA, and the CPU z model
    launch_us: float | None = None            # CUDA: one launch or event from Python
    overlap_slowdown: float | None = None     # CUDA: an all-gather beside the compute stream
    overlap_gemm_slowdown: float | None = None
    overlap_side_slowdown: float | None = None
    mem_gbps: float | None = None             # CPU: memory-bound work
    zo_ns_per_param: float | None = None      # CPU: update + perturbation per parameter
    zo_rank_scaling: float | None = None      # CPU
    attn_tflops: float | None = None          # CPU (measured): attention apart from GEMMs
    elem_ns: float | None = None              # CPU (measured): per element-wise output
    rope_overhead_us: float | None = None     # CPU (measured): a Llama block beyond an OPT one
    z_call_us: float | None = None            # CPU z model: one draw's call
    z_chunk_us: float | None = None           # CPU z model: one chunk
    zo_pass_ns: float | None = None           # CPU z model: one perturb / update pass
    z_rank_scaling: float | None = None       # CPU
    mem_rank_scaling: float | None = None     # CPU
    rank_jitter: float | None = None          # the slowest of a node's ranks over their mean
    node_spread: float | None = None          # a node's step time spread (one sd over mean)
    slow_node_fraction: float | None = None   # with slow_node_penalty: the heavy tail
    slow_node_penalty: float | None = None


SECTION_TYPES: dict[str, type[Any]] = {
    "device": Device, "host": Host, "pcie": Pcie, "fabric": Fabric,
    "collective": Collective, "network": Network, "compute": Compute}
SECTIONS = tuple(SECTION_TYPES)
_GROUPS = {"pcie.switch_groups", "fabric.groups"}
_TABLES = {"collective.allgather_busbw"}


def field_names(section: str) -> tuple[str, ...]:
    """The keys a profile's `section` may hold, in the dataclass's order."""
    return tuple(f.name for f in fields(SECTION_TYPES[section]))


@dataclass(frozen=True, kw_only=True)
class Figures:
    """Every section of one profile, typed."""

    device: Device
    host: Host
    pcie: Pcie
    fabric: Fabric
    collective: Collective
    network: Network
    compute: Compute

    @classmethod
    def from_sections(cls, sections: dict[str, dict[str, Any]]) -> Figures:
        """From validated JSON sections (zoplan.hwcheck.validate: every key known, every
        value of its kind)."""
        made: dict[str, Any] = {}
        for section, kind in SECTION_TYPES.items():
            block = sections[section]
            made[section] = kind(**{key: _typed(f"{section}.{key}", value)
                                    for key, value in block.items()})
        return cls(**made)

    def to_sections(self) -> dict[str, dict[str, Any]]:
        """The JSON sections again: the figures a profile has, as it gave them."""
        out: dict[str, dict[str, Any]] = {}
        for section in SECTIONS:
            block = getattr(self, section)
            out[section] = {f.name: _plain(getattr(block, f.name)) for f in fields(block)
                            if getattr(block, f.name) is not None}
        return out


def _typed(path: str, value: Any) -> Any:
    if path in _GROUPS:
        return tuple(tuple(group) for group in value)
    if path in _TABLES:
        return tuple((size, bw) for size, bw in value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
