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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist

from zoexec.config import RunConfig
from zoexec.data.batch import Batch, as_batch, shard
from zoexec.maths.counter import Perturb, Term, f32, terms_of
from zoexec.maths.estimators import Directions, direction_seed
from zoexec.maths.history import StepRecord, Update
from zoexec.maths.zo import (
    RESIDENT_BLOCK,
    apply_update,
    apply_update_stochastic,
    perturb_into,
    projected_grad,
    step_seed,
)
from zoexec.model import heads
from zoexec.model.families import bind_block, bind_resident, resident_flat
from zoexec.model.precision import LostUpdates
from zoexec.runtime import groups as zgroups
from zoexec.runtime.errors import LaneFailure, failing
from zoexec.store.blocks import BlockStore
from zoexec.store.fence import ReadFlags
from zoexec.store.node import store_staging
from zoexec.train.speed import SpeedMonitor
from zoexec.train.zokernel import zo_kernel_of, zo_pass_fn
from zoplan.errors import ZoError
from zoplan.estimators import direction_parts
from zoplan.execrules import SR_SCRATCH, fence_needed, sr_chunk, z_chunk
from zoplan.plan import Plan

SIGNS = {"+-": (1.0, -1.0), "+": (1.0,), "-": (-1.0,)}
Pending = Update   # a deferred update: step, seed, projected gradient(s), learning rate


@dataclass(frozen=True, kw_only=True)
class Stream:
    """One forward of a step on this rank: the direction it perturbs along, its sign,
    and its examples [first, stop) in the rank's data shard (all of it with one
    direction)."""

    direction: int
    sign: float
    first: int
    stop: int


CLEAN = (Stream(direction=0, sign=0.0, first=0, stop=0),)   # evaluation: no perturbation


def rank_streams(*, signs: tuple, examples: int, directions: int, data_shard: int,
                 num_shards: int) -> tuple[Stream, ...]:
    """The rank's forwards of a step: each direction whose part of the global batch
    meets the rank's shard (zoplan.estimators.direction_parts), with each sign of its
    role."""
    parts = direction_parts(examples=examples, directions=directions, data_shard=data_shard,
                            num_shards=num_shards)
    return tuple(Stream(direction=j, sign=sign, first=lo, stop=hi)
                 for j, lo, hi in parts for sign in signs)


# ---- the node's model: built once, shared ---------------------------------------------------


# ---- the training loop ---------------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Trainer:
    """The step loop of one rank over its device buffers (see the module docstring).
    `pending` is the deferred update; `history` the StepRecords, the same on all ranks."""

    cfg: RunConfig
    env: zgroups.DistEnv
    parts: object
    store: BlockStore
    source: object
    lanes: object
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

    def _directions(self, shared: Directions | None = None, specs=None) -> Directions:
        """The estimator's draws (zoexec.maths.estimators) for one lane of work, of the
        tensors of `specs` (default: a block's and the resident parts'; with `shared`, a
        block's), sparse thresholds shared with `shared`'s."""
        if specs is None:
            specs = self.parts.block_specs + ([] if shared else self.parts.resident_specs)
        return Directions(self.estimator, run_seed=self.cfg.optim.seed, device=self.env.device,
                          thresholds=shared.thresholds if shared is not None else None,
                          shapes=[s.shape for s in specs])

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
             flags: tuple[float, float] = (0.0, 0.0)) -> tuple[StepRecord, tuple]:
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
            raise ZoError(f"step {step}: the batch has no labelled token (every label is "
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

    def replay(self, updates) -> None:
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

    def _batches(self, step: int) -> list[Batch]:
        """Each stream's rows of the rank's shard of the step's batch, on the device (one
        batch for every stream with one direction; each part found on the host)."""
        wl = self.cfg.workload
        rows = as_batch(self.source.batch(step, wl.batch, wl.seq))
        mine = shard(rows, data_shard=self.data_shard, num_shards=self.env.layout.ddp)
        if self.estimator.directions == 1:
            return [mine.to(self.env.device)] * len(self.streams)
        k, parts = mine.per_example, {}
        for st in self.streams:
            if (st.first, st.stop) not in parts:
                parts[(st.first, st.stop)] = mine.select(st.first * k, st.stop * k).to(self.env.device)
        return [parts[(st.first, st.stop)] for st in self.streams]

    # ---- evaluation --------------------------------------------------------------------
    def evaluate(self, batch: Batch, *, head=None) -> torch.Tensor:
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

    # ---- resident parts ----------------------------------------------------------------
    def _update_scratch(self) -> list:
        """fp32 chunks the stochastic rounding computes the update in (update
        "stochastic"; none otherwise)."""
        if self.cfg.workload.update != "stochastic":
            return []
        largest = max(s.numel for s in self.parts.block_specs + self.parts.resident_specs)
        size = min(sr_chunk(self.env.device.type), largest)
        return [torch.empty(size, dtype=torch.float32, device=self.env.device)
                for _ in range(SR_SCRATCH)]

    def _apply_pending(self, theta, block: int, specs, z, *, start: int | None = None,
                       edge=None, scratch=None, dirs: Directions | None = None) -> None:
        """theta -= lr * (g d_t + wd theta) for each pending update t in order (the
        deferred update of the last step; several when a resume replays the log), d_t
        the estimator's direction of step t (with q directions: g_j / q along each
        d_j, weight decay once), in the workload's update mode (docs/precision.md): in
        the stored precision for "master" (fp32) and "plain" (16-bit, round to
        nearest), computed in fp32 and rounded stochastically for "stochastic". With
        `start`, `theta` is the flat range [start, start + len) of the block (the update
        on the slice): d is drawn for it alone (zoexec.maths.estimators, cut chunks
        through `edge`), the same bits land there as with the whole block; `scratch`,
        `dirs`: the rounding's and the draws' (default the compute stream's). The counter
        paths: every term in one pass (zoexec.maths.counter), no z buffer."""
        if self.zk:
            self._zo_pass(theta, block, specs, terms=self._terms(), start=start or 0)
            return
        z = z if start is None else z[:theta.numel()]
        for pend in self.pending:
            for index, (direction, g) in enumerate(pend.terms):
                self._apply_term(theta, block, specs, z, pend, direction, g,
                                 wd=self.cfg.optim.weight_decay if index == 0 else 0.0,
                                 start=start, edge=edge, scratch=scratch, dirs=dirs or self.dirs)

    def _apply_term(self, theta, block, specs, z, pend: Update, direction: int, g: float, *,
                    wd: float, start, edge, scratch, dirs: Directions) -> None:
        """One direction's share of a pending update (see _apply_pending)."""
        if not pend.lr or not (g or wd):
            return
        seed = direction_seed(pend.seed, direction)
        if g:
            dirs.fill(z, seed=seed, step=pend.step, block=block, specs=specs, theta=theta,
                      start=start, edge=edge)
        before = self.rounding.before(theta, block) if not start else None
        if self.cfg.workload.update == "stochastic":
            apply_update_stochastic(theta, z, lr=pend.lr, g=g, weight_decay=wd, specs=specs,
                                    seed=seed, block=block, scratch=scratch or self.scratch,
                                    start=start or 0)
        else:
            apply_update(theta, z, lr=pend.lr, g=g, weight_decay=wd,
                         decay_mask_or_specs=specs, start=start or 0)
        self.rounding.after(theta, z, before, g=g)

    def _draw(self, z, theta, block: int, specs, direction: int) -> None:
        """z <- d of the step in progress along `direction` (the whole block; nothing on
        the counter paths: their passes regenerate z)."""
        if self.zk:
            return
        step, seed = self.now
        self.dirs.fill(z, seed=direction_seed(seed, direction), step=step, block=block,
                       specs=specs, theta=theta)

    # ---- the counter paths (--zo-kernel counter, fused) -------------------------------------
    def _terms(self) -> list[Term]:
        """The pending updates as the counter pass's terms (zoexec.maths.counter.terms_of)."""
        return terms_of(self.pending, weight_decay=self.cfg.optim.weight_decay)

    def _zo_pass(self, theta, block: int, specs, *, terms=(), stream: Stream | None = None,
                 work=None, start: int = 0) -> None:
        """One counter pass over `theta` (the block's range from `start`): `terms`, then
        `stream`'s perturbation of the step in progress into `work`."""
        perturb = None
        if stream is not None:
            perturb = Perturb(seed=direction_seed(self.now[1], stream.direction),
                              scale=f32(stream.sign * self.cfg.optim.eps), out=work)
        if terms or perturb is not None:
            self.zk(theta, specs=specs, block=block, terms=terms, perturb=perturb, start=start,
                    kind=self.zk_kind)

    def _eval_embed(self, ids: torch.Tensor):
        """An evaluation's (hidden, ctx) entering block 0 (prefix tuning: after its prefix)."""
        return self.parts.embed(ids)

    def _embed(self, seed: int, batches: list) -> list:
        """The resident parts' pending updates, then per stream its perturbation (d
        drawn again when the direction changes) and the embedding of its rows."""
        specs = self.parts.resident_specs
        terms = self._terms() if self.zk else None   # the counter paths: with the first perturbation
        if terms is None:
            self._apply_pending(self.theta_r, RESIDENT_BLOCK, specs, self.z_r)
        acts, drawn = [], None
        for stream, batch in zip(self.streams, batches, strict=True):
            if terms is not None:
                self._zo_pass(self.theta_r, RESIDENT_BLOCK, specs, terms=terms, stream=stream,
                              work=self.work_r)
                terms = []
                acts.append(self.parts.embed(batch.ids))
                continue
            if stream.direction != drawn:
                self._draw(self.z_r, self.theta_r, RESIDENT_BLOCK, specs, stream.direction)
                drawn = stream.direction
            perturb_into(self.work_r, self.theta_r, self.z_r, stream.sign * self.cfg.optim.eps)
            acts.append(self.parts.embed(batch.ids))
        return acts

    def _head(self, acts: list, batches: list, flags: tuple) -> torch.Tensor:
        """Summed loss of each stream (zoexec.model.heads.loss_sum: the head at the
        labelled positions only), last-built first (saves one rebuild), placed in the
        all-reduce vector [sum l+, sum l-, count] per direction, then *flags (float64);
        the count (the labelled tokens, or the examples of the candidate loss) is
        counted once per data shard (by the rank that computes l+)."""
        vec = loss_vector(flags, self.env.device, directions=self.estimator.directions)
        drawn = self.streams[-1].direction
        for turn, index in enumerate(reversed(range(len(self.streams)))):
            stream = self.streams[index]
            if stream.direction != drawn:
                self._draw(self.z_r, self.theta_r, RESIDENT_BLOCK, self.parts.resident_specs,
                           stream.direction)
                drawn = stream.direction
            if turn and self.zk:
                self._zo_pass(self.theta_r, RESIDENT_BLOCK, self.parts.resident_specs,
                              stream=stream, work=self.work_r)
            elif turn:
                perturb_into(self.work_r, self.theta_r, self.z_r,
                             stream.sign * self.cfg.optim.eps)
            total, count = heads.loss_sum(self.parts, acts[index][0], batches[index])
            add_at(vec, 3 * stream.direction + (0 if stream.sign > 0 else 1), total.double())
            if stream.sign > 0:
                add_at(vec, 3 * stream.direction + 2, count)
        return vec

    # ---- blocks ------------------------------------------------------------------------
    def _blocks(self, seed: int | None, acts: list | None):
        """The block pipeline of one pass (seed None and no acts: the flush, no forward;
        seed None with acts: evaluation, a forward on the clean weights and no
        write-back). Returns the done-event of the last write-back (None on the CPU or
        without an offloaded block). Every rank makes the same passes, so `stamp`
        agrees on the node. The blocks that use a buffer take them in turn (a resident
        block of slices 1 uses none)."""
        self.passes += 1
        stamp = self.passes
        free = [None] * len(self.bufs)
        last, used = None, 0
        for block in range(self.store.num_blocks):
            shard = self.shards.get(block)
            if shard is not None and self.env.layout.slices == 1:
                self._resident_pass(block, shard, seed, acts)
                continue
            slot = used % len(self.bufs)
            used += 1
            if shard is not None:
                free[slot] = self._sharded_pass(block, shard, self.bufs[slot], seed, acts,
                                                after=free[slot])
            else:
                free[slot] = last = self._offloaded_pass(block, self.bufs[slot], seed, acts,
                                                         stamp, after=free[slot])
        return last

    def _offloaded_pass(self, block: int, buf: torch.Tensor, seed, acts, stamp: int, *, after):
        """h2d, [slice_update], [allgather], [fence], update, forward, d2h of an
        offloaded block; returns the event that frees its buffer."""
        evaluating = seed is None and acts is not None
        ready = self._upload(block, buf, stamp, after=after, split=self.split and not evaluating)
        fence = self._fence(block, after=ready)
        if evaluating:
            return self._clean_forward(block, buf[:self.parts.block_numel], acts, after=ready)
        with self.lanes.task("update", block, after=(ready,)) as update:
            self._update_block(buf[:self.parts.block_numel], block, seed,
                               pending=not self.split)
        done = update.done
        if seed is not None:
            with self.lanes.task("forward", block) as forward:
                self._forward_block(buf[:self.parts.block_numel], acts, block=block)
            done = forward.done
        if self.flags is not None:
            self.flags.wait(block, stamp)
        with self.lanes.task("d2h", block, after=(done, fence)) as d2h:
            self._write_back(block, buf)
        return d2h.done

    def _sharded_pass(self, block: int, shard: torch.Tensor, buf: torch.Tensor, seed, acts, *,
                      after):
        """A resident block of slices > 1: [slice_update] on the rank's shard, the slice
        group's all-gather into `buf`, update (without slice_update: also the rank's
        slice of the updated block back into its shard), forward. The flush with
        slice_update stops after the slice update (the shard is all the block has).
        Returns the event that frees the buffer."""
        evaluating = seed is None and acts is not None
        ready = None
        if self.split and not evaluating:
            with self.lanes.task("slice_update", block) as sliced:
                self._slice_update(block, shard)
            if seed is None:
                return after
            ready = sliced.done
        with self.lanes.task("allgather", block, after=(after, ready)) as gather:
            _wait(zgroups.all_gather_flat(buf, shard, group=self.env.slice))
        theta = buf[:self.parts.block_numel]
        if evaluating:
            return self._clean_forward(block, theta, acts, after=gather.done)
        with self.lanes.task("update", block, after=(gather.done,)) as update:
            if not self.split and self.pending:
                self._apply_pending(theta, block, self.parts.block_specs, self.z)
                shard.copy_(_piece(buf, self.slice_index, self.env.layout.slices))
            self._update_block(theta, block, seed, pending=False)
        if seed is None:
            return update.done
        with self.lanes.task("forward", block) as forward:
            self._forward_block(theta, acts, block=block)
        return forward.done

    def _resident_pass(self, block: int, shard: torch.Tensor, seed, acts) -> None:
        """A resident block of slices 1 (the shard is the whole block): update and
        forward in place, no buffer, no copy."""
        theta = shard[:self.parts.block_numel]
        if seed is None and acts is not None:
            self._clean_forward(block, theta, acts, after=None)
            return
        with self.lanes.task("update", block):
            self._update_block(theta, block, seed, pending=True)
        if seed is not None:
            with self.lanes.task("forward", block):
                self._forward_block(theta, acts, block=block)

    def _clean_forward(self, block: int, theta: torch.Tensor, acts: list, *, after):
        """Evaluation: the block's forward on its clean weights (no perturbation)."""
        with self.lanes.task("forward", block, after=(after,)) as forward:
            self.work.copy_(theta)
            self._forward_block(theta, acts, block=block, streams=CLEAN)
        return forward.done

    def _upload(self, block: int, buf: torch.Tensor, stamp: int, *, after, split: bool):
        """h2d of this rank's slice (CPU fence: then its read stamp), [the update on the
        slice], then the slice group's all-gather. Returns the block's ready event."""
        slices = self.env.layout.slices
        if self.cfg.delay_h2d and self.cfg.delay_h2d[:2] == (self.env.rank, block):
            time.sleep(self.cfg.delay_h2d[2])
        with self.lanes.task("h2d", block, after=(after,)) as h2d:
            mine = _piece(buf, self.slice_index, slices)
            self._copy(mine, self.store.piece(block, self.slice_index, slices), "h2d")
        if self.flags is not None:
            self.flags.mark(block, stamp)
        ready = h2d.done
        if split:
            with self.lanes.task("slice_update", block, after=(ready,)) as sliced:
                self._slice_update(block, mine)
            ready = sliced.done
        if slices == 1:
            return ready
        with self.lanes.task("allgather", block, after=(ready,)) as gather:
            _wait(zgroups.all_gather_flat(buf, mine, group=self.env.slice))
        return gather.done

    def _slice_update(self, block: int, piece: torch.Tensor) -> None:
        """The pending updates applied to this rank's slice of `block` (its part inside
        the block's weights: the padding stays as it is)."""
        start = self.slice_index * piece.numel()
        count = min(piece.numel(), self.parts.block_numel - start)
        if count > 0 and self.pending:
            self._apply_pending(piece[:count], block, self.parts.block_specs, self.slice_z,
                                start=start, edge=self.slice_edge, scratch=self.slice_scratch,
                                dirs=self.slice_dirs)

    def _fence(self, block: int, *, after):
        """CUDA write-back fence: all local ranks have read `block` (node all-reduce).
        The CPU waits on the read stamps before d2h instead (_offloaded_pass)."""
        if not self.fence_needed or self.flags is not None:
            return None
        try:
            with self.lanes.task("allgather", block, after=(after,), record=False) as fence:
                _wait(dist.all_reduce(self.token, group=self.env.node, async_op=True))
        except LaneFailure as exc:   # the fence runs on the all-gather's lane, unrecorded
            raise exc.renamed("fence") from exc.cause
        return fence.done

    def _update_block(self, theta: torch.Tensor, block: int, seed: int | None, *,
                      pending: bool) -> None:
        """[The pending updates,] then d of step `seed` along the first stream's
        direction and its perturbation."""
        specs = self.parts.block_specs
        if self.zk:   # the counter paths: the pending updates and the perturbation in one pass
            first = self.streams[0] if seed is not None else None
            self._zo_pass(theta, block, specs, terms=self._terms() if pending else [],
                          stream=first, work=self.work)
            return
        if pending:
            self._apply_pending(theta, block, specs, self.z)
        if seed is not None:
            first = self.streams[0]
            self._draw(self.z, theta, block, specs, first.direction)
            perturb_into(self.work, theta, self.z, first.sign * self.cfg.optim.eps)

    def _forward_block(self, theta: torch.Tensor, acts: list, *, block: int,
                       streams: tuple | None = None) -> None:
        """The block's forward for each stream, the perturbation rebuilt between them
        (d drawn again when the direction changes)."""
        streams = streams or self.streams
        for index, stream in enumerate(streams):
            if index and self.zk:
                self._zo_pass(theta, block, self.parts.block_specs, stream=stream,
                              work=self.work)
            elif index:
                if stream.direction != streams[index - 1].direction:
                    self._draw(self.z, theta, block, self.parts.block_specs, stream.direction)
                perturb_into(self.work, theta, self.z, stream.sign * self.cfg.optim.eps)
            hidden, ctx = acts[index]
            acts[index] = (self.parts.block_forward(hidden, ctx), ctx)

    def _write_back(self, block: int, buf: torch.Tensor) -> None:
        lay = self.env.layout
        share = self.env.local_rank
        self._copy(self.store.piece(block, share, lay.local_ranks),
                   _piece(buf, share, lay.local_ranks), "d2h")

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, direction: str) -> None:
        """An h2d or d2h between the store and the device on the current (copy) stream:
        asynchronous DMA from the page-locked store, or through the pinned staging ring
        where the store could not be locked (zoexec.runtime.pinning.Staging)."""
        if self.staging is None:
            dst.copy_(src, non_blocking=True)
        else:
            getattr(self.staging, direction)(dst, src)

    def _settle_copies(self) -> None:
        """After a pass (the device idle): every staged write-back in the store, and,
        with several local ranks, every rank's before any reads the next pass's."""
        if self.staging is not None:
            self.staging.drain()
            zgroups.host_barrier(self.env, node_only=True)

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


def loss_vector(flags: tuple, device: torch.device, *, directions: int = 1) -> torch.Tensor:
    """The step's all-reduce vector [sum l+, sum l-, count] per direction, then *flags
    (float64), filled on the device: a host tensor copied to a GPU (torch.tensor(...,
    device=...)) would make the host wait for every task queued before it on the stream."""
    vec = torch.zeros(3 * directions + len(flags), dtype=torch.float64, device=device)
    for index, flag in enumerate(flags):
        if flag:
            put(vec, 3 * directions + index, flag)
    return vec


def put(vec: torch.Tensor, index: int, value: float) -> None:
    """vec[index] = value, a Python number, as a fill on the device (`vec[i] = 2.0`
    copies a one-element host tensor: on a GPU the host waits for the stream)."""
    vec[index:index + 1].fill_(value)


def add_at(vec: torch.Tensor, index: int, value) -> None:
    """vec[index] += value (a Python number or a device scalar), on the device."""
    vec[index:index + 1].add_(value)


def _piece(flat: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    size = flat.numel() // parts
    return flat[part * size:(part + 1) * size]


def _wait(work) -> None:
    """Wait for an async collective (CUDA: the current stream waits; gloo: blocks)."""
    if work is not None:
        work.wait()
