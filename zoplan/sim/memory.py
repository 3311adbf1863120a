"""Memory model of a layout: bytes per GPU and per node's host, and why it does not fit.

Per GPU (rank), what zoexec's Trainer allocates: min(prefetch, blocks) block buffers
(stored precision) + the perturbed-weights working block and the z block (compute
precision) + the resident parts (embeddings + final norm + head) three times in compute
precision (clean, perturbed working copy, z) + the activations of one block's forward
over the rank's tokens
(ModelSpec.block_activation_bytes; x2 for role "+-", whose two streams travel side by
side) + the head's activations; it must fit device.memory_gib - device.reserved_gib.
Per node (host): ONE copy of every block (shared by the node's ranks) + a copy of the
resident parts + each local rank's process overhead; on CPU profiles the ranks' "device"
memory is host memory too, so it is added.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoplan.hardware import GIB, HardwareProfile
from zoplan.layout import Layout
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.workload import Workload

# Host memory of one rank process besides the shared block store [D]: a torch process
# with the CUDA runtime, NCCL and pinned staging buffers typically holds ~1-2 GiB of
# resident memory; a CPU-only torch + gloo process ~0.2-0.4 GiB. Assumed, not measured.
HOST_OVERHEAD_GIB_PER_RANK = {"cuda": 1.5, "cpu": 0.3}


def fmt_bytes(num_bytes: float) -> str:
    """GiB with one decimal; MiB / KiB for what would read 0.0 GiB."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= 0.1 * size or unit == "KiB":
            return f"{num_bytes / size:.1f} {unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    gpu_parts: dict[str, float]      # part -> bytes, per GPU
    host_parts: dict[str, float]     # part -> bytes, per node
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
        return ", ".join(f"{self.labels.get(k, k)}: {fmt_bytes(b)}" for k, b in parts.items())


def estimate_memory(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                    layout: Layout) -> MemoryEstimate:
    gpu, labels = gpu_parts(model=model, workload=workload, layout=layout)
    host, host_labels = host_parts(model=model, profile=profile, workload=workload,
                                   layout=layout)
    if profile.is_cpu:
        host["rank_buffers"] = layout.local_ranks * sum(gpu.values())
        host_labels["rank_buffers"] = f"{layout.local_ranks} x rank buffers"
    return MemoryEstimate(gpu_parts=gpu, host_parts=host, labels={**labels, **host_labels},
                          gpu_limit_bytes=profile.device_memory_bytes,
                          host_limit_bytes=profile.host_memory_bytes,
                          reserved_gib=float(profile.device["reserved_gib"]))


def gpu_parts(*, model: ModelSpec, workload: Workload, layout: Layout
              ) -> tuple[dict[str, float], dict[str, str]]:
    tokens = workload.batch // layout.ddp * workload.seq
    streams = 2 if layout.pertp == 1 else 1
    block = model.block_bytes(workload.param_dtype)
    cbytes = dtype_bytes(workload.compute_dtype)
    buffers = max(1, min(layout.prefetch, model.num_layers))
    act = model.block_activation_bytes(tokens, workload.seq, workload.compute_dtype)
    parts = {
        "block_buffers": float(buffers * block),
        "perturbed_scratch": float(2 * model.block_params * cbytes),
        "resident": float(3 * model.resident_params * cbytes),
        "activations": float(streams * act),
        "head_activations": float(model.head_activation_bytes(tokens)),
    }
    labels = {"block_buffers": f"{buffers} x {fmt_bytes(block)} block buffers",
              "perturbed_scratch": "perturbed working block + z block",
              "resident": "resident embeddings + head (clean, perturbed, z)",
              "activations": f"activations ({streams} x {tokens} tokens)",
              "head_activations": "head activations"}
    return parts, labels


def host_parts(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               layout: Layout) -> tuple[dict[str, float], dict[str, str]]:
    per_rank_gib = HOST_OVERHEAD_GIB_PER_RANK[profile.device["kind"]]
    parts = {
        "blocks": float(model.num_layers * model.block_bytes(workload.param_dtype)),
        "resident_copy": float(model.resident_bytes(workload.param_dtype)),
        "rank_processes": float(layout.local_ranks * per_rank_gib * GIB),
    }
    labels = {"blocks": f"{model.num_layers} blocks", "resident_copy": "resident copy",
              "rank_processes": f"{layout.local_ranks} x {per_rank_gib:g} GiB rank processes"}
    return parts, labels
