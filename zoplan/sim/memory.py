"""Whether a layout fits: zoplan.memory's bytes per GPU and per node's host against
the profile's limits, and why not.

The bytes are zoplan.memory's (the one model of what zoexec allocates, checked against
the executor in tests/unit/test_memory_model.py): per GPU the terms alive at the rank's
peak (rank_memory: held buffers, a step's hidden states, the largest transient of
set-up, update, forward or head, and on CUDA NCCL and cuBLAS), and on CUDA what NVML
shows beyond them (zoplan.pricing.devicemem: the context with its libraries, the
caching allocator's slack), so a GPU's figure is what nvidia-smi would report; they must
fit device.memory_gib - device.reserved_gib. Per node the host's peak (node_host_memory:
the block store once, each local rank's process and resident master, on CPU profiles
every rank's "device" bytes, or the builder's set-up peak); it must fit
host.memory_gib.

Resident blocks (resident_capacity): what is left of a device once everything else a
rank needs is counted, less a safety margin of RESIDENT_MARGIN of the device's memory
(the CUDA-only terms of zoplan.memory are unmeasured: the caching allocator's rounding
and fragmentation, NCCL's lazily made buffers), holds as many resident shards as fit
(on CPU profiles the ranks' shards are host memory too, so the host must hold them as
well, with the same margin).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from zoplan.hardware import GIB, HardwareProfile
from zoplan.hostmemory import node_host_memory
from zoplan.layout import Layout
from zoplan.memory import (
    RankMemory,
    fmt_bytes,
    rank_memory,
    resident_shard_bytes,
)
from zoplan.models import ModelSpec
from zoplan.pricing.devicemem import NVML_LABELS, nvml_terms
from zoplan.workload import Workload

__all__ = ["RESIDENT_MARGIN", "MemoryEstimate", "estimate_memory", "fmt_bytes",
           "resident_capacity"]

RESIDENT_MARGIN = 0.05   # of device.memory_gib (and host.memory_gib on CPU profiles)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    gpu_parts: dict[str, float]      # part -> bytes, per GPU (at the rank's peak)
    host_parts: dict[str, float]     # part -> bytes, per node (at the host's peak)
    labels: dict[str, str]           # part -> how it is made up, for messages
    gpu_limit_bytes: float
    host_limit_bytes: float
    reserved_gib: float
    device_word: str = "GPU"         # "GPU", or "CPU rank" on CPU profiles
    # gpu_bytes, host_bytes and reason are cached: estimate_memory hands the same
    # estimate to every candidate of a layout, and the search asks each several times

    @functools.cached_property
    def gpu_bytes(self) -> float:
        return sum(self.gpu_parts.values())

    @functools.cached_property
    def host_bytes(self) -> float:
        return sum(self.host_parts.values())

    @property
    def fits_gpu(self) -> bool:
        return self.gpu_bytes <= self.gpu_limit_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes <= self.host_limit_bytes

    @property
    def overshoot(self) -> float:
        """Largest ratio of memory needed to memory there (<= 1 when it fits)."""
        return max(self.gpu_bytes / max(self.gpu_limit_bytes, 1.0),
                   self.host_bytes / max(self.host_limit_bytes, 1.0))

    @functools.cached_property
    def reason(self) -> str | None:
        """Why the layout does not fit (None when it does)."""
        if not self.fits_gpu:
            return (f"does not fit {self.device_word} memory: {fmt_bytes(self.gpu_bytes)} needed > "
                    f"{fmt_bytes(self.gpu_limit_bytes)} usable ({self.reserved_gib:g} GiB "
                    f"reserved) ({self._describe(self.gpu_parts)})")
        if not self.fits_host:
            return (f"does not fit host memory: {fmt_bytes(self.host_bytes)} needed per node > "
                    f"{fmt_bytes(self.host_limit_bytes)} ({self._describe(self.host_parts)})")
        return None

    def _describe(self, parts: dict[str, float]) -> str:
        """The parts, largest first, without those too small to read."""
        shown = sorted(((k, b) for k, b in parts.items() if b >= 0.001 * sum(parts.values())),
                       key=lambda kb: -kb[1])
        return ", ".join(f"{self.labels.get(k, k)}: {fmt_bytes(b)}" for k, b in shown)


def estimate_memory(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                    layout: Layout, resident_blocks: int = 0) -> MemoryEstimate:
    """The layout's bytes per device and per node against the profile's limits (cached:
    the search asks again for each candidate's placement and baselines)."""
    return _estimate(model, profile, workload, layout, resident_blocks)


@functools.lru_cache(maxsize=4096)
def _rank(model: ModelSpec, workload: Workload, layout: Layout, device_kind: str,
          resident_blocks: int = 0) -> RankMemory:
    return rank_memory(model=model, workload=workload, layout=layout,
                       device_kind=device_kind, resident_blocks=resident_blocks)


@functools.lru_cache(maxsize=4096)
def _estimate(model: ModelSpec, profile: HardwareProfile, workload: Workload, layout: Layout,
              resident_blocks: int) -> MemoryEstimate:
    kind = profile.device_kind
    rank = _rank(model, workload, layout, kind, resident_blocks)
    host = node_host_memory(model=model, workload=workload, layout=layout, device_kind=kind,
                            resident_blocks=resident_blocks)
    gpu_terms, host_terms = rank.peak_terms(), host.peak_terms()
    labels = {t.key: t.label for t in gpu_terms}
    labels.update({t.key: t.label for t in host_terms})
    labels.update(NVML_LABELS)
    gpu_parts = {**_merge(gpu_terms), **nvml_terms(profile)}   # as NVML reports it
    return MemoryEstimate(gpu_parts=gpu_parts, host_parts=_merge(host_terms),
                          labels=labels,
                          gpu_limit_bytes=profile.device_memory_bytes,
                          host_limit_bytes=profile.host_memory_bytes,
                          reserved_gib=float(profile.reserved_gib),
                          device_word=profile.device_word)


def _sum(terms) -> float:
    return sum(t.bytes for t in terms)


def resident_margin_bytes(profile: HardwareProfile) -> float:
    """The device memory resident blocks leave free (RESIDENT_MARGIN of the device)."""
    return RESIDENT_MARGIN * profile.device_memory_gib * GIB


def resident_capacity(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                      layout: Layout, base: MemoryEstimate | None = None) -> int:
    """How many blocks each rank can keep a shard of (0..blocks) beside everything else
    it needs, leaving the margin free (module docstring). A shard adds its bytes to
    every phase but the set-up's module copies (the shards are made once those are
    gone), so the count is what the steadiest phase leaves over a shard's bytes, if the
    set-up's copies leave the margin too. `base`: the layout's estimate without resident
    blocks, if made already."""
    base = base or estimate_memory(model=model, profile=profile, workload=workload,
                                   layout=layout)
    rank = _rank(model, workload, layout, profile.device_kind)
    shard = resident_shard_bytes(model, workload, layout)
    room = (base.gpu_limit_bytes - resident_margin_bytes(profile) - sum(t.bytes for t in rank.outside)
            - sum(nvml_terms(profile).values()))
    copies = max(_sum(rank.setup), *(rank.phase_bytes(p) for p in rank.phases if p != "setup"))
    if copies > room:
        return 0
    steady = max(rank.phase_bytes(p) for p in rank.phases if p != "setup")
    count = int((room - steady) // shard)
    if profile.is_cpu:   # every local rank's shards are host memory too
        host_free = (base.host_limit_bytes * (1 - RESIDENT_MARGIN) - base.host_bytes)
        count = min(count, int(host_free // (shard * layout.local_ranks)) if host_free > 0 else 0)
    return max(0, min(count, model.num_layers))


def _merge(terms) -> dict[str, float]:
    parts: dict[str, float] = {}
    for term in terms:
        parts[term.key] = parts.get(term.key, 0.0) + float(term.bytes)
    return parts
