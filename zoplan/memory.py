"""What one zoexec rank allocates on its device, and one node on its host: the ONE
memory model, term by term, with labels. The planner prices layouts with it
(zoplan.pricing.memory adds the profile's limits), hand_plan writes it into plans, zoexec's
pre-flight checks a machine against it, and tests/unit/test_memory_model.py runs the
executor on the CPU under an allocation tracker and compares (within 5%).

Device of one rank (zoexec.train.engine.Trainer), n = block numel, r = resident numel,
p / c = bytes of the stored / compute precision, t = the tokens of one stream (batch /
ddp x seq; with q directions a step, the rank's part of one direction), streams = 2
for role "+-" (pertp 1), else 1, times the directions that meet the rank's rows:
  held from set-up to the end (Trainer._allocate)
    block buffers      max(1, min(prefetch, blocks)) x store stride x p
    resident shards    per resident block (Plan.resident_blocks): store stride / slices x p,
                       the rank's shard of its slice group's copy (update "master": fp32,
                       twice the 16-bit bytes). Nothing else: the slice group all-gathers
                       a resident block into a block buffer as it does an uploaded one,
                       and the update of the shard (slice_update) draws its z into the
                       z buffer, which holds a whole block
    working block, z   n x c each
    resident clean     r x p (update "master": the fp32 masters)
    resident work, z   r x c each
    rounding scratch   update "stochastic": SR_SCRATCH x min(sr_chunk, largest tensor) x 4
    lowrank tile       estimator lowrank with a 16-bit compute dtype or the update on the
                       slice: the largest tile of U V^T in fp32 (zoplan.estimators.largest_tile;
                       made at its first use), and on CUDA the slice update's own
    slice update       CUDA with Layout.slice_update (slices > 1): the collective stream
                       updates the rank's slice while the compute stream works, so it
                       has its own z of a slice (stride / slices x c), a z chunk for
                       the chunks a slice's edges cut (min(z_chunk, largest block
                       tensor) x c) and, update "stochastic", its own rounding scratch
    cuBLAS workspace   CUDA: 32 MiB, from torch's allocator at the first GEMM
  held through a step
    token ids          t x 8;  hidden states  streams x t x hidden x c
    block context      streams x (seq x 8 position ids [+ Llama/Qwen3 cos, sin: 2 x seq x head_dim x c])
  the largest transient, on top of the above (one at a time)
    set-up     while the model is moved to the device and bound: the module's own copies
               of the resident parts (r x c) and of block 0 (n x c) beside the buffers
    update     the estimator's draw of d (zoplan.estimators; lowrank: U and V of the
               largest matrix, sparse: a chunk's |weights| and mask or a threshold's
               sample), or on rank 0's first update of block 0, the check of what the update did
               (a copy of up to 2^20 weights beside it, then 3 byte masks); 16-bit z
               added to fp32 on the CPU: the kernel's fp32 copy of z (stochastic: 4
               bytes an element of one chunk; fp32 masters with 16-bit compute: 8 bytes
               an element of the block, the result being made in fp32 too). The
               stochastic rounding itself works in place on its scratch (no temporaries)
    forward    ModelSpec.block_activation_bytes: one stream's block forward (CPU, fp32
               masters with 16-bit compute, role "+-": the second perturbation's kernel
               scratch, 8 bytes an element, if larger)
    head       ModelSpec.head_activation_bytes (likewise for the resident parts)
    embed      the embeddings' temporaries, or the resident parts' update
  outside torch's allocator (CUDA only): the NCCL communicators' buffers.
Terms marked kernel=True are scratch inside one CPU kernel call, not a live tensor
(rank_memory(kernel_scratch=False) leaves them out: what zoexec.runtime.memtrack's tracker
sees). Tensors under 1 KiB (the fence token, the loss vector) are left out.

LoRA (Workload.tuning "lora"): the base block is used in its buffer (no working block,
no z of a block), the resident parts are held once in the compute dtype, and the rank
holds every block's fp32 adapters, one block's working adapters and their z
(_lora_held); no update transient (a block's adapters are a few MB).

The host of one node: zoplan.hostmemory.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from zoplan.estimators import factor_numel, largest_tile, sample_numel, stream_examples
from zoplan.execrules import SR_SCRATCH, sr_chunk, z_chunk
from zoplan.layout import Layout
from zoplan.lora import ADAPTER_BYTES, adapter_params, linear_shapes
from zoplan.models import ModelSpec, dtype_bytes
from zoplan.prefix import prefix_params
from zoplan.workload import Workload

GIB = 2**30
MIB = 2**20
ALIGN_ELEMENTS = 64          # zoexec.store.blocks: every slice / share starts on a 64-element boundary
LOST_UPDATE_SAMPLE = 1 << 20   # zoexec.model.precision.SAMPLE: weights the first-update check copies
CPU_CAST_BYTES = 8           # fp32 + 16-bit -> 16-bit `out` on the CPU: z cast to fp32 (4) and
                             # the fp32 result (4), inside the kernel [torch profiler, measured]

# NCCL's buffers live outside torch's allocator, one set per communicator a rank joins
# [D]: NVIDIA/nccl#964 measured through PyTorch on 4x A100 with NVLink, a 4 MB
# all-reduce per group: +544 MB for a 2-rank communicator, +688 MB for 3-4 ranks. NCCL
# 2.22+ connects lazily, so this is what the collectives zoexec runs (all-reduce,
# all-gather) can cost, not a floor. A group of one rank is not counted (zoexec runs no
# collective on it).
NCCL_COMM_BYTES_PAIR = 544 * MIB
NCCL_COMM_BYTES_GROUP = 688 * MIB
# torch's cuBLAS workspace, from its caching allocator, one per (handle, stream) that
# runs GEMMs (zoexec: the compute stream) [D]: torch's default CUBLAS_WORKSPACE_CONFIG
# is :4096:8 = 32 MiB on Hopper, 8.1 MiB on older GPUs; the larger is counted.
CUBLAS_WORKSPACE_BYTES = 32 * MIB
DEVICE_KINDS = ("cuda", "cpu")
AFTER_SETUP = {"cublas_workspace", "lowrank_tile", "slice_lowrank_tile"}   # held terms that
                                     # appear after Trainer._allocate (at their first use)


def fmt_bytes(num_bytes: float) -> str:
    """GiB with one decimal; MiB / KiB for what would read 0.0 GiB."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if num_bytes >= 0.1 * size or unit == "KiB":
            return f"{num_bytes / size:.1f} {unit}"
    raise AssertionError("unreachable")


def store_stride(block_numel: int, *, slices: int, local_ranks: int) -> int:
    """Elements per block in the node's store (zoexec.store.node lays it out): block_numel
    rounded up so that it splits into `slices` and into `local_ranks` equal, aligned
    pieces."""
    unit = math.lcm(slices, local_ranks) * ALIGN_ELEMENTS
    return -(-block_numel // unit) * unit


@dataclass(frozen=True, kw_only=True)
class Term:
    """One allocation: a key, its bytes and what it is, for messages."""

    key: str
    bytes: int
    label: str
    kernel: bool = False     # inside one kernel call, not a live tensor


def _sum(terms: Iterable[Term]) -> int:
    return sum(t.bytes for t in terms)


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """The device bytes of one rank: `held` (set-up to the end), `step` (through a
    step), the transient of each phase on top of both (`setup` is a whole of its own:
    nothing of a step exists then), and `outside` torch's allocator."""

    held: tuple[Term, ...]
    step: tuple[Term, ...]
    transients: dict[str, tuple[Term, ...]]
    setup: tuple[Term, ...]
    outside: tuple[Term, ...]

    def phase_bytes(self, phase: str) -> int:
        """What torch has allocated at the peak of `phase` ("setup" or a transient)."""
        if phase == "setup":   # the buffers Trainer._allocate keeps exist by its end
            return max(_sum(self.setup), _sum(self._allocated_at_setup()))
        return self.steady_bytes + _sum(self.transients[phase])

    def _allocated_at_setup(self) -> list[Term]:
        return [t for t in self.held if t.key not in AFTER_SETUP]

    @property
    def phases(self) -> list[str]:
        return ["setup", *self.transients]

    @functools.cached_property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def allocated_bytes(self) -> int:
        """Peak of what torch allocates (what a tracker or max_memory_allocated sees)."""
        return self.phase_bytes(self.peak_phase)

    @functools.cached_property
    def steady_bytes(self) -> int:
        """What stays allocated through a step, between its transients (cached, as
        peak_phase: the search asks for them again and again; the terms are frozen)."""
        return _sum(self.held) + _sum(self.step)

    @property
    def total_bytes(self) -> int:
        """The device memory the rank needs: torch's peak + NCCL's buffers."""
        return self.allocated_bytes + _sum(self.outside)

    def peak_terms(self) -> list[Term]:
        """The terms alive at the peak; they sum to total_bytes."""
        phase = self.peak_phase
        if phase == "setup":
            return [*max(self.setup, self._allocated_at_setup(), key=_sum), *self.outside]
        return [*self.held, *self.step, *self.transients[phase], *self.outside]

    def dominant(self) -> Term:
        return max(self.peak_terms(), key=lambda t: t.bytes)


# ---- the device of one rank -------------------------------------------------------------
def rank_memory(*, model: ModelSpec, workload: Workload, layout: Layout, device_kind: str,
                kernel_scratch: bool = True, resident_blocks: int = 0) -> RankMemory:
    """The device bytes of rank 0 of `layout` on a `device_kind` device (every rank
    alike, but for the check of the first update, which rank 0 alone runs).
    `kernel_scratch` False leaves out what CPU kernels allocate and free inside one call
    (no live tensor: what zoexec.runtime.memtrack.AllocationTracker measures).
    `resident_blocks`: how many blocks the rank keeps a shard of (placement "resident")."""
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device_kind must be one of {', '.join(DEVICE_KINDS)}, got {device_kind!r}")
    if not 0 <= resident_blocks <= model.num_layers:
        raise ValueError(f"resident_blocks must be 0..{model.num_layers}, got {resident_blocks}")
    lora = workload.frozen_base
    held = (_lora_held if lora else _held)(model, workload, layout, device_kind)
    setup = (_lora_setup if lora else _setup)(model, workload, layout, device_kind)
    if resident_blocks:   # made last in set-up (Trainer._allocate_shards), once the
        # module copies are gone: held, so in set-up's end (RankMemory.phase_bytes)
        held.insert(1, _shards(model, workload, layout, resident_blocks))
    step, transients = _stream_terms(model, workload, Layout(pertp=layout.pertp, ddp=layout.ddp),
                                     device_kind, kernel=kernel_scratch)
    return RankMemory(held=tuple(held), step=step, transients=dict(transients),
                      setup=tuple(setup),
                      outside=tuple(_outside(layout, device_kind)))


@functools.lru_cache(maxsize=1024)
def _stream_terms(model: ModelSpec, workload: Workload, shards: Layout, device_kind: str, *,
                  kernel: bool) -> tuple[tuple[Term, ...], dict[str, tuple[Term, ...]]]:
    """(step, transients) of rank_memory: they depend on the layout only through its
    perturbation and data degrees (_tokens, the rank's rows), so `shards` is a layout
    of those two alone (cached: a search prices thousands of layouts over a few dozen
    (pertp, ddp); tuples, and rank_memory copies the dict, so nothing shared changes)."""
    lora = workload.frozen_base
    step = _step(model, workload, shards)
    transients = {
        "update": [] if lora else _update(model, workload, device_kind, kernel=kernel),
        "forward": (_lora_forward(model, workload, shards) if lora else
                    _forward(model, workload, shards, device_kind, kernel=kernel)),
        "head": _head(model, workload, shards, device_kind, kernel=kernel),
        "embed": _embed(model, workload, shards, device_kind, step, kernel=kernel),
    }
    return tuple(step), {phase: tuple(terms) for phase, terms in transients.items()}


def _sizes(model: ModelSpec, workload: Workload) -> tuple[int, int, int, int]:
    return (model.block_params, model.resident_params, dtype_bytes(workload.param_dtype),
            dtype_bytes(workload.compute_dtype))


def _buffers(model: ModelSpec, workload: Workload, layout: Layout) -> Term:
    return _buffers_term(model, workload.param_dtype, max(1, min(layout.prefetch, model.num_layers)),
                         layout.slices, layout.local_ranks)


@functools.lru_cache(maxsize=1024)
def _buffers_term(model: ModelSpec, param_dtype: str, count: int, slices: int,
                  local_ranks: int) -> Term:
    """`count` block buffers, each a block as the node's store lays it out (cached:
    asked for twice a layout, and many layouts share their buffers)."""
    stride = store_stride(model.block_params, slices=slices, local_ranks=local_ranks)
    one = stride * dtype_bytes(param_dtype)
    return Term(key="block_buffers", bytes=count * one,
                label=f"{count} x {fmt_bytes(one)} block buffers")


def resident_shard_bytes(model: ModelSpec, workload: Workload, layout: Layout) -> int:
    """Device bytes of one rank's shard of one resident block: 1/slices of the block as
    the store lays it out (store_stride), in the stored precision."""
    stride = store_stride(model.block_params, slices=layout.slices,
                          local_ranks=layout.local_ranks)
    return stride // layout.slices * dtype_bytes(workload.param_dtype)


def _shards(model: ModelSpec, workload: Workload, layout: Layout, count: int) -> Term:
    one = resident_shard_bytes(model, workload, layout)
    share = f"1/{layout.slices} of a block" if layout.slices > 1 else "whole blocks"
    return Term(key="resident_shards", bytes=count * one,
                label=f"{count} resident block shards ({share}, {fmt_bytes(one)} each)")


@functools.lru_cache(maxsize=256)
def _working(model: ModelSpec, workload: Workload) -> tuple[Term, ...]:
    """The working block, its z and the resident parts' three copies (cached: the same
    for every layout)."""
    n, r, p, c = _sizes(model, workload)
    return (Term(key="work_block", bytes=n * c, label="perturbed working block"),
            Term(key="z_block", bytes=n * c, label="z of a block"),
            Term(key="resident_clean", bytes=r * p,
                 label=f"resident parts, clean ({workload.param_dtype})"),
            Term(key="resident_work", bytes=r * c, label="resident parts, perturbed"),
            Term(key="resident_z", bytes=r * c, label="resident parts, z"))


def _held(model: ModelSpec, workload: Workload, layout: Layout, device_kind: str) -> list[Term]:
    terms = [_buffers(model, workload, layout), *_working(model, workload)]
    if device_kind == "cuda":   # from torch's allocator at the first GEMM, kept
        terms.append(Term(key="cublas_workspace", bytes=CUBLAS_WORKSPACE_BYTES,
                          label="cuBLAS workspace"))
    scratch = _rounding_scratch(model, device_kind) if workload.update == "stochastic" else None
    if scratch is not None:
        terms.append(scratch)
    if device_kind == "cuda" and layout.slice_update and layout.slices > 1:
        stride = store_stride(model.block_params, slices=layout.slices,
                              local_ranks=layout.local_ranks)
        numel = stride // layout.slices
        c = dtype_bytes(workload.compute_dtype)
        terms.append(Term(key="slice_z", bytes=numel * c,
                          label="z of a slice (slice update, collective stream)"))
        edge = min(z_chunk(device_kind), max(model.block_tensor_numels()))
        terms.append(Term(key="slice_z_edge", bytes=edge * c,
                          label="z chunk cut by a slice's edge (slice update)"))
        if scratch is not None:
            terms.append(Term(key="slice_rounding_scratch", bytes=scratch.bytes,
                              label="stochastic rounding scratch of the slice update"))
    split = layout.slice_update and layout.slices > 1
    return terms + list(_estimator_held(model, workload, split, device_kind))


@functools.lru_cache(maxsize=256)
def _rounding_scratch(model: ModelSpec, device_kind: str) -> Term:
    """Stochastic rounding's fp32 scratch, a chunk of the largest tensor (cached)."""
    size = min(sr_chunk(device_kind), max(model.block_tensor_numels()
                                          + model.resident_tensor_numels()))
    return Term(key="rounding_scratch", bytes=SR_SCRATCH * size * 4,
                label=f"stochastic rounding scratch ({SR_SCRATCH} x {size:,} fp32)")


@functools.lru_cache(maxsize=256)
def _estimator_held(model: ModelSpec, workload: Workload, split: bool,
                    device_kind: str) -> tuple[Term, ...]:
    """lowrank: the fp32 tile a 16-bit d, or a tile a slice cuts (`split`: the slice
    update of a slice group), is computed in (zoexec.maths.estimators.Directions; the
    slice update's own on CUDA). Cached: it depends on the layout through `split` alone."""
    spec, chunk = workload.estimator_spec, z_chunk(device_kind)
    if spec.estimator != "lowrank" or (workload.compute_dtype == "fp32" and not split):
        return ()
    shapes = model.block_tensor_shapes() + model.resident_tensor_shapes()
    tile = largest_tile(shapes, chunk)
    terms = [Term(key="lowrank_tile", bytes=4 * tile, label=f"lowrank tile ({tile:,} fp32)")]
    if split and device_kind == "cuda":
        tile = largest_tile(model.block_tensor_shapes(), chunk)
        terms.append(Term(key="slice_lowrank_tile", bytes=4 * tile,
                          label="lowrank tile of the slice update"))
    return tuple(terms)


def estimator_transient(workload: Workload, shapes: list[tuple[int, ...]],
                        device_kind: str, *, stored_bytes: int | None = None) -> list[Term]:
    """What drawing d of these tensors allocates and frees (zoexec.maths.estimators):
    lowrank, U and V of the largest matrix (fp32); sparse, the |weights| of a chunk and
    its mask, or the sample a threshold is taken over, whichever is larger."""
    spec = workload.estimator_spec
    if spec.estimator == "lowrank":
        numel = factor_numel(shapes, spec.lowrank_rank)
        return [Term(key="lowrank_factors", bytes=4 * numel,
                     label=f"lowrank U and V of the largest matrix ({numel:,} fp32)")]
    if spec.estimator != "sparse" or not shapes:
        return []
    p = stored_bytes or dtype_bytes(workload.param_dtype)
    numels = [math.prod(s) for s in shapes]
    chunk = min(z_chunk(device_kind), max(numels))
    sample = sample_numel(max(numels)) * (p + (4 if p != 4 else 0))
    return [Term(key="sparse_mask", bytes=max(chunk * (p + 1), sample),
                 label="sparse: |weights| and mask of a chunk, or a threshold's sample")]


def _tokens(workload: Workload, layout: Layout) -> tuple[int, int]:
    """(tokens of one stream, perturbation streams the rank runs side by side): one a
    sign (two for role "+-") per direction that meets the rank's rows, each on its
    part of them (zoplan.estimators.stream_examples)."""
    signs = 2 if layout.pertp == 1 else 1
    parts, examples = stream_examples(examples=workload.batch, directions=workload.directions,
                                      num_shards=layout.ddp)
    return examples * workload.rows_per_example * workload.seq, signs * parts


def _step(model: ModelSpec, workload: Workload, layout: Layout) -> list[Term]:
    tokens, streams = _tokens(workload, layout)
    rank_tokens = workload.batch // layout.ddp * workload.rows_per_example * workload.seq
    c, seq = dtype_bytes(workload.compute_dtype), workload.seq
    ctx = seq * 8 + (2 * seq * model.head_dim * c if model.rotary else 0)
    return [Term(key="token_ids", bytes=rank_tokens * 8, label=f"token ids ({rank_tokens} tokens)"),
            Term(key="hidden_states", bytes=streams * tokens * model.hidden * c,
                 label=f"hidden states ({streams} x {tokens} tokens)"),
            Term(key="block_context", bytes=streams * ctx,
                 label="positions" + (" and rotary cos, sin" if model.rotary else ""))]


def kernel_scratch_terms(workload: Workload, device_kind: str, numels: list[int], numel: int,
                         what: str) -> list[Term]:
    """What the CPU kernels of an update allocate and free inside one call (kernel=True:
    no live tensor, so zoexec.runtime.memtrack's tracker cannot see it; kernel_peak_bytes can).
    TensorIterator's CPU path casts a 16-bit z to fp32 before adding it to fp32 (the
    stochastic rounding's chunk: 4 bytes an element), and with fp32 masters and a 16-bit
    working copy also computes the result in fp32 before the cast (8 bytes an element).
    CUDA casts inside the kernel: nothing."""
    if device_kind != "cpu" or workload.compute_dtype == "fp32":
        return []
    if workload.update == "stochastic":
        chunk = min(sr_chunk(device_kind), max(numels))
        return [Term(key="kernel_scratch", bytes=4 * chunk, kernel=True,
                     label=f"fp32 copy of a z chunk inside the {what} (CPU kernel)")]
    if workload.update == "master":
        return [Term(key="kernel_scratch", bytes=CPU_CAST_BYTES * numel, kernel=True,
                     label=f"fp32 temporaries of the {what}'s mixed-precision passes (CPU kernel)")]
    return []


def _update(model: ModelSpec, workload: Workload, device_kind: str, *,
            kernel: bool) -> list[Term]:
    """The deferred update and perturbation of one block; on rank 0's first update of
    block 0, beside it, the check of what it did (zoexec.model.precision.LostUpdates: a copy
    of the first weights, then three byte masks)."""
    n, p = model.block_params, dtype_bytes(workload.param_dtype)
    scratch = kernel_scratch_terms(workload, device_kind, model.block_tensor_numels(), n,
                              "update") if kernel else []
    sample = min(LOST_UPDATE_SAMPLE, n)
    masks = Term(key="update_check_masks", bytes=3 * sample,
                 label=f"first-update check, masks ({sample:,} weights)")
    copy = Term(key="update_check_copy", bytes=sample * p,
                label=f"first-update check, copy (rank 0, {sample:,} weights)")
    drawing = estimator_transient(workload, model.block_tensor_shapes(), device_kind)
    return max([copy, *max(scratch, [masks], key=_sum)], drawing, key=_sum)


def _forward(model: ModelSpec, workload: Workload, layout: Layout, device_kind: str, *,
             kernel: bool) -> list[Term]:
    """One stream's block forward, or (role "+-") the second perturbation between the
    two streams' forwards."""
    tokens, streams = _tokens(workload, layout)
    act = [Term(key="block_activations", bytes=model.block_activation_bytes(
        tokens, workload.seq, workload.compute_dtype), label=f"one block's forward ({tokens} tokens)")]
    if workload.directions > 1:   # d of the next direction drawn between the forwards
        act = max(act, estimator_transient(workload, model.block_tensor_shapes(), device_kind),
                  key=_sum)
    if streams == 1 or not kernel or workload.update != "master":
        return act
    scratch = kernel_scratch_terms(workload, device_kind, [], model.block_params, "perturbation")
    return max(act, scratch, key=_sum)


def _head(model: ModelSpec, workload: Workload, layout: Layout, device_kind: str, *,
          kernel: bool) -> list[Term]:
    """The head of one stream, or (role "+-") the resident parts' second perturbation."""
    tokens, streams = _tokens(workload, layout)
    act = [Term(key="head_activations",
                bytes=model.head_activation_bytes(tokens, workload.compute_dtype),
                label=f"head: logits and fp32 log-softmax ({tokens} tokens)")]
    if workload.directions > 1:
        act = max(act, estimator_transient(workload, model.resident_tensor_shapes(),
                                           device_kind), key=_sum)
    if streams == 1 or not kernel or workload.update != "master":
        return act
    scratch = kernel_scratch_terms(workload, device_kind, [], model.resident_params,
                              "resident perturbation")
    return max(act, scratch, key=_sum)


def _embed(model: ModelSpec, workload: Workload, layout: Layout, device_kind: str,
           step: list[Term], *,
           kernel: bool) -> list[Term]:
    """The embeddings' temporaries, or the resident parts' update and perturbation
    (before any hidden state exists), whichever is larger."""
    tokens, _ = _tokens(workload, layout)
    c, seq, h = dtype_bytes(workload.compute_dtype), workload.seq, model.hidden
    if not model.rotary:
        wdim = model.word_embed_proj_dim or h
        temps = (tokens * max(wdim, h) + (tokens * h if wdim != h else 0) + seq * h) * c
    else:
        temps = 4 * seq * model.head_dim * 4       # rotary angles in fp32
    embed = [Term(key="embed_temporaries", bytes=temps, label="embedding temporaries")]
    scratch = kernel_scratch_terms(workload, device_kind, model.resident_tensor_numels(),
                              model.resident_params, "resident update") if kernel else []
    state = _sum(t for t in step if t.key != "token_ids")
    drawing = estimator_transient(workload, model.resident_tensor_shapes(), device_kind)
    if drawing and drawing[0].bytes - state > max(temps, scratch[0].bytes - state if scratch
                                                  else 0):
        return [Term(key=drawing[0].key, bytes=drawing[0].bytes - state,
                     label=drawing[0].label + " (resident parts, before any hidden state)")]
    if scratch and scratch[0].bytes - state > temps:
        return [Term(key="kernel_scratch", bytes=scratch[0].bytes - state, kernel=True,
                     label=scratch[0].label)]
    return embed


def _setup(model: ModelSpec, workload: Workload, layout: Layout,
           device_kind: str) -> list[Term]:
    """Trainer._allocate's peak: the buffers, then the module's copies of block 0 and
    of the resident parts (parts.to(device)) until the flat buffers replace them. On the
    CPU the clean resident copy is the host master itself, there from the start."""
    n, r, p, c = _sizes(model, workload)
    buffers, work, z, clean, work_r, z_r = _buffers(model, workload, layout), *_working(model, workload)
    module_block = Term(key="module_block", bytes=n * c, label="block module's own copy (set-up)")
    module_res = Term(key="module_resident", bytes=r * c,
                      label="resident module's own copy (set-up)")
    first = [module_block, module_res] + ([clean] if device_kind == "cpu" else [])
    second = [module_res, clean, work_r, z_r]
    return [buffers, work, z, *max(first, second, key=_sum)]


# ---- LoRA and prefix (Workload.frozen_base; zoexec.train.lora, zoexec.train.prefix) ------
def _adapters(model: ModelSpec, workload: Workload) -> int:
    """One block's trained elements: LoRA's adapters or the prefix's keys and values."""
    if workload.is_prefix:
        return prefix_params(model, tokens=workload.prefix_tokens)
    return adapter_params(model, r=workload.lora_r, targets=workload.lora_targets)


def _lora_held(model: ModelSpec, workload: Workload, layout: Layout,
               device_kind: str) -> list[Term]:
    """The block buffers (the base block is used where it lands: stored as it computes),
    the frozen resident parts once (compute dtype: nothing perturbs them), every block's
    fp32 adapters, one block's working adapters (compute dtype) and their fp32 z."""
    a, r, c = _adapters(model, workload), model.resident_params, dtype_bytes(workload.compute_dtype)
    what = "prefixes" if workload.is_prefix else "LoRA adapters"
    terms = [_buffers(model, workload, layout),
             Term(key="resident_work", bytes=r * c, label="resident parts (frozen)"),
             Term(key="adapters", bytes=model.num_layers * a * ADAPTER_BYTES,
                  label=f"{what}, every block ({model.num_layers} x {a:,} fp32)"),
             Term(key="adapter_work", bytes=a * c, label=f"perturbed {what} of a block"),
             Term(key="adapter_z", bytes=a * ADAPTER_BYTES, label=f"z of a block's {what}")]
    if device_kind == "cuda":
        terms.append(Term(key="cublas_workspace", bytes=CUBLAS_WORKSPACE_BYTES,
                          label="cuBLAS workspace"))
    return terms


def _lora_setup(model: ModelSpec, workload: Workload, layout: Layout,
                device_kind: str) -> list[Term]:
    """Set-up: the buffers and the modules' own copies of block 0 and of the resident
    parts, before the flat buffers replace them."""
    n, r, _, c = _sizes(model, workload)
    return [_buffers(model, workload, layout),
            Term(key="module_block", bytes=n * c, label="block module's own copy (set-up)"),
            Term(key="module_resident", bytes=r * c,
                 label="resident module's own copy (set-up)")]


def _lora_forward(model: ModelSpec, workload: Workload, layout: Layout) -> list[Term]:
    """One stream's block forward, plus what an adapted module holds beside it: A x
    and the scaled B (A x) of the largest target; with a prefix, the keys and values
    joined to the prefix's (the input's and the prefix's, for every row)."""
    tokens, _ = _tokens(workload, layout)
    c = dtype_bytes(workload.compute_dtype)
    if workload.is_prefix:
        rows = tokens / workload.seq
        extra = int(2 * rows * (workload.seq + workload.prefix_tokens) * model.kv_dim * c)
        return [Term(key="block_activations", bytes=model.block_activation_bytes(
                    tokens, workload.seq, workload.compute_dtype),
                     label=f"one block's forward ({tokens} tokens)"),
                Term(key="adapter_activations", bytes=extra,
                     label="keys and values joined to the prefix's")]
    widest = max(out for name, (_, out) in linear_shapes(model).items()
                 if name in workload.lora_targets)
    extra = tokens * (workload.lora_r + 2 * widest) * c
    return [Term(key="block_activations", bytes=model.block_activation_bytes(
                tokens, workload.seq, workload.compute_dtype),
                 label=f"one block's forward ({tokens} tokens)"),
            Term(key="adapter_activations", bytes=extra, label="an adapter's forward")]


def nccl_groups(layout: Layout) -> list[int]:
    """Sizes of the NCCL communicators a rank joins (zoexec.runtime.groups._build_groups): the
    world, its slice group and its node group, each only where it is not the world
    itself (a group of the whole world is the world group); the host groups are gloo.
    Groups of one rank run no collective and are left out."""
    world = layout.world_size
    sizes = [world] + [s for s in (layout.slices, layout.local_ranks) if 1 < s < world]
    return [s for s in sizes if s > 1]


def _outside(layout: Layout, device_kind: str) -> list[Term]:
    if device_kind != "cuda":
        return []
    groups = nccl_groups(layout)
    nccl = sum(NCCL_COMM_BYTES_PAIR if s == 2 else NCCL_COMM_BYTES_GROUP for s in groups)
    if not nccl:
        return []
    return [Term(key="nccl", bytes=nccl, label=f"NCCL buffers ({len(groups)} communicator"
                                                   f"{'s' if len(groups) != 1 else ''}, [D])")]
