"""Device memory as NVML reports it, beyond what a program allocates: the CUDA context
with the libraries a run loads (device.context_gib) and the slack torch's caching
allocator holds over what it has allocated (device.allocator_slack_gib). NVML's "used"
counts both; torch's allocator statistics count neither (docs/sources.md:
gpu-check-h200, pytorch-context). Zero where a profile has no such figure (CPU ranks:
their memory is the host's)."""

from __future__ import annotations

from zoplan.hardware import HardwareProfile
from zoplan.pricing.figures import or_
from zoplan.pricing.units import GIB

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
