"""Compute: a forward pass on a CPU rank or a GPU, GEMM rates by precision, how local
ranks share a host's cores, and memory-bound GPU work at the achieved HBM bandwidth.

CPU (cpu_forward_terms): a block forward = overhead_us (+ rope_overhead_us for a block
of another family than OPT) + max(GEMM FLOPs / (peak_tflops x m / (m + m_half_tokens)),
weight bytes / mem_gbps), with attention at attn_tflops and element-wise outputs at
elem_ns where a measured profile has them; with k local ranks each gets peak / k x
rank_scaling (GEMMs) or mem_rank_scaling (memory-bound work).
GPU (gpu_forward_terms): a roofline per part, GEMMs at the precision's tensor-core
rate x m / (m + m_half_tokens) never faster than reading the weights at HBM speed,
attention's FLOPs (the causal half, CAUSAL_ATTN_SHARE) likewise against its bytes,
element-wise operators as bytes over HBM bandwidth, the biases of the GEMMs excepted
(gpu_elems_per_token) (memory-bound kernels: Williams, Waterman and Patterson,
"Roofline", CACM 2009; their achievable share of spec HBM, device.hbm_fraction,
docs/sources.md). The dispatch is host time on a GPU (zoplan.pricing.host), issued
while the device runs what was issued before it: a forward alone takes the longer of
its launches and its device work (gpu_forward_alone_s), the rule the profile's fit
and the simulator's host lane (zoplan.sim.graph) both follow.
"""

from __future__ import annotations

from typing import Any

from zoplan.hardware import HardwareProfile
from zoplan.hwsections import Compute
from zoplan.models import DTYPE_BYTES, LEARNED_POSITIONS, ModelSpec, dtype_bytes
from zoplan.pricing.figures import given, or_
from zoplan.pricing.units import GBPS, NS, TFLOPS, US
from zoplan.workload import HALF_DTYPES, Workload

# Bytes an element-wise operator moves per output element, in units of the compute
# dtype: it reads its input and writes its output (a binary one reads a second input:
# a floor). Memory-bound GPU work is bytes over HBM bandwidth.
ELEM_RW = 2
# The share of a causal attention's score FLOPs a fused kernel computes: SDPA's flash
# and memory-efficient kernels skip the key blocks above the diagonal when is_causal
# (zoexec's masks: zoexec.model.adapter.causal_mask leaves is_causal to SDPA), about
# half of them (Dao, "FlashAttention-2", arXiv 2307.08691, sec. 3.1.1;
# docs/sources.md: flash2). Eager attention (the baselines) computes every score.
CAUSAL_ATTN_SHARE = 0.5
# Operators of an embedding lookup and of the head + loss, as a share of a block
# forward's (~40 for an OPT block, ~4 and ~10): their share of its dispatch cost.
EMBED_OPS, HEAD_OPS = 0.1, 0.25
# HBM bytes per logit of the vocabulary loss on a GPU, after the LM head's GEMM
# (zoexec.model.heads.token_losses): the GEMM writes the logits (c bytes, compute
# dtype), `.float()` reads them and writes fp32 (c + 4; nothing where c is 4), and
# cross_entropy's log-softmax reads its fp32 row and writes it (8). PyTorch's softmax
# kernel for rows longer than its shared memory (cunn_SoftMaxForward) reads a row three
# times (max, sum of exponentials, output); the two re-reads are taken as L2 hits: the
# rows in flight, one per SM (132 x 201 KB for OPT's 50,272 words), fit the H100/H200's
# 50 MB L2 (docs/sources.md: h100-ds). Counting them at HBM would add 8 bytes a logit
# (+18% on the H200's head, pass 2). The loss gathers one logit a row: not priced.
LOGSOFTMAX_BYTES = 8


def gpu_logit_bytes(compute_dtype: str) -> int:
    """HBM bytes per logit of the GPU head's vocabulary loss (LOGSOFTMAX_BYTES above)."""
    c = DTYPE_BYTES[compute_dtype]
    return c + (c + 4 if c != 4 else 0) + LOGSOFTMAX_BYTES


def has_z_model(profile: HardwareProfile) -> bool:
    """Whether a CPU profile is a measured one that prices the zo maths per z draw and
    pass (`zoplan profile`: compute.z_ns_per_elem and the z model) rather than by the
    one figure compute.zo_ns_per_param; such a profile also prices the embedding
    lookup by its element-wise terms."""
    return profile.is_cpu and profile.figures().compute.z_ns_per_elem is not None


def compute_share(profile: HardwareProfile, local_ranks: int, key: str = "rank_scaling") -> float:
    """Fraction of the device's compute one rank gets (1 on GPUs); `key` names the
    scaling figure: rank_scaling (GEMMs), mem_rank_scaling (memory-bound work) or
    zo_rank_scaling (the zo maths), the last two falling back to rank_scaling."""
    if not profile.is_cpu or local_ranks <= 1:
        return 1.0
    c = profile.figures().compute
    scaling = {"rank_scaling": c.rank_scaling, "mem_rank_scaling": c.mem_rank_scaling,
               "zo_rank_scaling": c.zo_rank_scaling}[key]
    return or_(scaling, c.rank_scaling) / local_ranks


def gemm_rate_key(profile: HardwareProfile, compute_dtype: str = "fp32", tf32: bool = True) -> str:
    """The compute figure of the GEMM rate of the workload's precision: CPU profiles
    have one (peak_tflops); on GPUs fp16 and bf16 run at peak_tflops (one tensor-core
    rate), fp32 at tf32_tflops when TF32 is allowed (Workload.tf32), else at
    fp32_tflops. What a refit scales."""
    if profile.is_cpu or compute_dtype in HALF_DTYPES:
        return "peak_tflops"
    return "tf32_tflops" if tf32 else "fp32_tflops"


def gemm_tflops(profile: HardwareProfile, compute_dtype: str = "fp32", tf32: bool = True) -> float:
    """The GEMM rate of the workload's precision (gemm_rate_key's figure)."""
    c = profile.figures().compute
    key = gemm_rate_key(profile, compute_dtype, tf32)
    if key == "peak_tflops":
        return c.peak_tflops
    return given(c.tf32_tflops if key == "tf32_tflops" else c.fp32_tflops, f"compute.{key}")


def hbm_gbps(profile: HardwareProfile) -> float:
    """What memory-bound GPU kernels reach: device.hbm_gbps x device.hbm_fraction
    (1 where the profile has none: a measured hbm_gbps is already achieved)."""
    device = profile.figures().device
    return given(device.hbm_gbps, "device.hbm_gbps") * or_(device.hbm_fraction, 1.0)


def hbm_time_s(profile: HardwareProfile, num_bytes: float) -> float:
    """Memory-bound GPU work: bytes over the achieved HBM bandwidth (hbm_gbps)."""
    return num_bytes / (hbm_gbps(profile) * GBPS)


def host_memory_time_s(profile: HardwareProfile, num_bytes: float) -> float:
    """Memory-bound CPU work: bytes over compute.mem_gbps."""
    rate = given(profile.figures().compute.mem_gbps, "compute.mem_gbps")
    return num_bytes / (rate * GBPS)


def device_copy_s(profile: HardwareProfile, num_bytes: float) -> float:
    """A copy inside a device's memory, `num_bytes` read and written in all: HBM time
    on a GPU, compute.mem_gbps on a CPU rank."""
    if profile.is_cpu:
        return host_memory_time_s(profile, num_bytes)
    return hbm_time_s(profile, num_bytes)


def cpu_forward_terms(figures: dict[str, Any], *, flops: float, attn_flops: float,
                      elems: float, tokens: int | float,
                      family: str = "opt") -> tuple[float, float, float]:
    """(dispatch, GEMMs, attention + element-wise work) in seconds of one block forward
    on one CPU rank alone, from a profile's compute figures (or a fit's): overhead_us (and
    rope_overhead_us for a block of another family than OPT, where measured); the
    GEMM FLOPs at peak_tflops x m / (m + m_half_tokens); attention at attn_tflops and
    elem_ns per element-wise output where the figures have them (measured CPU
    profiles), else attention counts as GEMM FLOPs and element-wise work as free."""
    eff = tokens / (tokens + figures["m_half_tokens"]) if tokens > 0 else 1.0
    attn_rate = figures.get("attn_tflops")
    gemm: float = (flops if attn_rate else flops + attn_flops) / (figures["peak_tflops"] * TFLOPS * eff)
    rest: float = attn_flops / (attn_rate * TFLOPS) if attn_rate else 0.0
    rest += elems * figures.get("elem_ns", 0.0) * NS
    dispatch: float = figures["overhead_us"] + (figures.get("rope_overhead_us", 0.0)
                                                if family not in LEARNED_POSITIONS else 0.0)
    return dispatch * US, gemm, rest


def forward_figures(c: Compute) -> dict[str, float]:
    """A profile's figures the forward's terms read (cpu_forward_terms,
    gpu_forward_terms), by the names a fit's figures have too."""
    out = {"peak_tflops": c.peak_tflops, "m_half_tokens": c.m_half_tokens,
           "overhead_us": c.overhead_us}
    for key, value in (("attn_tflops", c.attn_tflops), ("elem_ns", c.elem_ns),
                       ("rope_overhead_us", c.rope_overhead_us)):
        if value is not None:
            out[key] = value
    return out


def gpu_elems_per_token(model: ModelSpec) -> float:
    """Element-wise outputs a block forward writes per token on a GPU: the model's
    (block_elems_per_token) less its GEMMs' bias broadcasts, which PyTorch adds in
    cuBLASLt's bias epilogue of the GEMM itself (addmm with a 1-D bias, beta 1, fp16,
    bf16 or fp32: ATen's addmm_out_cuda_impl; nn.Linear's contiguous 3-D input takes
    that path) instead of a separate kernel (docs/sources.md: aten-addmm)."""
    return model.block_elems_per_token() - model.block_bias_elems_per_token()


def gpu_forward_terms(figures: dict[str, Any], *, rate_tflops: float, hbm_gbps: float,
                      flops: float, attn_flops: float, attn_bytes: float, elem_bytes: float,
                      weight_bytes: float, tokens: int | float) -> tuple[float, float, float]:
    """(launches, GEMMs, attention + element-wise work) in seconds of one forward on a
    GPU, a roofline per part: the GEMMs at the precision's rate x m / (m + m_half_tokens)
    (m token rows), never faster than reading the weights at HBM bandwidth; attention's
    FLOPs (`attn_flops`: every score; the causal kernel computes CAUSAL_ATTN_SHARE of
    them) at the same rate (the fused kernel runs on the tensor cores), never faster
    than its bytes at HBM bandwidth; element-wise operators are memory-bound (bytes over
    HBM bandwidth). The launches cost overhead_us of host time (figures: the compute
    section, or a fit's figures with m_half_tokens and overhead_us), hidden behind the
    device work they issue: gpu_forward_alone_s."""
    eff = tokens / (tokens + figures["m_half_tokens"]) if tokens > 0 else 1.0
    rate, hbm = rate_tflops * TFLOPS * eff, hbm_gbps * GBPS
    gemm = max(flops / rate, weight_bytes / hbm)
    rest = max(CAUSAL_ATTN_SHARE * attn_flops / rate, attn_bytes / hbm) + elem_bytes / hbm
    overhead: float = figures["overhead_us"]
    return overhead * US, gemm, rest


def gpu_forward_alone_s(launches_s: float, device_s: float) -> float:
    """Seconds of one forward timed alone on a GPU (the profiler's samples: the call,
    then a synchronize): the host issues the launches one by one while the device runs
    the kernels issued before, so the longer of the two sets the time, launches
    (short forwards: the device waits for the host) or device work (long ones: the
    host has queued everything long before the end). The simulator gives every GPU
    compute task the same rule: it starts with its issue and ends no sooner than its
    issue ends (zoplan.sim.simulate)."""
    return max(launches_s, device_s)


def gpu_block_bytes(*, attn_dim: int, kv_dim: int, elems_per_token: float, tokens: int | float,
                    dtype_bytes: int) -> tuple[float, float]:
    """(attention, element-wise) HBM bytes of one block forward over `tokens` tokens on a
    GPU: the fused attention kernel (SDPA, zoexec.model.families' default) reads Q, K and V and
    writes its output once; each element-wise output moves ELEM_RW dtype words."""
    attn = tokens * (2 * attn_dim + 2 * kv_dim) * dtype_bytes
    return float(attn), tokens * elems_per_token * ELEM_RW * dtype_bytes


def forward_time_s(profile: HardwareProfile, *, flops: float, weight_bytes: float,
                   tokens: int | float, local_ranks: int = 1, attn_flops: float = 0.0,
                   elems: float = 0.0, overhead_share: float = 1.0, family: str = "opt",
                   attn_bytes: float = 0.0, compute_dtype: str = "fp32",
                   tf32: bool = True, extra_bytes: float = 0.0) -> float:
    """Device seconds of one forward call: `flops` of GEMMs over `tokens` tokens,
    `attn_flops` of attention and `elems` element-wise outputs. CPU
    (cpu_forward_terms): `overhead_share` of the dispatch (the call's operators as a
    share of a block forward's), the GEMMs shared by rank_scaling, attention and
    element-wise work by mem_rank_scaling. GPU (gpu_forward_terms): the precision's GEMM
    rate, attention and element-wise bytes (`attn_bytes`, elems x ELEM_RW words) at HBM
    bandwidth, and `extra_bytes` of memory-bound work more (the head's logits); the
    dispatch is host time (zoplan.pricing.host.forward_issue_s)."""
    compute = profile.figures().compute
    c = forward_figures(compute)
    if not profile.is_cpu:
        dsize = DTYPE_BYTES[compute_dtype]
        _, gemm, rest = gpu_forward_terms(
            c, rate_tflops=gemm_tflops(profile, compute_dtype, tf32),
            hbm_gbps=hbm_gbps(profile), flops=flops, attn_flops=attn_flops,
            attn_bytes=attn_bytes, elem_bytes=elems * ELEM_RW * dsize + extra_bytes,
            weight_bytes=weight_bytes, tokens=tokens)
        return gemm + rest
    share = compute_share(profile, local_ranks)
    mem_share = compute_share(profile, local_ranks, key="mem_rank_scaling")
    dispatch, gemm, rest = cpu_forward_terms(c, flops=flops, attn_flops=attn_flops,
                                             elems=elems, tokens=tokens, family=family)
    mem_gbps = given(compute.mem_gbps, "compute.mem_gbps")
    t: float = max(gemm / share, weight_bytes / (mem_gbps * GBPS)) + rest / mem_share
    return overhead_share * dispatch + t


def forward_times(*, model: ModelSpec, profile: HardwareProfile, workload: Workload,
                  tokens: int | float, streams: int, local_ranks: int,
                  extra_flops_per_token: float = 0.0) -> tuple[float, float, float]:
    """(one stream's block forward, the embedding lookups of all streams, one stream's
    head forward) without the zo maths. `extra_flops_per_token`: GEMM FLOPs a block
    adds to its own (LoRA's adapters, zoplan.lora)."""
    hw = profile
    cbytes = dtype_bytes(workload.compute_dtype)
    gpu: dict[str, Any] = dict(compute_dtype=workload.compute_dtype, tf32=workload.tf32)
    elems = model.block_elems_per_token()
    if not hw.is_cpu:
        attn_bytes, _ = gpu_block_bytes(attn_dim=model.attn_dim, kv_dim=model.kv_dim,
                                        elems_per_token=0.0, tokens=tokens,
                                        dtype_bytes=cbytes)
        gpu["attn_bytes"] = attn_bytes
        elems = gpu_elems_per_token(model)
    gemm = model.block_gemm_flops_per_token() + extra_flops_per_token
    fwd = forward_time_s(hw, flops=tokens * gemm,
                         attn_flops=tokens * model.block_attn_flops_per_token(workload.priced_seq),
                         elems=tokens * elems,
                         weight_bytes=model.block_params * cbytes, tokens=tokens,
                         local_ranks=local_ranks, family=model.family, **gpu)
    gpu.pop("attn_bytes", None)
    # the embedding lookup: per stream, its rows' bytes (GPU) or the element-wise terms
    # (measured CPU); the default CPU profile prices one call for all streams' rows
    z_model = has_z_model(hw)
    per_call = z_model or not hw.is_cpu
    rows = 0.0 if z_model else tokens * model.hidden * cbytes
    lookup = forward_time_s(hw, flops=0.0, elems=tokens * model.embed_elems_per_token(),
                            weight_bytes=rows if per_call else streams * rows,
                            tokens=tokens, local_ranks=local_ranks,
                            overhead_share=EMBED_OPS if per_call else 1.0, **gpu)
    labelled = tokens * workload.head_share   # the head acts where a label is predicted
    head_elems = model.head_elems_per_token()
    if not hw.is_cpu:   # the final norm as element-wise work, the logits by their bytes
        head_elems -= model.vocab
        gpu["extra_bytes"] = labelled * model.vocab * gpu_logit_bytes(workload.compute_dtype)
    head_fwd = forward_time_s(hw, flops=labelled * model.head_flops_per_token(),
                              elems=labelled * head_elems,
                              weight_bytes=model.vocab * model.hidden * cbytes,
                              tokens=labelled, local_ranks=local_ranks,
                              overhead_share=HEAD_OPS if per_call else 1.0, **gpu)
    return fwd, (streams * lookup if per_call else lookup), head_fwd
