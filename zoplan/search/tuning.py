"""`zoplan optimize --tuning auto`: the best full-parameter plan and the best LoRA plan
of one request, side by side, and the figures that tell them apart (docs/lora.md):
the predicted step, the PCIe traffic of a step and the size of a snapshot.

The plan written is the faster of the two; both are returned for the view.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoplan.lora import ADAPTER_BYTES, adapter_params
from zoplan.models import dtype_bytes
from zoplan.names import TUNING_CHOICES as TUNING_CHOICES
from zoplan.plan import Plan
from zoplan.prefix import PREFIX_BYTES, prefix_params


@dataclass(frozen=True, kw_only=True)
class TuningRow:
    """One plan's figures for the comparison."""

    tuning: str
    label: str
    step_time_s: float
    h2d_bytes: float          # per node and step
    d2h_bytes: float          # per node and step
    snapshot_bytes: float     # what a snapshot (and final/) holds
    gpu_mem_bytes: float
    host_mem_bytes: float
    resident_blocks: int

    @property
    def pcie_bytes(self) -> float:
        return self.h2d_bytes + self.d2h_bytes


def pcie_bytes_per_step(plan: Plan) -> tuple[float, float]:
    """(h2d, d2h) bytes one node moves over PCIe in a step: each offloaded block is
    uploaded once per slice group (every rank its 1/slices) and, full tuning, written
    back once (every local rank its 1/local_ranks); LoRA and prefix tuning write
    nothing back."""
    lay, wl = plan.layout, plan.workload
    offloaded = plan.model.num_layers - len(plan.resident_blocks)
    block = plan.model.block_bytes(wl.param_dtype)
    h2d = offloaded * block * lay.local_ranks / lay.slices
    return h2d, 0.0 if wl.frozen_base else offloaded * block


def snapshot_bytes(plan: Plan) -> float:
    """Bytes of a snapshot's weights: the whole model in the stored precision (full),
    the adapters (LoRA) or the prefixes in fp32."""
    model, wl = plan.model, plan.workload
    if wl.is_prefix:
        return model.num_layers * prefix_params(model, tokens=wl.prefix_tokens) * PREFIX_BYTES
    if wl.is_lora:
        return model.num_layers * adapter_params(
            model, r=wl.lora_r, targets=wl.lora_targets) * ADAPTER_BYTES
    return model.total_params * dtype_bytes(wl.param_dtype)


def tuning_row(plan: Plan) -> TuningRow:
    h2d, d2h = pcie_bytes_per_step(plan)
    pred = plan.predicted
    return TuningRow(tuning=plan.workload.tuning, label=plan.layout.label(),
                     step_time_s=plan.step_time_s, h2d_bytes=h2d, d2h_bytes=d2h,
                     snapshot_bytes=snapshot_bytes(plan),
                     gpu_mem_bytes=float(pred["gpu_mem_bytes"]),
                     host_mem_bytes=float(pred["host_mem_bytes"]),
                     resident_blocks=len(plan.resident_blocks))


def faster(plans: dict[str, Plan]) -> str:
    """The tuning whose plan's step is the shortest (full on a tie)."""
    return min(plans, key=lambda t: (plans[t].step_time_s, t != "full"))
