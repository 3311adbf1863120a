"""Per-task work of one rank: the times of the embed, update, forward and head tasks
(block forwards, z draws, the zo passes, the stochastic update) on a GPU or a CPU
profile (docs/execution.md's schedule; ZO2's for its baseline).

GPU terms: GEMMs and attention at the precision's rate (zoplan.hardware.
gpu_forward_terms), memory-bound work as bytes over HBM bandwidth, z draws per launch and
per element. CPU terms: the measured figures of `zoplan profile` (z model, passes) or
the one figure compute.zo_ns_per_param.
"""

from __future__ import annotations

from typing import NamedTuple

from zoplan.execrules import chunk_bounds, sr_chunk
from zoplan.hardware import HardwareProfile, gpu_block_bytes
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.workload import Workload

# Operators of an embedding lookup and of the head + loss, as a share of a block
# forward's (~40 for an OPT block, ~4 and ~10): their share of its dispatch cost.
EMBED_OPS, HEAD_OPS = 0.1, 0.25


# Bytes per parameter of the zo passes on a GPU (the executor's passes, docs/precision.md;
# p: the stored (param) dtype's bytes, c: the compute dtype's, in which z is drawn):
#   update pass    theta -= lr*g*z (zo.apply_update): reads theta and z, writes theta  2p + c
#   perturb pass   work = theta + eps*z (zo.perturb_into): reads theta and z, writes work
#                  in the compute dtype                                                p + 2c
#   ZO2 in place   theta += s*eps*z: reads theta and z, writes theta                   2p + c
# The stochastic update (zo.apply_update_stochastic; 16-bit theta and z) works per chunk
# of execrules.sr_chunk elements in fp32 scratch: copy theta in (6 bytes per element),
# add lr*g*z (10), draw the integer noise (one generator launch per chunk, priced like
# z), and round on the bits (zo.round_stochastic_: add the noise 12, shift or mask 8, copy
# into the 16-bit store 6): SR_BYTES per element in SR_KERNELS element-wise kernels per
# chunk, in place of the update pass (weight decay, when set, adds a multiply: not priced).
SR_BYTES = 6 + 10 + 12 + 8 + 6
SR_KERNELS = 5
CPU_PASS_BYTES = 12   # an fp32 pass, what compute.zo_pass_ns is measured on (CPU profiles)
SCHEDULES = ("zoexec", "zo2")   # z twice per block and step, or ZO2's four times


class Work(NamedTuple):
    """A GPU task's work: seconds on the device and seconds its host thread takes to
    issue it (launches, seeds, layer calls; the host lane)."""

    device_s: float
    host_s: float

    def __add__(self, other: Work) -> Work:   # type: ignore[override]
        return Work(self.device_s + other.device_s, self.host_s + other.host_s)

    def __mul__(self, k: float) -> Work:   # type: ignore[override]
        return Work(self.device_s * k, self.host_s * k)


def zo_pass_bytes(*, param_bytes: int, compute_bytes: int) -> tuple[int, int]:
    """(update pass, perturb pass) bytes per parameter on a GPU (plain and master; the
    stochastic update replaces the update pass by SR_BYTES)."""
    p, c = param_bytes, compute_bytes
    return 2 * p + c, p + 2 * c


def sr_chunks(tensor_numels: list[int], device_kind: str) -> int:
    """Chunks of the stochastic update over these tensors (a noise draw and SR_KERNELS
    kernels each)."""
    chunk = sr_chunk(device_kind)
    return sum(len(chunk_bounds(n, chunk)) for n in tensor_numels)


def task_times(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
               tokens: int, streams: int, local_ranks: int, schedule: str = "zoexec") -> dict:
    """embed_s, update_s, forward_s and head_s of one rank (the schedule of
    docs/execution.md): `tokens` per perturbation stream, `streams` forwards per block.

    update: the deferred update (a z draw + a pass) and the next perturbation (a z draw
    + a pass); `parts` splits it for slice_update: "deferred"(z draw sizes, tensor
    pieces, rounding noise draw sizes) prices the deferred update of a slice, "perturb" the perturbation alone
    (None for schedule "zo2"); forward: one block forward per stream, and the second stream's
    perturbation pass; embed: the resident parts' update, z and one perturbation pass
    per stream, and one embedding lookup per stream; head: one final norm + LM head +
    loss per stream and the resident perturbation pass between them. The update mode
    stochastic replaces the update pass by the fp32 update, its noise and the rounding's
    passes (SR_BYTES). "issue" (GPU profiles; None on CPUs): the host seconds to issue
    each of those tasks (layer calls at compute.overhead_us, the zo maths' launches).
    schedule "zo2": ZO2 as published (zo-algorithms.md; zoexec.reference) perturbs
    +eps, -2eps, +eps (restore) in place and updates, each with a fresh z draw: four
    draws and four in-place passes per block and step."""
    assert schedule in SCHEDULES, schedule
    hw = profile
    fwd, lookups, head_fwd = forward_terms(model=model, profile=hw, workload=workload,
                                           tokens=tokens, streams=streams,
                                           local_ranks=local_ranks)
    args = dict(model=model, profile=hw, workload=workload, local_ranks=local_ranks,
                streams=streams, schedule=schedule)
    zo = (_gpu_zo if not hw.is_cpu else _cpu_zo_z_model if hw.has_z_model
          else _cpu_zo_per_param)(**args)
    out = {"embed_s": zo["embed"] + lookups, "update_s": zo["update"],
           "forward_s": streams * fwd + zo["forward"],
           "head_s": streams * head_fwd + zo["head"], "parts": zo.get("parts"),
           "issue": None}
    if not hw.is_cpu:   # the host lane: layer calls and the zo maths' launches
        issue = zo["issue"]
        out["issue"] = {"embed": issue["embed"] + streams * hw.forward_issue_s(EMBED_OPS),
                        "update": issue["update"],
                        "forward": issue["forward"] + streams * hw.forward_issue_s(),
                        "head": issue["head"] + streams * hw.forward_issue_s(HEAD_OPS)}
    return out


def forward_terms(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                  tokens: int, streams: int, local_ranks: int,
                  extra_flops_per_token: float = 0.0) -> tuple[float, float, float]:
    """(one stream's block forward, the embedding lookups of all streams, one stream's
    head forward) without the zo maths. `extra_flops_per_token`: GEMM FLOPs a block
    adds to its own (LoRA's adapters, zoplan.lora)."""
    hw = profile
    cbytes = dtype_bytes(workload.compute_dtype)
    gpu = dict(compute_dtype=workload.compute_dtype, tf32=workload.tf32)
    if not hw.is_cpu:
        attn_bytes, _ = gpu_block_bytes(attn_dim=model.attn_dim, kv_dim=model.kv_dim,
                                        elems_per_token=0.0, tokens=tokens,
                                        dtype_bytes=cbytes)
        gpu["attn_bytes"] = attn_bytes
    gemm = model.block_gemm_flops_per_token() + extra_flops_per_token
    fwd = hw.forward_time_s(flops=tokens * gemm,
                            attn_flops=tokens * model.block_attn_flops_per_token(workload.priced_seq),
                            elems=tokens * model.block_elems_per_token(),
                            weight_bytes=model.block_params * cbytes, tokens=tokens,
                            local_ranks=local_ranks, family=model.family, **gpu)
    gpu.pop("attn_bytes", None)
    # the embedding lookup: per stream, its rows' bytes (GPU) or the element-wise terms
    # (measured CPU); the default CPU profile prices one call for all streams' rows
    per_call = hw.has_z_model or not hw.is_cpu
    rows = 0.0 if hw.has_z_model else tokens * model.hidden * cbytes
    lookup = hw.forward_time_s(flops=0.0, elems=tokens * model.embed_elems_per_token(),
                               weight_bytes=rows if per_call else streams * rows,
                               tokens=tokens, local_ranks=local_ranks,
                               overhead_share=EMBED_OPS if per_call else 1.0, **gpu)
    labelled = tokens * workload.head_share   # the head acts where a label is predicted
    head_fwd = hw.forward_time_s(flops=labelled * model.head_flops_per_token(),
                                 elems=labelled * model.head_elems_per_token(),
                                 weight_bytes=model.vocab * model.hidden * cbytes,
                                 tokens=labelled, local_ranks=local_ranks,
                                 overhead_share=HEAD_OPS if per_call else 1.0, **gpu)
    return fwd, (streams * lookup if per_call else lookup), head_fwd


def _cpu_zo_per_param(*, model, profile, workload, local_ranks, streams, schedule) -> dict:
    """CPU profiles without the z model: compute.zo_ns_per_param prices the update
    task's 2 draws + 2 passes; ZO2's 4 + 4 cost twice that; the stochastic update's noise
    draw and rounding passes are taken to cost as much as the task again (a rough
    figure: a measured profile's z model prices them)."""
    factor = 2.0 if schedule == "zo2" else 1.0
    stochastic = 1.0 if workload.update == "stochastic" else 0.0
    factor += stochastic

    def deferred(_z_numels: list[int], pieces: list[int], _noise: list[int]) -> float:
        # half the task (a draw and a pass) and the rounding's share, on the slice
        return (0.5 + stochastic) * profile.zo_time_s(sum(pieces), local_ranks)
    parts = None if schedule == "zo2" else {
        "deferred": deferred, "perturb": 0.5 * profile.zo_time_s(model.block_params, local_ranks)}
    return {"embed": factor * profile.zo_time_s(model.embed_params, local_ranks),
            "update": factor * profile.zo_time_s(model.block_params, local_ranks),
            "forward": 0.0,
            "head": factor * profile.zo_time_s(model.head_params, local_ranks),
            "parts": parts}


def _cpu_zo_z_model(*, model, profile, workload, local_ranks, streams, schedule) -> dict:
    """CPU profiles with the z model: z draws and passes as measured (zoexec's schedule:
    2 draws + 2 passes per block, the second stream's perturbation in the forward). The
    stochastic update replaces the update pass by its noise, drawn chunk by chunk on
    one thread (z_chunk_us a chunk, z_ns_per_elem an element), and SR_BYTES of
    element-wise work (SR_BYTES / CPU_PASS_BYTES passes)."""
    hw, lr = profile, local_ranks
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()
    z_block, z_res = hw.z_time_s(block, lr), hw.z_time_s(resident, lr)
    pass_block = hw.pass_time_s(model.block_params, lr)
    pass_res = hw.pass_time_s(model.resident_params, lr)
    upd_block, upd_res = pass_block, pass_res

    def rounding(numels: list[int], one_pass: float) -> float:
        c = hw.compute
        noise = (sr_chunks(numels, "cpu") * c.get("z_chunk_us", 0.0) * 1e-6
                 + sum(numels) * c["z_ns_per_elem"] * 1e-9)
        return noise + SR_BYTES / CPU_PASS_BYTES * one_pass
    if workload.update == "stochastic":
        upd_block, upd_res = rounding(block, pass_block), rounding(resident, pass_res)

    def deferred(z_numels: list[int], pieces: list[int], noise: list[int]) -> float:
        """A slice's deferred update: z and the rounding's noise for every chunk it
        touches, the passes over its elements."""
        one_pass = hw.pass_time_s(sum(pieces), lr)
        upd = rounding(noise, one_pass) if workload.update == "stochastic" else one_pass
        return hw.z_time_s(z_numels, lr) + upd
    parts = {"deferred": deferred, "perturb": z_block + pass_block}
    if schedule == "zo2":
        return {"embed": 4 * z_res + upd_res + 3 * pass_res,
                "update": 4 * z_block + upd_block + 3 * pass_block,
                "forward": 0.0, "head": 0.0}
    if workload.update != "stochastic":   # as before the update modes (same floats)
        return {"embed": 2 * z_res + (1 + streams) * pass_res,
                "update": 2 * (z_block + pass_block),
                "forward": (streams - 1) * pass_block, "head": (streams - 1) * pass_res,
                "parts": parts}
    return {"embed": 2 * z_res + upd_res + streams * pass_res,
            "update": 2 * z_block + upd_block + pass_block,
            "forward": (streams - 1) * pass_block, "head": (streams - 1) * pass_res,
            "parts": parts}


def _gpu_zo(*, model, profile, workload, local_ranks, streams, schedule) -> dict:
    """GPU: each term a pair (device seconds, host seconds to issue it). A z draw: its
    elements at z_ns_per_elem on the device (HardwareProfile.z_time_s), one seeded launch
    per 2**24-element chunk of a tensor on the host (z_issue_s); a pass: its bytes
    (zo_pass_bytes) at the achieved HBM bandwidth, one launch; the stochastic update:
    SR_BYTES at HBM bandwidth, its noise drawn like z, SR_KERNELS launches a chunk
    (sr_chunks). "issue" holds the host seconds of each task's zo maths."""
    hw, c = profile, dtype_bytes(workload.compute_dtype)
    upd, pert = zo_pass_bytes(param_bytes=dtype_bytes(workload.param_dtype), compute_bytes=c)
    block, resident = model.block_tensor_numels(), model.resident_tensor_numels()

    def z(numels: list[int]) -> Work:
        return Work(hw.z_time_s(numels, elem_bytes=c), hw.z_issue_s(numels))

    def passes(num_bytes: float, count: float = 1.0) -> Work:
        return Work(hw.hbm_time_s(num_bytes), count * hw.launch_s)

    def noise(chunks: int, numels: float) -> Work:   # the rounding's draws and kernels
        return Work(numels * hw.compute["z_ns_per_elem"] * 1e-9,
                    (1 + SR_KERNELS) * chunks * hw.compute["z_launch_us"] * 1e-6)

    def update(numels: list[int]) -> Work:
        if workload.update != "stochastic":
            return passes(upd * sum(numels))
        return noise(sr_chunks(numels, "cuda"), sum(numels)) + passes(SR_BYTES * sum(numels), 0)

    def deferred(z_numels: list[int], pieces: list[int], draws: list[int]) -> Work:
        """A slice's deferred update: z of every chunk it touches (drawn whole); the
        stochastic update's noise of every rounding chunk it touches (whole), its passes
        over the slice's elements."""
        if workload.update != "stochastic":
            return z(z_numels) + update(pieces)
        return z(z_numels) + noise(len(draws), sum(draws)) + passes(SR_BYTES * sum(pieces), 0)
    z_block, z_res = z(block), z(resident)
    pert_block = passes(pert * model.block_params)
    parts = {"deferred": deferred, "perturb": z_block + pert_block}
    if schedule == "zo2":   # in place: perturb, -2 eps, restore; a cast per stream
        p = dtype_bytes(workload.param_dtype)
        extra = 3 * (2 * p + c) + (streams * (p + c) if p != c else 0)
        work = {"embed": z_res * 4 + update(resident) + passes(extra * model.resident_params, 3),
                "update": z_block * 4 + update(block) + passes(extra * model.block_params, 3),
                "forward": Work(0.0, 0.0), "head": Work(0.0, 0.0)}
    else:
        work = {"embed": z_res * 2 + update(resident)
                + passes(streams * pert * model.resident_params, streams),
                "update": z_block * 2 + update(block) + pert_block,
                "forward": pert_block * (streams - 1),
                "head": passes(pert * model.resident_params) * (streams - 1)}
    out = {kind: w.device_s for kind, w in work.items()}
    out["issue"] = {kind: w.host_s for kind, w in work.items()}
    if schedule != "zo2":
        out["parts"] = parts
    return out
