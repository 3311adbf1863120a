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

GPU, the resident parts' passes (the embed task's update and perturbations, the head
task's perturbation): each at the rate the profile stage measured for that pass and
store where the profile has it (device.update16_gbps, perturb16_gbps, update32_gbps,
perturb32_gbps: zoexec's apply_update and perturb_into over 2**26 values, a 16-bit or an
fp32 store, 16-bit z; resident_pass below), else at device.hbm_gbps (the median of those
four). The stochastic update of a 16-bit store at update16_gbps (its SR_BYTES +
NOISE_BYTES: the H200's stage timed apply_update_stochastic over 4 x 2**24 values at
1.238 ms, which this prices at 1.223). The blocks' passes stay at hbm_gbps: on the
H200's pass 2 the stage's fp32 rates price the resident block update 0.819 ms against
0.690 measured, while the embed and head spans of its two runs, which differ in the
store alone, differ as these rates say (docs/costs.md, "The H200's pass 2 re-predicted").
Estimators (zoplan.estimators; not MeZO-SGD with one direction): a d draw
(zoplan.pricing.estimators) in place of each z draw, and with q directions a step
(`here` of them meet the rank's rows, one stream a sign each): the deferred update
draws and applies each of the q directions (q draws, q update passes), the update
task draws the first direction of the rank, the forward and head tasks the other
here - 1 (a d draw each when the direction changes), every stream its perturbation pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.pricing.compute import has_z_model
from zoplan.pricing.estimators import cpu_draw_s, draw_share, gpu_draw
from zoplan.pricing.host import launch_s
from zoplan.pricing.units import GBPS
from zoplan.pricing.work import NO_WORK, Work
from zoplan.pricing.zo import (
    NOISE_BYTES,
    SR_BYTES,
    cpu_rounding_s,
    cpu_z_time_s,
    fused_perturb,
    fused_update,
    gpu_update,
    hbm_pass,
    pass_time_s,
    rounding_noise,
    sr_chunks,
    z_draw,
    zo_pass_bytes,
    zo_time_s,
)
from zoplan.workload import Workload

SCHEDULES = ("zoexec", "zo2")   # z twice per block and step, or ZO2's four times
ZoMaths = dict[str, Any]


def cpu_per_param(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                  local_ranks: int, streams: int, schedule: str, here: int = 1) -> ZoMaths:
    """CPU profiles without the z model: compute.zo_ns_per_param prices the update
    task's 2 draws + 2 passes; ZO2's 4 + 4 cost twice that; the stochastic update's noise
    draw and rounding passes are taken to cost as much as the task again (a rough
    figure: a measured profile's z model prices them)."""
    if not workload.estimator_spec.is_default and schedule != "zo2":
        return _estimated(model=model, profile=profile, workload=workload,
                          local_ranks=local_ranks, streams=streams, here=here,
                          one_pass=lambda n: 0.25 * zo_time_s(profile, n, local_ranks),
                          rounding=1.0 if workload.update == "stochastic" else 0.0)
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
                local_ranks: int, streams: int, schedule: str, here: int = 1) -> ZoMaths:
    """CPU profiles with the z model: z draws and passes as measured (zoexec's schedule:
    2 draws + 2 passes per block, the second stream's perturbation in the forward). The
    stochastic update replaces the update pass by its noise and rounding
    (zoplan.pricing.zo.cpu_rounding_s)."""
    if not workload.estimator_spec.is_default and schedule != "zo2":
        return _estimated(model=model, profile=profile, workload=workload,
                          local_ranks=local_ranks, streams=streams, here=here,
                          one_pass=lambda n: pass_time_s(profile, n, local_ranks))
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
        local_ranks: int, streams: int, schedule: str, here: int = 1) -> ZoMaths:
    """GPU: each term a Work (device seconds, host seconds to issue it), from
    zoplan.pricing.zo's z_draw, hbm_pass, gpu_update and rounding_noise. "issue" holds
    the host seconds of each task's zo maths."""
    if not workload.estimator_spec.is_default and schedule != "zo2":
        return _gpu_estimated(model=model, profile=profile, workload=workload,
                              streams=streams, here=here)
    if workload.update_kernel == "fused" and schedule != "zo2":
        return _gpu_fused(model=model, profile=profile, workload=workload, streams=streams)
    del local_ranks
    hw, c = profile, dtype_bytes(workload.compute_dtype)
    upd, pert = zo_pass_bytes(param_bytes=dtype_bytes(workload.param_dtype), compute_bytes=c)
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()

    def update(numels: list[int]) -> Work:
        return gpu_update(hw, numels, update=workload.update, update_bytes=upd)
    res_update = resident_update(hw, workload, resident)
    res_bytes = pert * model.resident_params

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
        work = {"embed": z_res * 2 + res_update
                + resident_pass(hw, workload, "perturb", streams * res_bytes, streams),
                "update": z_block * 2 + update(block) + pert_block,
                "forward": pert_block * (streams - 1),
                "head": resident_pass(hw, workload, "perturb", res_bytes) * (streams - 1)}
    out: ZoMaths = {kind: w.device_s for kind, w in work.items()}
    out["issue"] = {kind: w.host_s for kind, w in work.items()}
    if schedule != "zo2":
        out["parts"] = parts
    return out


def _estimated(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               local_ranks: int, streams: int, here: int, one_pass: Callable[[int], float],
               rounding: float = 0.0) -> ZoMaths:
    """A CPU rank's zo maths with an estimator (module docstring): d draws
    (zoplan.pricing.estimators.cpu_draw_s) and passes (`one_pass(elements)`; the
    stochastic update's rounding by zoplan.pricing.zo.cpu_rounding_s on the z model,
    `rounding` passes more without it)."""
    hw, wl, lr = profile, workload, local_ranks
    q = wl.estimator_spec.directions
    shapes, res_shapes = model.block_tensor_shapes(), model.resident_tensor_shapes()
    d_block, d_res = cpu_draw_s(hw, shapes, wl, lr), cpu_draw_s(hw, res_shapes, wl, lr)
    pass_block, pass_res = one_pass(model.block_params), one_pass(model.resident_params)

    def update(numels: list[int], one: float) -> float:
        if wl.update != "stochastic":
            return one
        return cpu_rounding_s(hw, numels, one) if has_z_model(hw) else (1 + rounding) * one
    upd_block = update(model.block_tensor_numels(), pass_block)
    upd_res = update(model.resident_tensor_numels(), pass_res)

    def deferred(_z_numels: list[int], pieces: list[int], noise: list[int]) -> float:
        """A slice's deferred update: its share of each direction's d, its passes."""
        one = one_pass(sum(pieces))
        upd = update(noise, one) if wl.update == "stochastic" else one
        return q * (draw_share(wl, pieces, shapes) * d_block + upd)
    return {"embed": q * (d_res + upd_res) + here * d_res + streams * pass_res,
            "update": q * (d_block + upd_block) + d_block + pass_block,
            "forward": (streams - 1) * pass_block + (here - 1) * d_block,
            "head": (streams - 1) * pass_res + (here - 1) * d_res,
            "parts": {"deferred": deferred, "perturb": d_block + pass_block}}


def _gpu_estimated(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                   streams: int, here: int) -> ZoMaths:
    """A GPU rank's zo maths with an estimator (module docstring), as `gpu`'s Work."""
    hw, wl, c = profile, workload, dtype_bytes(workload.compute_dtype)
    q = wl.estimator_spec.directions
    upd, pert = zo_pass_bytes(param_bytes=dtype_bytes(wl.param_dtype), compute_bytes=c)
    shapes, res_shapes = model.block_tensor_shapes(), model.resident_tensor_shapes()
    d_block, d_res = gpu_draw(hw, shapes, wl), gpu_draw(hw, res_shapes, wl)
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()

    def update(numels: list[int]) -> Work:
        return gpu_update(hw, numels, update=wl.update, update_bytes=upd)

    def deferred(_z_numels: list[int], pieces: list[int], draws: list[int]) -> Work:
        """A slice's deferred update: its share of each direction's d, its passes."""
        if wl.update != "stochastic":
            one = update(pieces)
        else:
            one = rounding_noise(hw, len(draws), sum(draws)) + hbm_pass(hw, SR_BYTES * sum(pieces), 0)
        return (d_block * draw_share(wl, pieces, shapes) + one) * q
    pert_block = hbm_pass(hw, pert * model.block_params)
    pert_res = resident_pass(hw, wl, "perturb", pert * model.resident_params)
    work = {"embed": (d_res + resident_update(hw, wl, resident)) * q + d_res * here
            + pert_res * streams,
            "update": (d_block + update(block)) * q + d_block + pert_block,
            "forward": pert_block * (streams - 1) + d_block * (here - 1),
            "head": pert_res * (streams - 1) + d_res * (here - 1)}
    out: ZoMaths = {kind: w.device_s for kind, w in work.items()}
    out["issue"] = {kind: w.host_s for kind, w in work.items()}
    out["parts"] = {"deferred": deferred, "perturb": d_block + pert_block}
    return out


def _gpu_fused(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               streams: int) -> ZoMaths:
    """A GPU rank's zo maths on the fused pass (Workload.update_kernel "fused";
    zoplan.pricing.zo.fused_update): the update task one pass per block (update and
    first perturbation), the forward and head tasks one perturbation pass per further
    stream, the embed task the resident parts' pass and their other streams'; a slice's
    deferred update one pass over its elements (no perturbation), the slice update's
    perturbation one pass over the block."""
    hw = profile
    p, c = dtype_bytes(workload.param_dtype), dtype_bytes(workload.compute_dtype)
    block, res = model.block_params, model.resident_params

    def update(n: float) -> Work:
        return fused_update(hw, n, param_bytes=p, compute_bytes=c)

    def perturb(n: float) -> Work:
        return fused_perturb(hw, n, param_bytes=p, compute_bytes=c)

    def deferred(_z_numels: list[int], pieces: list[int], _draws: list[int]) -> Work:
        """A slice's deferred update: one pass over its elements."""
        return fused_update(hw, sum(pieces), param_bytes=p, compute_bytes=c, perturb=False)
    work = {"embed": update(res) + perturb(res) * (streams - 1),
            "update": update(block), "forward": perturb(block) * (streams - 1),
            "head": perturb(res) * (streams - 1)}
    out: ZoMaths = {kind: w.device_s for kind, w in work.items()}
    out["issue"] = {kind: w.host_s for kind, w in work.items()}
    out["parts"] = {"deferred": deferred, "perturb": perturb(block)}
    return out


def stage_rate_gbps(profile: HardwareProfile, workload: Workload, kind: str) -> float | None:
    """The rate the profile stage measured for zoexec's `kind` pass ("update",
    "perturb") with the workload's store, where it has one: a 16-bit store with 16-bit
    z (device.<kind>16_gbps) or an fp32 store with 16-bit z (<kind>32_gbps), the two
    the stage times; None otherwise (another precision, a profile without them)."""
    if workload.compute_dtype not in ("bf16", "fp16"):
        return None
    store = {"bf16": "16", "fp16": "16", "fp32": "32"}.get(workload.param_dtype)
    if store is None:
        return None
    rate: float | None = getattr(profile.figures().device, f"{kind}{store}_gbps")
    return rate


def resident_pass(profile: HardwareProfile, workload: Workload, kind: str,
                  num_bytes: float, launches: float = 1.0) -> Work:
    """A pass over the resident parts on a GPU (module docstring): `num_bytes` at the
    stage's rate of this pass and store (stage_rate_gbps), else at device.hbm_gbps."""
    rate = stage_rate_gbps(profile, workload, kind)
    if rate is None:
        return hbm_pass(profile, num_bytes, launches)
    return Work(num_bytes / (rate * GBPS), launches * launch_s(profile))


def resident_update(profile: HardwareProfile, workload: Workload,
                    numels: list[int]) -> Work:
    """The resident parts' update on a GPU: the update pass (plain, master) or the
    stochastic update (its noise's draws and kernels, SR_BYTES + NOISE_BYTES an
    element) at the stage's update rate of the store (stage_rate_gbps), else as
    zoplan.pricing.zo.gpu_update prices it."""
    upd, _ = zo_pass_bytes(param_bytes=dtype_bytes(workload.param_dtype),
                           compute_bytes=dtype_bytes(workload.compute_dtype))
    if stage_rate_gbps(profile, workload, "update") is None:
        return gpu_update(profile, numels, update=workload.update, update_bytes=upd)
    total = sum(numels)
    if workload.update != "stochastic":
        return resident_pass(profile, workload, "update", upd * total)
    launches = rounding_noise(profile, sr_chunks(numels, "cuda"), total)
    return (Work(0.0, launches.host_s)
            + resident_pass(profile, workload, "update", (SR_BYTES + NOISE_BYTES) * total, 0))


def zo_maths_of(profile: HardwareProfile) -> Callable[..., ZoMaths]:
    """The function that prices the zo maths on this profile."""
    if not profile.is_cpu:
        return gpu
    return cpu_z_model if has_z_model(profile) else cpu_per_param
