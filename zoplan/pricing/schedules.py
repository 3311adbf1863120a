"""The zo maths of each task of one rank's step, per schedule, summed from the
primitives of zoplan.pricing.zo.

schedule "zoexec" (docs/execution.md): the update task draws z twice per block (the
deferred update of step t-1 and the perturbation of step t) with a pass each; the
second perturbation stream's pass sits in the forward task; the resident parts'
update, z and one perturbation pass per stream in the embed task. "parts" splits the
update for the slice update: "deferred"(z draw sizes, tensor pieces, rounding noise
draw sizes) prices the deferred update of a slice, "perturb" the perturbation alone.
schedule "zo2": four z draws and four in-place passes per block and step (perturb
+eps, -2eps, restore, update; zoexec.reference), no parts.
Each function returns {"embed", "update", "forward", "head"} in device seconds (GPU:
also "issue", the host seconds of each task's zo maths), and "parts" where it splits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.pricing.compute import has_z_model
from zoplan.pricing.work import NO_WORK, Work
from zoplan.pricing.zo import (
    SR_BYTES,
    cpu_rounding_s,
    cpu_z_time_s,
    gpu_update,
    hbm_pass,
    pass_time_s,
    rounding_noise,
    z_draw,
    zo_pass_bytes,
    zo_time_s,
)
from zoplan.workload import Workload

SCHEDULES = ("zoexec", "zo2")   # z twice per block and step, or ZO2's four times
ZoMaths = dict[str, Any]


def cpu_per_param(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                  local_ranks: int, streams: int, schedule: str) -> ZoMaths:
    """CPU profiles without the z model: compute.zo_ns_per_param prices the update
    task's 2 draws + 2 passes; ZO2's 4 + 4 cost twice that; the stochastic update's noise
    draw and rounding passes are taken to cost as much as the task again (a rough
    figure: a measured profile's z model prices them)."""
    del streams
    factor = 2.0 if schedule == "zo2" else 1.0
    stochastic = 1.0 if workload.update == "stochastic" else 0.0
    factor += stochastic

    def deferred(_z_numels: list[int], pieces: list[int], _noise: list[int]) -> float:
        # half the task (a draw and a pass) and the rounding's share, on the slice
        return (0.5 + stochastic) * zo_time_s(profile, sum(pieces), local_ranks)
    parts = None if schedule == "zo2" else {
        "deferred": deferred,
        "perturb": 0.5 * zo_time_s(profile, model.block_params, local_ranks)}
    return {"embed": factor * zo_time_s(profile, model.embed_params, local_ranks),
            "update": factor * zo_time_s(profile, model.block_params, local_ranks),
            "forward": 0.0,
            "head": factor * zo_time_s(profile, model.head_params, local_ranks),
            "parts": parts}


def cpu_z_model(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                local_ranks: int, streams: int, schedule: str) -> ZoMaths:
    """CPU profiles with the z model: z draws and passes as measured (zoexec's schedule:
    2 draws + 2 passes per block, the second stream's perturbation in the forward). The
    stochastic update replaces the update pass by its noise and rounding
    (zoplan.pricing.zo.cpu_rounding_s)."""
    hw, lr = profile, local_ranks
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()
    z_block, z_res = cpu_z_time_s(hw, block, lr), cpu_z_time_s(hw, resident, lr)
    pass_block = pass_time_s(hw, model.block_params, lr)
    pass_res = pass_time_s(hw, model.resident_params, lr)
    upd_block, upd_res = pass_block, pass_res
    stochastic = workload.update == "stochastic"
    if stochastic:
        upd_block = cpu_rounding_s(hw, block, pass_block)
        upd_res = cpu_rounding_s(hw, resident, pass_res)

    def deferred(z_numels: list[int], pieces: list[int], noise: list[int]) -> float:
        """A slice's deferred update: z and the rounding's noise for every chunk it
        touches, the passes over its elements."""
        one_pass = pass_time_s(hw, sum(pieces), lr)
        upd = cpu_rounding_s(hw, noise, one_pass) if stochastic else one_pass
        return cpu_z_time_s(hw, z_numels, lr) + upd
    parts = {"deferred": deferred, "perturb": z_block + pass_block}
    if schedule == "zo2":
        return {"embed": 4 * z_res + upd_res + 3 * pass_res,
                "update": 4 * z_block + upd_block + 3 * pass_block,
                "forward": 0.0, "head": 0.0}
    if not stochastic:   # as before the update modes (same floats)
        return {"embed": 2 * z_res + (1 + streams) * pass_res,
                "update": 2 * (z_block + pass_block),
                "forward": (streams - 1) * pass_block, "head": (streams - 1) * pass_res,
                "parts": parts}
    return {"embed": 2 * z_res + upd_res + streams * pass_res,
            "update": 2 * z_block + upd_block + pass_block,
            "forward": (streams - 1) * pass_block, "head": (streams - 1) * pass_res,
            "parts": parts}


def gpu(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
        local_ranks: int, streams: int, schedule: str) -> ZoMaths:
    """GPU: each term a Work (device seconds, host seconds to issue it), from
    zoplan.pricing.zo's z_draw, hbm_pass, gpu_update and rounding_noise. "issue" holds
    the host seconds of each task's zo maths."""
    del local_ranks
    hw, c = profile, dtype_bytes(workload.compute_dtype)
    upd, pert = zo_pass_bytes(param_bytes=dtype_bytes(workload.param_dtype), compute_bytes=c)
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()

    def update(numels: list[int]) -> Work:
        return gpu_update(hw, numels, update=workload.update, update_bytes=upd)

    def deferred(z_numels: list[int], pieces: list[int], draws: list[int]) -> Work:
        """A slice's deferred update: z of every chunk it touches (drawn whole); the
        stochastic update's noise of every rounding chunk it touches (whole), its passes
        over the slice's elements."""
        if workload.update != "stochastic":
            return z_draw(hw, z_numels, c) + update(pieces)
        return (z_draw(hw, z_numels, c) + rounding_noise(hw, len(draws), sum(draws))
                + hbm_pass(hw, SR_BYTES * sum(pieces), 0))
    z_block, z_res = z_draw(hw, block, c), z_draw(hw, resident, c)
    pert_block = hbm_pass(hw, pert * model.block_params)
    parts = {"deferred": deferred, "perturb": z_block + pert_block}
    if schedule == "zo2":   # in place: perturb, -2 eps, restore; a cast per stream
        p = dtype_bytes(workload.param_dtype)
        extra = 3 * (2 * p + c) + (streams * (p + c) if p != c else 0)
        work = {"embed": z_res * 4 + update(resident) + hbm_pass(hw, extra * model.resident_params, 3),
                "update": z_block * 4 + update(block) + hbm_pass(hw, extra * model.block_params, 3),
                "forward": NO_WORK, "head": NO_WORK}
    else:
        work = {"embed": z_res * 2 + update(resident)
                + hbm_pass(hw, streams * pert * model.resident_params, streams),
                "update": z_block * 2 + update(block) + pert_block,
                "forward": pert_block * (streams - 1),
                "head": hbm_pass(hw, pert * model.resident_params) * (streams - 1)}
    out: ZoMaths = {kind: w.device_s for kind, w in work.items()}
    out["issue"] = {kind: w.host_s for kind, w in work.items()}
    if schedule != "zo2":
        out["parts"] = parts
    return out


def zo_maths_of(profile: HardwareProfile) -> Callable[..., ZoMaths]:
    """The function that prices the zo maths on this profile."""
    if not profile.is_cpu:
        return gpu
    return cpu_z_model if has_z_model(profile) else cpu_per_param
