"""One rank of `zoexec run`: the plan's step schedule, block by block, step by step.

Per step t with seed s_t (zo.step_seed) on every rank, in program order:
  embed      apply step t-1's deferred update to the resident parts (embeddings, final
             norm, LM head: z block -1), draw their z for s_t, build the perturbed
             resident weights and embed the rank's shard once per perturbation.
  per block b (prefetch buffers, taken in turn by the blocks that use one):
    h2d        copy this rank's slice (1/slices) of block b from the node's shared store
               into the rank's block buffer (on CUDA: async DMA from the page-locked
               store, or through pinned staging slots)
    slice_update  Layout.slice_update with slices > 1: apply step t-1's deferred update
               to the rank's own slice only (z drawn for its 1/slices of the block,
               zo.z_range), bit for bit what the whole block's update gives there
    allgather  the slice group gathers the whole block (skipped when slices == 1)
    [fence]    every local rank has read block b (only when slices < local ranks; the
               all-gather orders it otherwise). CUDA: a node-local all-reduce of a token
               after the h2d; CPU: no collective, a wait on the node's shared read
               stamps right before d2h (zoexec.store.fence), not recorded as a task
    update     apply step t-1's deferred update (regenerating its z; not with
               slice_update, done already), then draw z for s_t and build
               theta + sign*eps*z of the first perturbation in the working buffer the
               block module is bound to
    forward    the block on each perturbation's activations ("+-": both, the second
               perturbation built from the clean theta first; PertP: one)
    d2h        write this rank's 1/local_ranks share of the updated block back
  head       final norm + LM head at the positions the loss looks at + the summed
             loss per perturbation (zoexec.model.heads; resident weights rebuilt)
  allreduce  [sum l+, sum l-, count] over the world: PertP exchange and DDP sum in
             one; l+- = sum / count, the mean over the global batch's labelled tokens
             (the candidate loss: its examples) whatever the layout
Then g = (l+ - l-) / (2 eps) is known on every rank and becomes the pending update.
After the last step (and before a snapshot or an evaluation) a flush pass applies it:
offloaded blocks h2d, [slice_update], allgather, update, d2h; resident ones with
slice_update only their slice update (the shard is all they hold), without it
allgather and update (slices 1: the update in place).
Evaluation (`evaluate`) is a pass of the same pipeline on the clean weights: h2d or the
resident shard, allgather, forward, no update, no write-back (pending updates are
flushed first).

Resident blocks (plan placement "resident", Plan.resident_blocks): each rank keeps its
slice (1/slices, the store's padded layout) of the block in its own device memory
(CPU: the rank's memory), filled from the node's store when the Trainer starts and
updated in place; no h2d, no fence, no d2h. With slices > 1 the slice group
all-gathers the shards into a block buffer as it does uploaded slices ([slice_update]
on the shard, allgather, update, forward), and without slice_update the update task
also copies the rank's slice of the updated block back into its shard; with slices 1
the shard is the whole block (every rank its own copy), updated and perturbed in
place without a buffer (update, forward). The store keeps a resident block's slot:
loading fills the shards from it, and saving writes the node's first slice group's
shards back into it (Trainer.store_shards), so snapshots, final/ and resume treat every
block alike and rank 0 never holds a resident block beside the store.

z is therefore drawn TWICE per block per step (update of t-1, perturbation of t), or
1 + 1/slices times with slice_update, never stored, and addressed by (seed, block,
tensor, chunk) only (zoexec.maths.zo), so every layout, placement and slice_update setting
computes the same maths. The plan's estimator (zoplan.estimators) draws its direction d
in place of z (zoexec.maths.estimators: lowrank, sparse), and with q directions a step
the rank's forwards are streams (direction, sign, its part of the shard): the update
task draws the first stream's direction, the forward and head tasks each further
one, the deferred update applies every direction's share, and the loss all-reduce
carries [l+, l-, count] per direction. Each step's StepRecord (seed, g, losses) is known on every
rank; seed replay = running the update half of the schedule over a log.

With --zo-kernel counter or fused (zoexec.maths.paths, .counter, .fused) no z is drawn
into a buffer: the update task's pending updates and the first perturbation are one
counter pass over the block (z regenerated per element from its address), each further
perturbation is another, the slice update one over the slice; the estimator is mezo
(lowrank, sparse, LoRA and prefix run on the torch path).

On CUDA the lanes are streams and the host only enqueues: h2d of block b+1 runs
while block b computes, limited by the buffers; the slice update runs on the
collective stream (zoplan.trace.KIND_LANE) with its own z of a slice, chunk scratch and
rounding scratch; on the CPU every task runs at once in exactly the order above.

`Trainer` holds a rank's state (buffers, shards, pending updates) and runs the step,
the flush and the evaluation; its parts live beside it by concern: the step's streams,
batches, embedding and head (zoexec.train.streams.StreamEnds), the pass over the
blocks (zoexec.train.blocks.BlockPipeline) and the ZO maths of a block, its draws,
deferred updates and perturbation (zoexec.train.updates.ZoUpdates).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from zoexec.config import RunConfig
from zoexec.data.batch import Batch
from zoexec.maths.history import StepRecord, Update
from zoexec.maths.zo import RESIDENT_BLOCK, projected_grad, step_seed
from zoexec.model import heads
from zoexec.model.families import ModelParts, bind_block, bind_resident, resident_flat
from zoexec.model.precision import LostUpdates
from zoexec.runtime import groups as zgroups
from zoexec.runtime.errors import failing
from zoexec.store.blocks import BlockStore
from zoexec.store.fence import ReadFlags
from zoexec.store.node import store_staging
from zoexec.train.blocks import BlockPipeline, _wait
from zoexec.train.speed import SpeedMonitor
from zoexec.train.state import BatchSource, Lanes
from zoexec.train.streams import SIGNS, StreamEnds, rank_streams
from zoexec.train.updates import ZoUpdates
from zoexec.train.zokernel import zo_kernel_of, zo_pass_fn
from zoplan.errors import ZoError
from zoplan.execrules import fence_needed, z_chunk
from zoplan.plan import Plan

Pending = Update   # a deferred update: step, seed, projected gradient(s), learning rate
# An evaluation's figures per row from the hidden states leaving the last block
# (zoexec.model.heads.row_scores, zoexec.train.generate.next_tokens)
RowHead = Callable[[ModelParts, torch.Tensor, Batch], torch.Tensor]
# state.json of saved weights as a function of the folder written so far (the
# checksums of its files: zoexec.run.loop; the frozen-base trainers' `save`)
SavedState = Callable[[Path], dict[str, object]]


# ---- the training loop ---------------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Trainer(StreamEnds, BlockPipeline, ZoUpdates):
    """The step loop of one rank over its device buffers (see the module docstring).
    `pending` is the deferred update; `history` the StepRecords, the same on all ranks."""

    cfg: RunConfig
    env: zgroups.DistEnv
    parts: ModelParts
    store: BlockStore
    source: BatchSource | None          # None: evaluation only (no step)
    lanes: Lanes
    pending: tuple[Pending, ...] = ()   # deferred updates, applied in order at the next pass
    flags: ReadFlags | None = None      # CPU write-back fence (share_read_flags)
    passes: int = 0                     # block passes so far: the fence's stamp
    speed: SpeedMonitor | None = None   # traced CPU runs: speed probes between steps

    writes_back: ClassVar[bool] = True   # False: a read-only store (zoexec.train.lora)

    def __post_init__(self) -> None:
        lay, rank = self.env.layout, self.env.rank
        self.signs = SIGNS[lay.role_of(rank)]
        self.data_shard, self.slice_index = lay.data_shard_of(rank), lay.slice_index_of(rank)
        wl = self.cfg.workload
        self.estimator = wl.estimator_spec
        self.streams = rank_streams(signs=self.signs, examples=wl.batch,
                                    directions=wl.directions, data_shard=self.data_shard,
                                    num_shards=lay.ddp)
        self.now = None   # (step, seed) of the step in progress
        self.fence_needed = self.writes_back and fence_needed(lay)
        # the update on the slice
        self.split = self.writes_back and lay.slice_update and lay.slices > 1
        if self.fence_needed and not self.env.is_cuda and self.flags is None:
            raise ZoError(f"{lay.local_ranks} local ranks with {lay.slices} slices on the "
                          f"CPU need the node's read stamps (share_read_flags)")
        self.rounding = LostUpdates(enabled=rank == 0, update=wl.update, lr=self.cfg.optim.lr,
                                    dtype=self.parts.param_dtype, quiet=not self.cfg.logging.progress)
        self.zo_kernel = zo_kernel_of(self.cfg, self.env.device)[0]
        self.zk = zo_pass_fn(self.zo_kernel)   # None: z drawn into buffers (torch)
        self.zk_kind = "stochastic" if wl.update == "stochastic" else "nearest"
        self._allocate()

    def _allocate(self) -> None:
        """Block buffers (param dtype, padded), the working block and z (compute dtype),
        the resident parts: clean theta (param dtype: the fp32 masters with update
        "master"), working copy and z (compute dtype), and the stochastic rounding's
        fp32 scratch. zoplan.memory models exactly these."""
        parts, dev, lay = self.parts, self.env.device, self.env.layout
        count = max(1, min(lay.prefetch, self.store.num_blocks))
        # not filled: each pass's h2d (or all-gather) writes a buffer whole, padding
        # included, before anything reads it (a fill here would run on the compute stream,
        # unordered with the h2d stream's first copy into it)
        self.bufs = [torch.empty(self.store.stride, dtype=parts.param_dtype, device=dev)
                     for _ in range(count)]
        self.work = torch.empty(parts.block_numel, dtype=parts.dtype, device=dev)
        zsize = 0 if self.zk else parts.block_numel   # the counter paths keep no z
        self.z = torch.empty(zsize, dtype=parts.dtype, device=dev)
        theta_r = parts.resident_master if parts.resident_master is not None \
            else resident_flat(parts)
        parts.to(dev)
        bind_block(parts, self.work)
        self.theta_r = theta_r.to(dev)                       # clean, stored precision
        self.work_r = self.theta_r.to(parts.dtype, copy=True)  # perturbed, compute precision
        self.z_r = torch.empty(0 if self.zk else self.work_r.numel(), dtype=parts.dtype,
                               device=dev)
        bind_resident(parts, self.work_r)
        self.scratch = self._update_scratch()
        self.dirs = self._directions()
        self.staging = store_staging(self.env, self.store)
        self.token = torch.zeros(1, device=dev)
        self._allocate_shards()

    def _allocate_shards(self) -> None:
        """The rank's shards of the resident blocks (stride / slices elements each,
        param dtype, filled from the node's store), and what the slice update of a CUDA
        rank needs beside the compute stream's buffers: z of a slice, a z chunk for the
        chunks a slice cuts (zo.z_range), rounding scratch. The CPU's slice update runs
        between the compute tasks and uses their z and scratch."""
        lay, dev, parts = self.env.layout, self.env.device, self.parts
        size = self.store.stride // lay.slices
        self.shards = {}
        for block in Plan(self.cfg.plan).resident_blocks:
            shard = torch.empty(size, dtype=parts.param_dtype, device=dev)
            shard.copy_(self.store.piece(block, self.slice_index, lay.slices))
            self.shards[block] = shard
        self.slice_z, self.slice_edge, self.slice_scratch = self.z, None, self.scratch
        self.slice_dirs = self.dirs
        if self.split and self.env.is_cuda and self.zk is None:
            self.slice_dirs = self._directions(shared=self.dirs)
            largest = max(s.numel for s in parts.block_specs)
            self.slice_z = torch.empty(size, dtype=parts.dtype, device=dev)
            self.slice_edge = torch.empty(min(z_chunk(dev.type), largest), dtype=parts.dtype,
                                          device=dev)
            self.slice_scratch = self._update_scratch()

    # ---- steps -----------------------------------------------------------------------
    def step(self, step: int, *, lr: float,
             flags: tuple[float, float] = (0.0, 0.0)) -> tuple[StepRecord, tuple[float, ...]]:
        """One training step: (its record, the world's sum of every rank's `flags`,
        exchanged in the loss all-reduce: zoexec.run.loop's stop and snapshot requests).
        The step's update becomes pending only when the loop says so (set_pending)."""
        if self.cfg.fail_at == (self.env.rank, step):
            raise RuntimeError(f"injected fault at step {step}")
        seed = step_seed(self.cfg.optim.seed, step)
        start = time.monotonic()
        batches = self._batches(step)   # copied while the device is idle, before the step's window
        self.now = (step, seed)
        self.lanes.begin_step(step)
        with self.lanes.task("embed"):
            acts = self._embed(seed, batches)
        last_d2h = self._blocks(seed, acts)
        with self.lanes.task("head") as head:
            vec = self._head(acts, batches, flags)
        with self.lanes.task("allreduce", after=(head.done, last_d2h)):
            if self.env.place.world_size > 1:   # a world of one already holds the sum
                _wait(dist.all_reduce(vec, group=self.env.world, async_op=True))
        self.lanes.end_step()
        self._settle_copies()
        self.rounding.settle()
        q = self.estimator.directions
        total = vec.tolist()
        sums = [total[3 * j:3 * j + 3] for j in range(q)]
        if not all(count for _, _, count in sums):
            raise ZoError(f"step {step + 1}: the batch has no labelled token (every label is "
                          f"ignored): nothing to train on")
        count = sum(c for _, _, c in sums)
        loss_plus, loss_minus = (sum(part[k] for part in sums) / count for k in (0, 1))
        eps = self.cfg.optim.eps
        gs = tuple(projected_grad(lp / c, lm / c, eps) for lp, lm, c in sums)
        g = gs[0] if q == 1 else sum(gs) / q
        elapsed = time.monotonic() - start
        record = StepRecord(step=step, seed=seed, loss_plus=loss_plus, loss_minus=loss_minus,
                            g=g, lr=lr, step_time_s=elapsed, gs=gs if q > 1 else (),
                            tokens_per_s=self.cfg.workload.tokens_per_step / elapsed)
        return record, tuple(total[3 * q:])

    def set_pending(self, record: StepRecord) -> None:
        """The step's update (if it has one: finite, not skipped) becomes the pending one."""
        update = record.update
        self.pending = (update,) if update else ()

    def replay(self, updates: Iterable[Update]) -> None:
        """Apply logged updates (zoexec.maths.history.Update, in step order) in one pass
        over the blocks: each block gets them in the order the run applied them. Whole
        blocks, also with the update on the slice (sparse's thresholds need a whole
        tensor; the bits are the slice update's)."""
        self.pending = tuple(updates)
        split, self.split = self.split, False
        try:
            self.flush()
        finally:
            self.split = split

    def flush(self) -> None:
        """Apply the pending updates to every block and the resident parts."""
        if not self.pending:
            return
        self.lanes.begin_step(self.cfg.optim.steps, record=False)
        with self.lanes.task("embed"):
            self._apply_pending(self.theta_r, RESIDENT_BLOCK, self.parts.resident_specs, self.z_r)
        self._blocks(None, None)
        self.lanes.end_step()
        self._settle_copies()
        self.rounding.settle()
        self.pending = ()
        with failing("flush", rank=self.env.rank):
            zgroups.host_barrier(self.env)

    # ---- evaluation --------------------------------------------------------------------
    def evaluate(self, batch: Batch, *, head: RowHead | None = None) -> torch.Tensor:
        """Per row of this rank's `batch` (zoexec.model.heads.row_scores, float64, on
        the CPU): [summed next-token CE over its labelled positions, their count], or
        with single-token candidates each candidate's log-probability at the row's
        answer position; computed with the clean weights (the pending updates applied first) through the same block
        pipeline as a step; `head(parts, hidden, batch)`: other figures per row
        (zoexec.train.generate.next_tokens). Every rank of the job must call it the same
        number of times (the slice groups gather each block); rows may differ per rank."""
        self.flush()
        self.lanes.begin_step(self.cfg.optim.steps, record=False)
        batch = batch.to(self.env.device)
        with self.lanes.task("embed"):
            self.work_r.copy_(self.theta_r)
            acts = [self._eval_embed(batch.ids)]
        self._blocks(None, acts)
        with self.lanes.task("head"):
            out = (head or heads.row_scores)(self.parts, acts[0][0], batch)
        self.lanes.end_step()
        self._settle_copies()
        return out.cpu()

    # ---- results -----------------------------------------------------------------------
    def clean_resident_cpu(self) -> torch.Tensor:
        return self.theta_r.to("cpu")

    def store_shards(self) -> None:
        """Before saving (collective on the node): the ranks of the node's first slice
        group write their resident shards into the store's slots of those blocks, so
        the store holds every block (zoexec.run.loop saves from it). Call after `flush`."""
        if not self.shards:
            return
        lay = self.env.layout
        if self.env.local_rank < lay.slices:
            for block, shard in self.shards.items():
                self.store.piece(block, self.slice_index, lay.slices).copy_(shard)
        with failing("shards", rank=self.env.rank):
            zgroups.host_barrier(self.env, node_only=True)
