"""Per-task work of one rank of a LoRA or prefix-tuning step (Workload.tuning "lora",
zoplan.lora, or "prefix", zoplan.prefix), as zoexec.train.lora and zoexec.train.prefix
run it: the base is frozen, so only the adapters (or prefixes) see the zo maths.

  embed    the embedding lookup, once (both perturbations start from the same
           hidden states: the resident parts are not perturbed)
  update   the block's adapters: the deferred update (a z draw and an update pass over
           the adapter elements, fp32 masters) and the next perturbation (a z draw and a
           perturbation pass into the compute-precision working adapters); the base
           block is used where it landed (stored as it computes: no cast, no copy)
  forward  per stream a block forward with the adapters' two extra GEMMs per target
           module (prefix: each query scoring the prefix's keys and weighing its
           values), and the second perturbation's pass over the adapters
  head     final norm + LM head + loss per stream, nothing to rebuild between them
No write-back, no fence and no slice update (zoplan.sim.costs: read_only).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.lora import ADAPTER_BYTES, adapter_flops_per_token, adapter_tensor_numels, linear_shapes
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.prefix import prefix_flops_per_token, prefix_tensor_numels
from zoplan.pricing.compute import EMBED_OPS, HEAD_OPS, forward_times, has_z_model, hbm_time_s
from zoplan.pricing.estimators import cpu_draw_s, gpu_draw
from zoplan.pricing.host import forward_issue_s, launch_s
from zoplan.pricing.zo import cpu_z_time_s, gpu_z_time_s, pass_time_s, z_issue_s, zo_time_s
from zoplan.workload import Workload

LORA_LAUNCHES = 4   # per target module and stream: A x, B (A x), the scaling, the add
PREFIX_LAUNCHES = 4   # per block and stream: the prefix's keys and values expanded to
                      # the batch and joined to the input's (two each)


def tuned_numels(model: ModelSpec, workload: Workload) -> list[int]:
    """Element counts of one block's trained tensors (LoRA's adapters, the prefix)."""
    if workload.is_prefix:
        return prefix_tensor_numels(model, tokens=workload.prefix_tokens)
    return adapter_tensor_numels(model, r=workload.lora_r, targets=workload.lora_targets)


def tuned_flops_per_token(model: ModelSpec, workload: Workload) -> float:
    """A block's forward FLOPs per token beyond the base's (the adapters, the prefix)."""
    if workload.is_prefix:
        return prefix_flops_per_token(model, tokens=workload.prefix_tokens)
    return adapter_flops_per_token(model, r=workload.lora_r, targets=workload.lora_targets)


def _tuned_launches(workload: Workload) -> int:
    return PREFIX_LAUNCHES if workload.is_prefix else len(workload.lora_targets) * LORA_LAUNCHES


def adapter_pass_bytes(compute_bytes: int) -> tuple[int, int]:
    """(update pass, perturb pass) bytes per adapter element on a GPU: fp32 theta and z
    read and theta written; fp32 theta and z read, the working copy written (c)."""
    a = ADAPTER_BYTES
    return 3 * a, 2 * a + compute_bytes


def lora_task_times(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                    tokens: int | float, streams: int, local_ranks: int,
                    here: int = 1) -> dict[str, Any]:
    """embed_s, update_s, forward_s, head_s (and the GPU host's "issue" seconds) of a
    LoRA or prefix step, in task_times' shape ("parts" None: no slice update). With an
    estimator (zoplan.estimators; LoRA only): its d draws over the adapters in place of
    z, and with q directions, q draws and update passes in the deferred update, here - 1
    more draws in the forward (zoplan.pricing.schedules)."""
    hw, wl = profile, workload
    numels = tuned_numels(model, wl)
    fwd, lookups, head_fwd = forward_times(
        model=model, profile=hw, workload=wl, tokens=tokens, streams=1,
        local_ranks=local_ranks, extra_flops_per_token=tuned_flops_per_token(model, wl))
    z, update, perturb = _adapter_zo(hw, numels, dtype_bytes(wl.compute_dtype), local_ranks)
    q = wl.estimator_spec.directions
    if not wl.estimator_spec.is_default:
        z = _adapter_draw(hw, model, wl, local_ranks)
    out: dict[str, Any] = {"embed_s": lookups, "update_s": q * (z + update) + z + perturb,
                           "forward_s": streams * fwd + (streams - 1) * perturb + (here - 1) * z,
                           "head_s": streams * head_fwd, "parts": None, "issue": None}
    if not hw.is_cpu:
        launch = launch_s(hw)
        launches = _tuned_launches(wl) * launch
        out["issue"] = {"embed": forward_issue_s(hw, EMBED_OPS),
                        "update": (q + 1) * z_issue_s(hw, numels) + (q + 1) * launch,
                        "forward": streams * (forward_issue_s(hw) + launches)
                        + (streams - 1) * launch,
                        "head": streams * forward_issue_s(hw, HEAD_OPS)}
    return out


def _adapter_draw(hw: HardwareProfile, model: ModelSpec, wl: Workload, local_ranks: int) -> float:
    """One d draw over a block's adapters (fp32, zoplan.pricing.estimators)."""
    shapes = [s for fan_in, fan_out in (linear_shapes(model)[t] for t in wl.lora_targets)
              for s in ((wl.lora_r, fan_in), (fan_out, wl.lora_r))]
    fp32 = dataclasses.replace(wl, param_dtype="fp32", compute_dtype="fp32")
    if hw.is_cpu:
        return cpu_draw_s(hw, shapes, fp32, local_ranks)
    return gpu_draw(hw, shapes, fp32).device_s


def _adapter_zo(hw: HardwareProfile, numels: list[int], compute_bytes: int,
                local_ranks: int) -> tuple[float, float, float]:
    """(a z draw, an update pass, a perturbation pass) over one block's adapters."""
    total = sum(numels)
    if not hw.is_cpu:
        upd, pert = adapter_pass_bytes(compute_bytes)
        return (gpu_z_time_s(hw, numels, elem_bytes=ADAPTER_BYTES), hbm_time_s(hw, upd * total),
                hbm_time_s(hw, pert * total))
    if has_z_model(hw):
        one = pass_time_s(hw, total, local_ranks)
        return cpu_z_time_s(hw, numels, local_ranks), one, one
    quarter = 0.25 * zo_time_s(hw, total, local_ranks)   # zo_ns_per_param: 2 draws + 2 passes
    return quarter, quarter, quarter
