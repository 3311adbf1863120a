"""One rank of `zoexec run`: the plan's step schedule, block by block, step by step.

Per step t with seed s_t (zo.step_seed) on every rank, in program order:
  embed      apply step t-1's deferred update to the resident parts (embeddings, final
             norm, LM head: z block -1), draw their z for s_t, build the perturbed
             resident weights and embed the rank's shard once per perturbation.
  per block b (prefetch buffers, slot b % prefetch):
    h2d        copy this rank's slice (1/slices) of block b from the node's shared store
               into the rank's block buffer (on CUDA: async DMA from pinned memory)
    allgather  the slice group gathers the whole block (skipped when slices == 1)
    [fence]    every local rank has read block b (only when slices < local ranks; the
               all-gather orders it otherwise). CUDA: a node-local all-reduce of a token
               after the h2d; CPU: no collective, a wait on the node's shared read
               stamps right before d2h (zoexec.fence), not recorded as a task
    update     apply step t-1's deferred update (regenerating its z), then draw z for
               s_t and build theta + sign*eps*z of the first perturbation in the
               working buffer the block module is bound to
    forward    the block on each perturbation's activations ("+-": both, the second
               perturbation built from the clean theta first; PertP: one)
    d2h        write this rank's 1/local_ranks share of the updated block back
  head       final norm + LM head + loss per perturbation (resident weights rebuilt)
  allreduce  the loss pair over the world: PertP exchange and DDP mean in one sum
Then g = (l+ - l-) / (2 eps) is known on every rank and becomes the pending update.
After the last step a flush pass (h2d, allgather, update, d2h) applies it.

z is therefore drawn TWICE per block per step (update of t-1, perturbation of t),
never stored, and addressed by (seed, block, tensor, chunk) only (zoexec.zo), so every
layout computes the same maths. Each step's StepRecord (seed, g, losses) is known on
every rank; seed replay = running the update half of the schedule over a log.

On CUDA the lanes are streams and the host only enqueues: h2d of block b+1 runs
while block b computes, limited by the buffers; on the CPU every task runs at once in
exactly the order above.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zoexec import dist as zdist
from zoexec.checkpoint import StepRecord
from zoexec.config import RunConfig
from zoexec.data import shard
from zoexec.fence import ReadFlags
from zoexec.models import bind_block, bind_resident, resident_flat
from zoexec.node import fence_needed
from zoexec.precision import LostUpdates
from zoexec.speed import SpeedMonitor
from zoexec.store import BlockStore
from zoexec.zo import (
    RESIDENT_BLOCK,
    apply_update,
    apply_update_stochastic,
    perturb_into,
    projected_grad,
    step_seed,
    z_block,
)
from zoplan.errors import ZoError
from zoplan.execrules import SR_SCRATCH, sr_chunk

SIGNS = {"+-": (1.0, -1.0), "+": (1.0,), "-": (-1.0,)}


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A deferred update: step seed, projected gradient and learning rate of a step."""

    seed: int
    g: float
    lr: float


# ---- the node's model: built once, shared ---------------------------------------------------


# ---- the training loop ---------------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Trainer:
    """The step loop of one rank over its device buffers (see the module docstring).
    `pending` is the deferred update; `history` the StepRecords, the same on all ranks."""

    cfg: RunConfig
    env: zdist.DistEnv
    parts: object
    store: BlockStore
    source: object
    lanes: object
    pending: tuple[Pending, ...] = ()   # deferred updates, applied in order at the next pass
    flags: ReadFlags | None = None      # CPU write-back fence (share_read_flags)
    passes: int = 0                     # block passes so far: the fence's stamp
    speed: SpeedMonitor | None = None   # traced CPU runs: speed probes between steps

    def __post_init__(self) -> None:
        lay, rank = self.env.layout, self.env.rank
        self.signs = SIGNS[lay.role_of(rank)]
        self.data_shard, self.slice_index = lay.data_shard_of(rank), lay.slice_index_of(rank)
        self.fence_needed = fence_needed(lay)
        if self.fence_needed and not self.env.is_cuda and self.flags is None:
            raise ZoError(f"{lay.local_ranks} local ranks with {lay.slices} slices on the "
                          f"CPU need the node's read stamps (share_read_flags)")
        wl = self.cfg.workload
        self.rounding = LostUpdates(enabled=rank == 0, update=wl.update, lr=self.cfg.lr,
                                    dtype=self.parts.param_dtype, quiet=not self.cfg.progress)
        self._allocate()

    def _allocate(self) -> None:
        """Block buffers (param dtype, padded), the working block and z (compute dtype),
        the resident parts: clean theta (param dtype: the fp32 masters with update
        "master"), working copy and z (compute dtype), and the stochastic rounding's
        fp32 scratch. zoplan.memory models exactly these."""
        parts, dev, lay = self.parts, self.env.device, self.env.layout
        count = max(1, min(lay.prefetch, self.store.num_blocks))
        self.bufs = [torch.zeros(self.store.stride, dtype=parts.param_dtype, device=dev)
                     for _ in range(count)]
        self.work = torch.empty(parts.block_numel, dtype=parts.dtype, device=dev)
        self.z = torch.empty(parts.block_numel, dtype=parts.dtype, device=dev)
        theta_r = parts.resident_master if parts.resident_master is not None \
            else resident_flat(parts)
        parts.to(dev)
        bind_block(parts, self.work)
        self.theta_r = theta_r.to(dev)                       # clean, stored precision
        self.work_r = self.theta_r.to(parts.dtype, copy=True)  # perturbed, compute precision
        self.z_r = torch.empty_like(self.work_r)
        bind_resident(parts, self.work_r)
        self.scratch = self._update_scratch()
        self.token = torch.zeros(1, device=dev)

    # ---- steps -----------------------------------------------------------------------
    def step(self, step: int, *, lr: float,
             flags: tuple[float, float] = (0.0, 0.0)) -> tuple[StepRecord, tuple]:
        """One training step: (its record, the world's sum of every rank's `flags`,
        exchanged in the loss all-reduce: zoexec.loop's stop and snapshot requests).
        The step's update becomes pending only when the loop says so (set_pending)."""
        if self.cfg.fail_at == (self.env.rank, step):
            raise RuntimeError(f"injected fault at step {step}")
        seed = step_seed(self.cfg.seed, step)
        self.lanes.begin_step(step)
        start = time.monotonic()
        ids = self._batch(step)
        with self.lanes.task("embed"):
            acts = self._embed(seed, ids)
        last_d2h = self._blocks(seed, acts)
        with self.lanes.task("head") as head:
            vec = self._head(acts, ids, flags)
        with self.lanes.task("allreduce", after=(head.done, last_d2h)):
            if self.env.place.world_size > 1:   # a world of one already holds the sum
                _wait(dist.all_reduce(vec, group=self.env.world, async_op=True))
        self.lanes.end_step()
        total = vec.tolist()
        loss_plus, loss_minus = (v / self.env.layout.ddp for v in total[:2])
        g = projected_grad(loss_plus, loss_minus, self.cfg.eps)
        elapsed = time.monotonic() - start
        record = StepRecord(step=step, seed=seed, loss_plus=loss_plus, loss_minus=loss_minus,
                            g=g, lr=lr, step_time_s=elapsed,
                            tokens_per_s=self.cfg.workload.tokens_per_step / elapsed)
        return record, tuple(total[2:])

    def set_pending(self, record: StepRecord) -> None:
        """The step's update (if it has one: finite, not skipped) becomes the pending one."""
        update = record.update
        self.pending = (Pending(seed=update[0], g=update[1], lr=update[2]),) if update else ()

    def replay(self, updates) -> None:
        """Apply logged updates ((seed, g, lr), in step order) in one pass over the
        blocks: each block gets them in the order the run applied them."""
        self.pending = tuple(Pending(seed=s, g=g, lr=lr) for s, g, lr in updates)
        self.flush()

    def flush(self) -> None:
        """Apply the pending updates to every block and the resident parts."""
        if not self.pending:
            return
        self.lanes.begin_step(self.cfg.steps, record=False)
        with self.lanes.task("embed"):
            self._apply_pending(self.theta_r, RESIDENT_BLOCK, self.parts.resident_specs, self.z_r)
        self._blocks(None, None)
        self.lanes.end_step()
        self.pending = ()
        zdist.host_barrier(self.env)

    def _batch(self, step: int) -> torch.Tensor:
        wl = self.cfg.workload
        rows = self.source.batch(step, wl.batch, wl.seq)
        mine = shard(rows, data_shard=self.data_shard, num_shards=self.env.layout.ddp)
        return mine.to(self.env.device)

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

    def _apply_pending(self, theta, block: int, specs, z) -> None:
        """theta -= lr * (g z_t + wd theta) for each pending update t in order (the
        deferred update of the last step; several when a resume replays the log), in
        the workload's update mode (docs/precision.md): in the stored precision for
        "master" (fp32) and "plain" (16-bit, round to nearest), computed in fp32 and
        rounded stochastically for "stochastic"."""
        wd = self.cfg.weight_decay
        for pend in self.pending:
            if not pend.lr or not (pend.g or wd):
                continue
            if pend.g:
                z_block(pend.seed, block, specs, out=z)
            before = self.rounding.before(theta, block)
            if self.cfg.workload.update == "stochastic":
                apply_update_stochastic(theta, z, lr=pend.lr, g=pend.g, weight_decay=wd,
                                        specs=specs, seed=pend.seed, block=block,
                                        scratch=self.scratch)
            else:
                apply_update(theta, z, lr=pend.lr, g=pend.g, weight_decay=wd,
                             decay_mask_or_specs=specs)
            self.rounding.after(theta, z, before, g=pend.g)

    def _embed(self, seed: int, ids: torch.Tensor) -> list:
        specs = self.parts.resident_specs
        self._apply_pending(self.theta_r, RESIDENT_BLOCK, specs, self.z_r)
        z_block(seed, RESIDENT_BLOCK, specs, out=self.z_r)
        acts = []
        for sign in self.signs:
            perturb_into(self.work_r, self.theta_r, self.z_r, sign * self.cfg.eps)
            acts.append(self.parts.embed(ids))
        return acts

    def _head(self, acts: list, ids: torch.Tensor, flags: tuple) -> torch.Tensor:
        """Loss of each perturbation, last-built first (saves one rebuild), placed in
        the all-reduce vector [l+, l-, *flags] (float64)."""
        vec = torch.tensor([0.0, 0.0, *flags], dtype=torch.float64, device=self.env.device)
        for turn, index in enumerate(reversed(range(len(self.signs)))):
            sign = self.signs[index]
            if turn:
                perturb_into(self.work_r, self.theta_r, self.z_r, sign * self.cfg.eps)
            loss = self.parts.head_loss(acts[index][0], ids)
            vec[0 if sign > 0 else 1] = loss.double()
        return vec

    # ---- blocks ------------------------------------------------------------------------
    def _blocks(self, seed: int | None, acts: list | None):
        """The block pipeline of one step (seed None: the flush, no forward). Returns
        the done-event of the last write-back (None on the CPU). Every rank makes the
        same passes, so `stamp` (step t: t + 1, the flush: steps + 1) agrees on the node."""
        self.passes += 1
        stamp = self.passes
        free = [None] * len(self.bufs)
        last = None
        for block in range(self.store.num_blocks):
            slot = block % len(self.bufs)
            buf = self.bufs[slot]
            ready, h2d = self._upload(block, buf, stamp, after=free[slot])
            fence = self._fence(block, after=ready)
            with self.lanes.task("update", block, after=(ready,)) as update:
                self._update_block(block, buf, seed)
            done = update.done
            if seed is not None:
                with self.lanes.task("forward", block) as forward:
                    self._forward_block(buf, acts)
                done = forward.done
            if self.flags is not None:
                self.flags.wait(block, stamp)
            with self.lanes.task("d2h", block, after=(done, fence)) as d2h:
                self._write_back(block, buf)
            free[slot] = last = d2h.done
        return last

    def _upload(self, block: int, buf: torch.Tensor, stamp: int, *, after):
        """h2d of this rank's slice (CPU fence: then its read stamp), then the slice
        group's all-gather."""
        slices = self.env.layout.slices
        if self.cfg.delay_h2d and self.cfg.delay_h2d[:2] == (self.env.rank, block):
            time.sleep(self.cfg.delay_h2d[2])
        with self.lanes.task("h2d", block, after=(after,)) as h2d:
            mine = _piece(buf, self.slice_index, slices)
            mine.copy_(self.store.piece(block, self.slice_index, slices), non_blocking=True)
        if self.flags is not None:
            self.flags.mark(block, stamp)
        if slices == 1:
            return h2d.done, h2d.done
        with self.lanes.task("allgather", block, after=(h2d.done,)) as gather:
            _wait(dist.all_gather_single(buf, mine, group=self.env.slice, async_op=True))
        return gather.done, h2d.done

    def _fence(self, block: int, *, after):
        """CUDA write-back fence: all local ranks have read `block` (node all-reduce).
        The CPU waits on the read stamps before d2h instead (_blocks)."""
        if not self.fence_needed or self.flags is not None:
            return None
        with self.lanes.task("allgather", block, after=(after,), record=False) as fence:
            _wait(dist.all_reduce(self.token, group=self.env.node, async_op=True))
        return fence.done

    def _update_block(self, block: int, buf: torch.Tensor, seed: int | None) -> None:
        theta = buf[:self.parts.block_numel]
        specs = self.parts.block_specs
        self._apply_pending(theta, block, specs, self.z)
        if seed is not None:
            z_block(seed, block, specs, out=self.z)
            perturb_into(self.work, theta, self.z, self.signs[0] * self.cfg.eps)

    def _forward_block(self, buf: torch.Tensor, acts: list) -> None:
        theta = buf[:self.parts.block_numel]
        for index, sign in enumerate(self.signs):
            if index:
                perturb_into(self.work, theta, self.z, sign * self.cfg.eps)
            hidden, ctx = acts[index]
            acts[index] = (self.parts.block_forward(hidden, ctx), ctx)

    def _write_back(self, block: int, buf: torch.Tensor) -> None:
        lay = self.env.layout
        share = self.env.local_rank
        self.store.piece(block, share, lay.local_ranks).copy_(
            _piece(buf, share, lay.local_ranks), non_blocking=True)

    # ---- results -----------------------------------------------------------------------
    def clean_resident_cpu(self) -> torch.Tensor:
        return self.theta_r.to("cpu")


def _piece(flat: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    size = flat.numel() // parts
    return flat[part * size:(part + 1) * size]


def _wait(work) -> None:
    """Wait for an async collective (CUDA: the current stream waits; gloo: blocks)."""
    if work is not None:
        work.wait()
