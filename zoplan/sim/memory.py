"""Whether a layout fits: zoplan.memory's bytes per GPU and per node's host against
the profile's limits, and why not.

The bytes are zoplan.memory's (the one model of what zoexec allocates, checked against
the executor in tests/unit/test_memory_model.py): per GPU the terms alive at the rank's
peak (rank_memory: held buffers, a step's hidden states, the largest transient of
set-up, update, forward or head, and on CUDA NCCL and cuBLAS); they must fit
device.memory_gib - device.reserved_gib. Per node the host's peak (node_host_memory:
the block store once, each local rank's process and resident master, on CPU profiles
every rank's "device" bytes, or the builder's set-up peak); it must fit
host.memory_gib.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoplan.hardware import HardwareProfile
from zoplan.layout import Layout
from zoplan.memory import fmt_bytes, node_host_memory, rank_memory
from zoplan.models import ModelSpec
from zoplan.workload import Workload

__all__ = ["MemoryEstimate", "estimate_memory", "fmt_bytes"]


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    gpu_parts: dict[str, float]      # part -> bytes, per GPU (at the rank's peak)
    host_parts: dict[str, float]     # part -> bytes, per node (at the host's peak)
    labels: dict[str, str]           # part -> how it is made up, for messages
    gpu_limit_bytes: float
    host_limit_bytes: float
    reserved_gib: float

    @property
    def gpu_bytes(self) -> float:
        return sum(self.gpu_parts.values())

    @property
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

    @property
    def reason(self) -> str | None:
        """Why the layout does not fit (None when it does)."""
        if not self.fits_gpu:
            return (f"does not fit GPU memory: {fmt_bytes(self.gpu_bytes)} needed > "
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
                    layout: Layout) -> MemoryEstimate:
    kind = profile.device["kind"]
    rank = rank_memory(model=model, workload=workload, layout=layout, device_kind=kind)
    host = node_host_memory(model=model, workload=workload, layout=layout, device_kind=kind)
    gpu_terms, host_terms = rank.peak_terms(), host.peak_terms()
    labels = {t.key: t.label for t in gpu_terms}
    labels.update({t.key: t.label for t in host_terms})
    return MemoryEstimate(gpu_parts=_merge(gpu_terms), host_parts=_merge(host_terms),
                          labels=labels,
                          gpu_limit_bytes=profile.device_memory_bytes,
                          host_limit_bytes=profile.host_memory_bytes,
                          reserved_gib=float(profile.device["reserved_gib"]))


def _merge(terms) -> dict[str, float]:
    parts: dict[str, float] = {}
    for term in terms:
        parts[term.key] = parts.get(term.key, 0.0) + float(term.bytes)
    return parts
