"""A profile from a spec sheet (`zoplan spec`): a handful of public figures (the GPU
model, how many, PCIe generation and lanes, how the GPUs share switch uplinks, NVLink or
not, host memory and sockets) and, for every other figure, a rule, marked assumed in the
profile's `origins` map (zoplan.origins) with the rule that set it. The GPU models'
public figures are GPUS, each with its datasheet (docs/sources.md); the rules are RULES'
words, and docs/planner.md says why each.

Such a profile answers "what should I rent?" before the machine exists; `zoplan profile`
on the machine replaces every assumed figure with a measured one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile


@dataclass(frozen=True, kw_only=True)
class GpuModel:
    """One GPU model's public figures: memory (GB as sold), HBM or GDDR bandwidth, the
    dense 16-bit tensor rate, TF32 and fp32 rates, its PCIe generation, NVLink each way
    (0: none) and whether its NVLink is a switch (SXM) or a bridge of pairs (PCIe cards)."""

    name: str
    memory_gb: float
    mem_gbps: float
    bf16_tflops: float
    tf32_tflops: float
    fp32_tflops: float
    pcie_gen: int
    nvlink_gbps: float
    nvlink: str          # "switch", "bridge" or "none"
    source: str          # docs/sources.md key


GPUS = {g.name: g for g in (
    GpuModel(name="h100-sxm", memory_gb=80, mem_gbps=3350, bf16_tflops=989, tf32_tflops=494.5,
             fp32_tflops=67, pcie_gen=5, nvlink_gbps=450, nvlink="switch", source="h100-ds"),
    GpuModel(name="h100-pcie", memory_gb=80, mem_gbps=2000, bf16_tflops=756, tf32_tflops=378,
             fp32_tflops=51, pcie_gen=5, nvlink_gbps=300, nvlink="bridge", source="h100-ds"),
    GpuModel(name="h200", memory_gb=141, mem_gbps=4800, bf16_tflops=989, tf32_tflops=494.5,
             fp32_tflops=67, pcie_gen=5, nvlink_gbps=450, nvlink="switch", source="h100-ds"),
    GpuModel(name="a100-sxm-80", memory_gb=80, mem_gbps=2039, bf16_tflops=312, tf32_tflops=156,
             fp32_tflops=19.5, pcie_gen=4, nvlink_gbps=300, nvlink="switch", source="a100-ds"),
    GpuModel(name="a100-sxm-40", memory_gb=40, mem_gbps=1555, bf16_tflops=312, tf32_tflops=156,
             fp32_tflops=19.5, pcie_gen=4, nvlink_gbps=300, nvlink="switch", source="a100-ds"),
    GpuModel(name="a100-pcie-80", memory_gb=80, mem_gbps=1935, bf16_tflops=312, tf32_tflops=156,
             fp32_tflops=19.5, pcie_gen=4, nvlink_gbps=300, nvlink="bridge", source="a100-ds"),
    GpuModel(name="a100-pcie-40", memory_gb=40, mem_gbps=1555, bf16_tflops=312, tf32_tflops=156,
             fp32_tflops=19.5, pcie_gen=4, nvlink_gbps=300, nvlink="bridge", source="a100-ds"),
    GpuModel(name="l40s", memory_gb=48, mem_gbps=864, bf16_tflops=362, tf32_tflops=183,
             fp32_tflops=91.6, pcie_gen=4, nvlink_gbps=0, nvlink="none", source="l40s-ds"),
    GpuModel(name="rtx4090", memory_gb=24, mem_gbps=1008, bf16_tflops=165.2, tf32_tflops=82.6,
             fp32_tflops=82.6, pcie_gen=4, nvlink_gbps=0, nvlink="none", source="ada-wp"),
)}
GIB_PER_GB = 1e9 / 2**30
LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938}   # PCIe raw rate per lane and direction, GB/s
# Each rule: (value or function of the inputs, the words of the rule). Values are those
# of the shipped profiles where a public figure backs them (docs/sources.md).
RULES: dict[str, tuple[Any, str]] = {
    "peak": (0.83, "the best matmul found reaches 80-86% of the datasheet's dense 16-bit "
                   "rate (A100 SXM 267.9 of 312, H100 SXM 792 of 989: docs/sources.md mamf)"),
    "pcie": (0.80, "pinned copies reach ~80% of the link's raw rate (25-26 of 31.5 GB/s on "
                   "Gen4 x16, 52-56 of 63 on Gen5: nvbw-11, azure-h200, cuda-samples-357)"),
    "duplex_h2d": ({3: 0.5, 4: 0.5, 5: 0.93}, "H2D beside D2H: about half on Gen4 hosts "
                   "(nvbw-11, nvbw-53), 93% on Gen5 (cuda-samples-357)"),
    "duplex_d2h": (0.95, "D2H keeps ~95% beside H2D (nvbw-11, cuda-samples-357)"),
    "nvlink": (0.82, "NVLink peer copies reach 82-84% of the spec each way (nccl-1264)"),
    "host_peer": (0.7, "no NVLink: peer traffic crosses PCIe and host memory at ~70% of "
                       "one GPU's copy rate (nccl-1264: 36-38 of 53 GB/s)"),
    "busbw": ((0.14, 0.43, 0.84, 1.0), "the all-gather's bus bandwidth rises with the "
              "message as the A100's measured table does (36, 109, 214, 254 GB/s at 1 MB, "
              "16 MB, 256 MB, 4 GB: azure-a100), scaled to this fabric's peer rate"),
    "mem_bw": (100.0, "host memory ~100 GB/s per socket (STREAM 207 on two EPYC 7742 "
                      "sockets: stream-7742)"),
    "socket_link": (64.0, "two or more xGMI/UPI links between sockets, ~64 GB/s (xgmi-upi)"),
}
DEFAULTS = {   # the rest, as the shipped A100 and H100 profiles assume them
    "device.reserved_gib": 1.65, "device.context_gib": 0.7, "device.allocator_slack_gib": 0.65,
    "device.hbm_fraction": 0.85, "host.batch_us": 500, "host.disk_write_gbps": 4,
    "collective.latency_us": 15, "collective.allreduce_small_us": 15, "network.gbps": 25,
    "network.latency_us": 25, "compute.m_half_tokens": 256, "compute.overhead_us": 100,
    "compute.rank_scaling": 1.0, "compute.z_launch_us": 10, "compute.z_ns_per_elem": 0.0038,
    "compute.node_spread": 0.02, "compute.launch_us": 10, "compute.overlap_slowdown": 0.13,
    "compute.rank_jitter": 0.02, "compute.slow_node_fraction": 0.02,
    "compute.slow_node_penalty": 0.08,
}
DEFAULT_RULE = "as the shipped A100 and H100 profiles assume it (docs/sources.md: assumed)"


@dataclass(frozen=True, kw_only=True)
class SpecSheet:
    """What a user reads off a spec sheet (zoplan spec's options)."""

    gpu: str
    count: int
    host_memory_gb: float
    sockets: int = 2
    cores: int = 64
    pcie_gen: int | None = None      # default: the GPU model's
    lanes: int = 16
    per_switch: int = 1               # GPUs sharing one switch uplink (1: each its own)
    nvlink: bool | None = None        # default: the GPU model's (SXM switch, PCIe bridge)
    memory_gib: float | None = None   # default: the GPU model's
    name: str | None = None


def check(sheet: SpecSheet) -> GpuModel:
    """The sheet's GPU model; a ZoError naming the first bad figure."""
    gpu = GPUS.get(sheet.gpu)
    if gpu is None:
        raise ZoError(f"unknown GPU model {sheet.gpu!r}: one of {', '.join(GPUS)}")
    if not 1 <= sheet.count <= 1024:
        raise ZoError(f"--count {sheet.count}: 1..1024 GPUs a node")
    if (sheet.pcie_gen or gpu.pcie_gen) not in LANE_GBPS:
        raise ZoError(f"--pcie-gen {sheet.pcie_gen}: one of {', '.join(map(str, LANE_GBPS))}")
    if sheet.lanes not in (1, 2, 4, 8, 16):
        raise ZoError(f"--lanes {sheet.lanes}: one of 1, 2, 4, 8, 16")
    if sheet.per_switch < 1 or sheet.count % sheet.per_switch:
        raise ZoError(f"--per-switch {sheet.per_switch} does not divide --count {sheet.count}")
    if sheet.host_memory_gb <= 0 or sheet.sockets < 1 or sheet.cores < 1:
        raise ZoError("--host-memory-gb, --sockets and --cores must be positive")
    if sheet.nvlink and gpu.nvlink == "none":
        raise ZoError(f"--nvlink: a {gpu.name} has no NVLink")
    return gpu


class _Writer:
    """Figures with their notes and origins, as a profile keeps them."""

    def __init__(self) -> None:
        self.sections: dict[str, dict[str, Any]] = {s: {} for s in (
            "device", "host", "pcie", "fabric", "collective", "network", "compute")}
        self.sources: dict[str, str] = {}
        self.origins: dict[str, dict[str, str]] = {}

    def put(self, path: str, value: Any, *, kind: str, by: str) -> None:
        section, key = path.split(".")
        self.sections[section][key] = value
        self.origins[path] = {"kind": kind, "by": by}
        tag = "[S]" if kind == "public" else "[D] assumed:"
        self.sources[path] = f"{tag} {by}" + ("" if "docs/sources.md" in by else
                                               " (docs/sources.md: assumed)"
                                               if kind == "assumed" else "")


def build_spec_profile(sheet: SpecSheet) -> dict[str, Any]:
    """The profile's JSON data (validated) of a spec sheet."""
    gpu = check(sheet)
    gen = sheet.pcie_gen or gpu.pcie_gen
    nvlink = (gpu.nvlink != "none") if sheet.nvlink is None else sheet.nvlink
    w = _Writer()
    w.sections["device"].update(kind="cuda", model=gpu.name, concurrent_engines=True)
    table = f"{gpu.name}'s datasheet (docs/sources.md: {gpu.source})"
    given = "given (a spec sheet's figure)"
    w.put("device.memory_gib", round(sheet.memory_gib or gpu.memory_gb * GIB_PER_GB, 2),
          kind="public", by=given if sheet.memory_gib else table)
    w.put("device.hbm_gbps", gpu.mem_gbps, kind="public", by=table)
    for key in ("reserved_gib", "context_gib", "allocator_slack_gib", "hbm_fraction"):
        w.put(f"device.{key}", DEFAULTS[f"device.{key}"], kind="assumed", by=DEFAULT_RULE)
    peak, why = RULES["peak"]
    w.put("compute.peak_tflops", round(gpu.bf16_tflops * peak, 1), kind="assumed",
          by=f"{peak:g} x the datasheet's {gpu.bf16_tflops:g}: {why}")
    w.put("compute.tf32_tflops", round(gpu.tf32_tflops * peak, 1), kind="assumed",
          by=f"{peak:g} x the datasheet's {gpu.tf32_tflops:g} (as peak_tflops)")
    w.put("compute.fp32_tflops", round(gpu.fp32_tflops * peak, 2), kind="assumed",
          by=f"{peak:g} x the datasheet's {gpu.fp32_tflops:g} (as peak_tflops)")
    for path, value in DEFAULTS.items():
        if path.startswith(("compute.", "collective.", "network.")):
            w.put(path, value, kind="assumed", by=DEFAULT_RULE)
    _host(w, sheet, given)
    _pcie(w, sheet, gen)
    _fabric(w, sheet, gpu, nvlink, gen)
    name = sheet.name or f"spec-{sheet.count}x-{gpu.name}" + ("" if nvlink or gpu.nvlink == "none"
                                                            else "-no-nvlink")
    data = {"schema_version": 1, "name": name, "gpus_per_node": sheet.count,
            "description": (f"{sheet.count}x {gpu.name} from its spec sheet (zoplan spec): "
                            f"PCIe Gen{gen} x{sheet.lanes}, {sheet.per_switch} GPU(s) per "
                            f"switch uplink, {'NVLink' if nvlink else 'no NVLink'}, "
                            f"{sheet.host_memory_gb:g} GB host memory, {sheet.sockets} sockets"),
            **w.sections, "sources": w.sources, "origins": w.origins,
            "notes": "Written by `zoplan spec` from public figures; every other figure is "
                     "assumed by the rule its origin names. `zoplan profile` on the machine "
                     "measures them."}
    HardwareProfile.from_dict(data, origin=f"spec profile {name}")
    return data


def _host(w: _Writer, sheet: SpecSheet, given: str) -> None:
    w.put("host.memory_gib", round(sheet.host_memory_gb * GIB_PER_GB, 1), kind="public", by=given)
    w.put("host.cores", sheet.cores * sheet.sockets, kind="public", by=given)
    w.put("host.sockets", sheet.sockets, kind="public", by=given)
    per_socket, why = RULES["mem_bw"]
    w.put("host.mem_bw_gbps", per_socket * sheet.sockets, kind="assumed", by=why)
    link, why = RULES["socket_link"]
    w.put("host.socket_link_gbps", link, kind="assumed", by=why)
    for key in ("batch_us", "disk_write_gbps"):
        w.put(f"host.{key}", DEFAULTS[f"host.{key}"], kind="assumed", by=DEFAULT_RULE)


def _pcie(w: _Writer, sheet: SpecSheet, gen: int) -> None:
    share, why = RULES["pcie"]
    rate = round(LANE_GBPS[gen] * sheet.lanes * share, 1)
    raw = f"Gen{gen} x{sheet.lanes}: {LANE_GBPS[gen] * sheet.lanes:.1f} GB/s raw each way"
    for key in ("h2d_gbps", "d2h_gbps"):
        w.put(f"pcie.{key}", rate, kind="assumed", by=f"{share:g} x {raw}: {why}")
    up_share, up_why = RULES["duplex_h2d"]
    down, down_why = RULES["duplex_d2h"]
    w.put("pcie.h2d_duplex_gbps", round(rate * up_share[gen], 1), kind="assumed", by=up_why)
    w.put("pcie.d2h_duplex_gbps", round(rate * down, 1), kind="assumed", by=down_why)
    w.sections["pcie"]["pinned"] = True
    groups = [list(range(i, i + sheet.per_switch)) for i in range(0, sheet.count, sheet.per_switch)]
    w.sections["pcie"]["switch_groups"] = groups
    w.put("pcie.switch_uplink_gbps", rate, kind="assumed",
          by=f"a switch's uplink is one x{sheet.lanes} link like a GPU's")
    if sheet.per_switch > 1:
        w.put("pcie.uplink_h2d_duplex_gbps", round(rate * up_share[gen], 1), kind="assumed",
              by="an uplink splits both ways as a GPU's link does: " + up_why)
        w.put("pcie.uplink_d2h_duplex_gbps", round(rate * down, 1), kind="assumed", by=down_why)


def _fabric(w: _Writer, sheet: SpecSheet, gpu: GpuModel, nvlink: bool, gen: int) -> None:
    if nvlink:
        share, why = RULES["nvlink"]
        peer = round(gpu.nvlink_gbps * share, 1)
        w.put("fabric.p2p_gbps", peer, kind="assumed",
              by=f"{share:g} x {gpu.nvlink_gbps:g} GB/s each way ({gpu.source}): {why}")
        if gpu.nvlink == "switch":
            w.sections["fabric"].update(kind="nvswitch", groups=[list(range(sheet.count))])
        else:
            pairs = [[i, i + 1] for i in range(0, sheet.count - 1, 2)]
            pairs += [[sheet.count - 1]] if sheet.count % 2 else []
            w.sections["fabric"].update(kind="bridge", groups=pairs)
    else:
        share, why = RULES["host_peer"]
        peer = round(w.sections["pcie"]["h2d_gbps"] * share, 1)
        w.put("fabric.p2p_gbps", peer, kind="assumed", by=why)
        w.sections["fabric"]["kind"] = "host"
    shape, why = RULES["busbw"]
    sizes = (2**20, 2**24, 2**28, 2**32)
    w.put("collective.allgather_busbw", [[s, round(peer * f, 1)] for s, f in zip(sizes, shape)],
          kind="assumed", by=why)


def spec_name_ok(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9._-]+", name))
