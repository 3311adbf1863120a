"""Memory, priced in one home: what a layout needs on each device and each node's host
against the profile's limits, and the baselines' memory as NVML reports it.

- The bytes a zoexec rank allocates are zoplan.memory's (the one model of the executor's
  allocations, which zoexec's pre-flight reads too; checked against the executor in
  tests/unit/test_memory_model.py) and a node's host zoplan.hostmemory's; this module
  adds what the profile's figures price: on CUDA what NVML shows beyond a program's
  allocations (nvml_terms: the context with the libraries a run loads,
  device.context_gib, and the caching allocator's slack, device.allocator_slack_gib;
  docs/sources.md: gpu-check-h200, pytorch-context), so a GPU's figure is what
  nvidia-smi would report. They must fit device.memory_gib - device.reserved_gib per
  device (estimate_memory); per node the host's peak (the block store once, each local
  rank's process and resident master, on CPU profiles every rank's "device" bytes, or the
  builder's set-up peak) must fit host.memory_gib.
- Resident blocks (resident_capacity): what is left of a device once everything else a
  rank needs is counted, less a safety margin of RESIDENT_MARGIN of the device's memory
  (the CUDA-only terms of zoplan.memory are unmeasured: the caching allocator's rounding
  and fragmentation, NCCL's lazily made buffers), holds as many resident shards as fit
  (on CPU profiles the ranks' shards are host memory too, so the host must hold them as
  well, with the same margin).
- `zoplan optimize --max-gpu-memory` plans for less than the profile's device
  (with_device_memory).
- ZO2's and MeZO's device memory as their code allocates it (zo2_memory, mezo_memory;
  their step times are zoplan.pricing.baselines').
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from zoplan.hardware import GIB, HardwareProfile
from zoplan.hostmemory import node_host_memory
from zoplan.layout import Layout
from zoplan.memory import RankMemory, Term, fmt_bytes, rank_memory, resident_shard_bytes
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.pricing.baselines import resident_parts
from zoplan.pricing.figures import or_
from zoplan.workload import Workload

NVML_LABELS = {"cuda_context": "CUDA context and the libraries it loaded (NVML)",
               "allocator_slack": "caching allocator's reserved beyond allocated"}


def nvml_terms(profile: HardwareProfile) -> dict[str, float]:
    """The device bytes NVML shows beyond a program's allocations, by named term."""
    if profile.is_cpu:
        return {}
    device = profile.figures().device
    context = or_(device.context_gib, 0.0)
    slack = or_(device.allocator_slack_gib, 0.0)
    terms = {"cuda_context": context * GIB, "allocator_slack": slack * GIB}
    return {k: v for k, v in terms.items() if v}


def with_device_memory(profile: HardwareProfile, memory_gib: float) -> HardwareProfile:
    """`profile` with each device's memory at most `memory_gib` (zoplan optimize
    --max-gpu-memory: the memory check plans for less than the profile's device; its
    reserved share is still left out). The profile itself when it has no more."""
    if memory_gib >= profile.device_memory_gib:
        return profile
    return profile.with_figures({"device.memory_gib": memory_gib})


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


def _sum(terms: Iterable[Term]) -> float:
    return float(sum(t.bytes for t in terms))


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


def _merge(terms: Iterable[Term]) -> dict[str, float]:
    parts: dict[str, float] = {}
    for term in terms:
        parts[term.key] = parts.get(term.key, 0.0) + float(term.bytes)
    return parts


# ---- memory as NVML reports it ---------------------------------------------------------
# NVML's "used" is everything the process holds on the device: the CUDA context with the
# libraries a run loads (device.context_gib), and every segment torch's caching allocator
# has reserved, which it keeps until the process ends. The allocator keeps a pool per
# stream (a freed block serves later requests on the stream it was made on) and never
# merges segments: a request larger than every free block of its pool takes a segment of
# its own. So a program's reserved memory per stream is its largest phase (the bytes live
# together) plus a segment for each larger single request of another phase, and beyond
# that the slack measured over a real run (device.allocator_slack_gib: reserved minus
# allocated, rounding and stray fragments).
LOSS_COPY_WORDS = 4   # the loss's fp32 copy of one stream's logits and its log-softmax (2 + 2)
EAGER_PEAK_WORDS = 3  # one stream's masked scores (1 word) beside their fp32 softmax (2)


def stream_pool_bytes(phases: Mapping[str, tuple[float, float]]) -> tuple[str, float]:
    """(largest phase, reserved bytes) of one stream's pool from its phases' (live
    bytes, largest single allocation): the largest phase, plus a segment for each larger
    single allocation of another phase."""
    top = max(phases, key=lambda k: phases[k][0])
    live, biggest = phases[top]
    extra = sum(big for name, (_, big) in phases.items() if name != top and big > biggest)
    return top, float(live + extra)


def zo2_memory(model: ModelSpec, profile: HardwareProfile, *, batch: int, seq: int,
               dtype: str = "fp16", untied_head: bool = True) -> dict[str, float]:
    """ZO2's device memory as NVML reports it, by named term: the context, the slack,
    the resident parts (default stream), two blocks (the upload stream's pool: the block
    computing and the one arriving; the one leaving is freed when its copy is enqueued,
    `Module.to` rebinding every parameter to its CPU copy), and the compute stream's
    pool: the two streams' hidden states and 4D masks beside the largest of the update's
    temporaries (four of the largest tensor: z, g z, wd p, their sum), one stream's
    eager block forward, the head's update, and the logits with the loss."""
    w = dtype_bytes(dtype)
    tokens, h, vocab = batch * seq, model.hidden, model.vocab
    resident = sum(resident_parts(model, untied_head=untied_head)) * w
    largest_block = max(model.block_tensor_numels()) * w
    largest_resident = max(resident_parts(model, untied_head=untied_head)) * w
    states = 2 * tokens * h * w + 2 * batch * seq * seq * w
    scores = batch * model.num_heads * seq * seq * w
    ffn = tokens * model.ffn * w
    phases = {
        "block update": (states + 4 * largest_block, largest_block),
        "block forward": (states + max(EAGER_PEAK_WORDS * scores, 2 * ffn),
                          max(2 * scores, ffn)),
        "head update": (states + 4 * largest_resident, largest_resident),
        "head forward": (states + 2 * tokens * vocab * w + tokens * vocab * LOSS_COPY_WORDS * w,
                         tokens * vocab * 2 * w)}
    _, compute = stream_pool_bytes(phases)
    return {**nvml_terms(profile), "resident": float(resident),
            "blocks": 2.0 * model.block_params * w, "compute_stream": compute}


def mezo_memory(model: ModelSpec, profile: HardwareProfile, *, batch: int, seq: int,
                dtype: str = "fp16") -> dict[str, float]:
    """MeZO's device memory as NVML reports it: the context, the slack, every weight,
    and one stream's pool: the update's four temporaries of the largest tensor, one
    eager block forward, or one forward's logits with the loss."""
    w = dtype_bytes(dtype)
    tokens = batch * seq
    weights = (model.num_layers * model.block_params + model.resident_params) * w
    largest = max(model.block_tensor_numels() + model.resident_tensor_numels()) * w
    state = tokens * model.hidden * w + batch * seq * seq * w
    scores = batch * model.num_heads * seq * seq * w
    phases = {"update": (4 * largest, largest),
              "block forward": (state + EAGER_PEAK_WORDS * scores, 2 * scores),
              "head forward": (state + tokens * model.vocab * (1 + LOSS_COPY_WORDS) * w,
                               2 * tokens * model.vocab * w)}
    _, pool = stream_pool_bytes(phases)
    return {**nvml_terms(profile), "weights": float(weights), "compute_stream": pool}
