"""The baselines a plan is compared with, priced as their own code runs (docs/sources.md:
`zo2`, `mezo`, `distzo2`): what a user would get from ZO2 or MeZO on the same GPU, not
zoexec's schedule with a worse layout.

Both run HF's OPT modules with eager attention and do the zo maths with torch ops per
parameter tensor (ZO2's `zo2/optimizer/mezo_sgd/zo.py`, MeZO's `large_models/trainer.py`):
z = torch.normal(...) in the weights' dtype, one launch a tensor, drawn four times a step
(+eps, -2eps, +eps, update), each perturbation `p.add_(s * z * eps)` (two temporaries:
TORCH_PERTURB_WORDS words a value, 4 launches with the draw) and the update
`p.sub_(lr * (g * z + wd * p))` (four temporaries: TORCH_UPDATE_WORDS, 6 launches).

MeZO keeps everything on the GPU: a step is its two forwards, the heads and the zo
maths over every tensor, the host's launches overlapping the device.

ZO2 (`zo2/optimizer/mezo_sgd/zo2.py`) streams each block through three CUDA streams, and
each task first makes the host wait for the task before it on its stream: at block i
the host waits for the compute of block i-2 and enqueues its offload, waits for the
upload of block i-1 and enqueues its compute (the deferred update, +eps, forward, -2eps,
forward, +eps: 4 z draws and both streams' forwards), then enqueues the upload of block
i. So the upload of block i starts only once the host has issued the compute of block
i-1, and the compute of block i waits for that upload: a block costs
    period = max(issue of a block's compute + its upload, the compute on the device)
where the upload runs beside the offload of block i-2 (on an A100 the H2D direction
drops while D2H runs: pcie.h2d_duplex_gbps; duplex_upload_s). Blocks leave with
`module.to("cpu", non_blocking=True)`, which PyTorch copies into page-locked memory
(ATen's `_to_copy` pins the output of a non-blocking device-to-host copy), so from the
second step on both directions copy pinned memory. The embeddings, final norm and an
untied LM head stay resident and get the same zo maths.

DistZO2 is built on ZO2's scheduler (its abstract: perturbation and data parallelism,
slices of each block uploaded by each GPU and all-gathered over NVLink): the same
lock-step per block, each rank uploading its slice, the all-gather added to the upload,
and every rank running the zo maths of the whole gathered block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoplan.hardware import HardwareProfile
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.pricing.collectives import allgather_s
from zoplan.pricing.compute import gemm_tflops, gpu_elems_per_token, hbm_gbps, hbm_time_s
from zoplan.pricing.copies import duplex_rates_gbps, pageable_copies_s
from zoplan.pricing.figures import given
from zoplan.pricing.host import forward_issue_s, launch_s
from zoplan.pricing.units import GBPS, NS, TFLOPS
from zoplan.pricing.work import Work

# Words (of the weights' dtype) each torch op of the zo maths reads and writes per value:
#   perturb  s * z (1 read, 1 write), (s z) * eps (1, 1), p.add_(...) (2, 1)        7
#   update   g * z (1, 1), wd * p (1, 1), sum (2, 1), lr * sum (1, 1), p.sub_ (2, 1) 12
TORCH_PERTURB_WORDS = 7
TORCH_UPDATE_WORDS = 12
TORCH_PERTURB_LAUNCHES = 4     # normal, mul, mul, add_
TORCH_UPDATE_LAUNCHES = 6      # normal, mul, mul, add, mul, sub_
PERTURBS_PER_STEP = 3          # +eps, -2eps, +eps (restore)
# Eager attention (HF's eager_attention_forward) moves per score value: the QK^T output
# (write 1 word), the scaling (1 read, 1 write), the mask add (1, 1), the softmax in fp32
# (read 1 word, write 2), its cast back (read 2, write 1) and the AV matmul's read (1):
# EAGER_SCORE_WORDS words of the compute dtype.
EAGER_SCORE_WORDS = 13
# The loss over the vocabulary per token and stream: the logits written (1 word), their
# fp32 copy (read 1, write 2), the fp32 log-softmax (read 2, write 2), the loss read (2).
LOSS_WORDS = 10


@dataclass(frozen=True, kw_only=True)
class BaselineStep:
    """One step of a baseline program: its seconds and the parts that make them."""

    name: str
    step_s: float
    bound: str                                   # what sets a block's period
    parts: dict[str, float] = field(default_factory=dict)


# ---- the pieces, each a small function of the profile's figures ----------------------
def torch_zo_maths(profile: HardwareProfile, tensor_numels: list[int], dtype_size: int) -> Work:
    """One step's zo maths over these tensors as torch ops per tensor: 4 z draws (device:
    z_ns_per_elem a value, floored by writing it at HBM speed) and 3 perturbations and an
    update (their words at HBM speed); host: a launch per op."""
    total = sum(tensor_numels)
    z_value = given(profile.figures().compute.z_ns_per_elem, "compute.z_ns_per_elem")
    z_s = max(total * z_value * NS, hbm_time_s(profile, total * dtype_size))
    words = PERTURBS_PER_STEP * TORCH_PERTURB_WORDS + TORCH_UPDATE_WORDS
    device = 4 * z_s + hbm_time_s(profile, words * dtype_size * total)
    return Work(device, block_issue_s(profile, tensor_numels, 0))


def eager_block_forward_s(model: ModelSpec, profile: HardwareProfile, *, rows: int, seq: int,
                          compute_dtype: str) -> float:
    """One stream's forward of one HF block with eager attention over rows x seq tokens:
    the GEMMs (and the attention's) at the precision's rate x m / (m + m_half_tokens),
    the scores' EAGER_SCORE_WORDS words each (eager attention computes every score, the
    masked ones too) and the element-wise outputs (the GEMMs' biases in their epilogue:
    gpu_elems_per_token) at HBM speed."""
    tokens = rows * seq
    word = dtype_bytes(compute_dtype)
    half = profile.figures().compute.m_half_tokens
    rate = gemm_tflops(profile, compute_dtype) * TFLOPS * tokens / (tokens + half)
    flops = tokens * (model.block_gemm_flops_per_token() + model.block_attn_flops_per_token(seq))
    scores = rows * model.num_heads * seq * seq * EAGER_SCORE_WORDS * word
    elems = tokens * gpu_elems_per_token(model) * 2 * word
    return max(flops / rate, model.block_params * word / (hbm_gbps(profile) * GBPS)) \
        + hbm_time_s(profile, scores + elems)


def head_forward_s(model: ModelSpec, profile: HardwareProfile, *, tokens: int,
                   compute_dtype: str) -> float:
    """One stream's final norm, LM head and loss over the vocabulary."""
    word = dtype_bytes(compute_dtype)
    rate = gemm_tflops(profile, compute_dtype) * TFLOPS
    return (tokens * model.head_flops_per_token() / rate
            + hbm_time_s(profile, tokens * model.vocab * LOSS_WORDS * word))


def duplex_upload_s(profile: HardwareProfile, num_bytes: float, *, offload_bytes: float,
                    offload_lead_s: float) -> float:
    """An upload of `num_bytes` beside an offload of `offload_bytes` that started
    `offload_lead_s` earlier on the same GPU's link: each direction at its duplex rate
    while both run (pcie.*_duplex_gbps), alone at its own rate otherwise."""
    p = profile.figures().pcie
    h2d = p.h2d_gbps * GBPS
    d2h = p.d2h_gbps * GBPS
    both = duplex_rates_gbps(profile, "gpu")
    h2d_dup, d2h_dup = (both[0] * GBPS, both[1] * GBPS) if both else (h2d, d2h)
    left_d2h = max(0.0, offload_bytes - offload_lead_s * d2h)
    overlap = min(left_d2h / d2h_dup, num_bytes / h2d_dup)
    return overlap + (num_bytes - overlap * h2d_dup) / h2d


def block_issue_s(profile: HardwareProfile, tensor_numels: list[int], forwards: int) -> float:
    """Host seconds to issue a block's compute: the zo maths' launches and the layer
    calls (compute.overhead_us each)."""
    launches = len(tensor_numels) * (PERTURBS_PER_STEP * TORCH_PERTURB_LAUNCHES
                                     + TORCH_UPDATE_LAUNCHES)
    return launches * launch_s(profile) + forwards * forward_issue_s(profile)


# ---- the programs ----------------------------------------------------------------------
def resident_parts(model: ModelSpec, *, untied_head: bool) -> list[int]:
    """The tensors ZO2 and MeZO keep on the GPU beside the blocks: the embeddings, the
    final norm and (ZO2's memory test unties it) an LM head of its own."""
    numels = list(model.resident_tensor_numels())
    if untied_head and model.tied_head:
        numels.append(model.vocab * (model.word_embed_proj_dim or model.hidden))
    return numels


def _ends(model: ModelSpec, profile: HardwareProfile, *, rows: int, seq: int, dtype: str,
          streams: int, untied_head: bool) -> Work:
    """The embeddings, the heads and the zo maths of the resident parts."""
    zo = torch_zo_maths(profile, resident_parts(model, untied_head=untied_head), dtype_bytes(dtype))
    head = streams * head_forward_s(model, profile, tokens=rows * seq, compute_dtype=dtype)
    return zo + Work(head, 3 * streams * forward_issue_s(profile))


def mezo_step(model: ModelSpec, profile: HardwareProfile, *, batch: int, seq: int,
              dtype: str = "fp16", untied_head: bool = False) -> BaselineStep:
    """MeZO with every weight on one GPU: two forwards of the whole batch, the heads,
    and the zo maths of every tensor; the host's launches overlap the device."""
    block = torch_zo_maths(profile, model.block_tensor_numels(), dtype_bytes(dtype))
    fwd = eager_block_forward_s(model, profile, rows=batch, seq=seq, compute_dtype=dtype)
    blocks = Work(2 * fwd + block.device_s, block.host_s + 2 * forward_issue_s(profile))
    ends = _ends(model, profile, rows=batch, seq=seq, dtype=dtype, streams=2,
                 untied_head=untied_head)
    device = model.num_layers * blocks.device_s + ends.device_s
    host = model.num_layers * blocks.host_s + ends.host_s
    return BaselineStep(name="mezo", step_s=max(device, host),
                        bound="device" if device >= host else "host",
                        parts={"forwards_s": model.num_layers * 2 * fwd,
                               "zo_maths_s": model.num_layers * block.device_s,
                               "ends_s": ends.device_s, "host_s": host})


def zo2_step(model: ModelSpec, profile: HardwareProfile, *, batch: int, seq: int,
             dtype: str = "fp16", untied_head: bool = False, pinned: bool = True) -> BaselineStep:
    """ZO2 on one GPU (module docstring): per block max(issue + upload, compute).
    `pinned` False: the blocks stay in pageable memory (copy_period)."""
    size = dtype_bytes(dtype)
    numels = model.block_tensor_numels()
    block_bytes = model.block_params * size
    zo = torch_zo_maths(profile, numels, size)
    fwd = eager_block_forward_s(model, profile, rows=batch, seq=seq, compute_dtype=dtype)
    compute = 2 * fwd + zo.device_s
    issue = block_issue_s(profile, numels, 2)
    upload, host = copy_period(profile, block_bytes, issue, pinned=pinned)
    period = max(host, compute)
    ends = _ends(model, profile, rows=batch, seq=seq, dtype=dtype, streams=2,
                 untied_head=untied_head)
    step = model.num_layers * period + ends.device_s + upload
    return BaselineStep(name="zo2", step_s=step,
                        bound="upload" if host > compute else "compute",
                        parts={"period_s": period, "compute_s": compute, "issue_s": issue,
                               "upload_s": upload, "forward_s": fwd, "zo_maths_s": zo.device_s,
                               "ends_s": ends.device_s})


def copy_period(profile: HardwareProfile, num_bytes: float, issue: float, *,
                pinned: bool = True) -> tuple[float, float]:
    """(upload seconds, the host's seconds per block) of ZO2's copies of `num_bytes`
    each way. Pinned (PyTorch pins a non-blocking copy to the host): the upload starts
    once the compute is issued and runs beside the offload (duplex_upload_s). Pageable
    (docs/sources.md: cuda-sync): the offload returns only when done and the host stages
    the upload itself, so the host does both copies and the issue one after another, at
    pcie.pageable_*_gbps."""
    if pinned:
        upload = duplex_upload_s(profile, num_bytes, offload_bytes=num_bytes, offload_lead_s=issue)
        return upload, issue + upload
    upload = pageable_copies_s(profile, num_bytes, 0.0)
    return upload, issue + pageable_copies_s(profile, num_bytes, num_bytes)


def distzo2_step(model: ModelSpec, profile: HardwareProfile, *, batch: int, seq: int,
                 pertp: int, ddp: int, slices: int, dtype: str = "fp16",
                 pinned: bool = True) -> BaselineStep:
    """DistZO2 on pertp x ddp GPUs of one node, slices of `slices` (module docstring):
    each rank runs its share of the rows in one stream (pertp 2) or both (pertp 1),
    uploads 1/slices of each block beside its offload, all-gathers the rest, and runs
    the zo maths of the whole block."""
    if batch % ddp:
        raise ValueError(f"batch ({batch}) is not divisible by ddp ({ddp})")
    size = dtype_bytes(dtype)
    numels = model.block_tensor_numels()
    block_bytes = model.block_params * size
    streams = 2 if pertp == 1 else 1
    zo = torch_zo_maths(profile, numels, size)
    fwd = eager_block_forward_s(model, profile, rows=batch // ddp, seq=seq, compute_dtype=dtype)
    compute = streams * fwd + zo.device_s
    issue = block_issue_s(profile, numels, streams)
    piece = block_bytes / slices
    upload = _shared_upload_s(profile, piece, issue, pertp * ddp)
    host = issue + upload
    if not pinned:
        upload, host = copy_period(profile, piece, issue, pinned=False)
    gather = 0.0
    if slices > 1:
        gather = allgather_s(profile, block_bytes, slices)
    period = max(host + gather, compute)
    ends = _ends(model, profile, rows=batch // ddp, seq=seq, dtype=dtype, streams=streams,
                 untied_head=False)
    return BaselineStep(name="distzo2", step_s=model.num_layers * period + ends.device_s + upload,
                        bound="upload" if host + gather > compute else "compute",
                        parts={"period_s": period, "compute_s": compute, "issue_s": issue,
                               "upload_s": upload, "allgather_s": gather})


def _shared_upload_s(profile: HardwareProfile, piece: float, issue: float, ranks: int) -> float:
    """A rank's upload of `piece` bytes beside its offload of as much, when `ranks`
    GPUs of a node do the same at once: the GPUs behind one PCIe switch share its uplink
    (pcie.switch_groups, switch_uplink_gbps), and all of them the host's memory."""
    alone = duplex_upload_s(profile, piece, offload_bytes=piece, offload_lead_s=issue)
    f = profile.figures()
    groups = f.pcie.switch_groups or ()
    sharing = max([sum(1 for r in g if r < ranks) for g in groups] or [1])
    uplink = f.pcie.switch_uplink_gbps * GBPS
    host = f.host.mem_bw_gbps * GBPS
    # both directions of every rank through one uplink (per direction) and host memory
    return max(alone, sharing * piece / uplink, 2 * ranks * piece / host)
