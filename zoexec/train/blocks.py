"""The block pipeline of one rank's `Trainer` (zoexec.train.engine's module
docstring): per block h2d, [slice_update], [allgather], [fence], update, forward, d2h
for offloaded blocks, the resident blocks' passes, and the copies between the node's
store and the device. `BlockPipeline` is a part of `Trainer`."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from zoexec.maths.zo import perturb_into
from zoexec.runtime import groups as zgroups
from zoexec.runtime.errors import LaneFailure
from zoexec.train.state import CLEAN, Event, Hidden, Stream
from zoexec.train.updates import ZoUpdates


class BlockPipeline(ZoUpdates):
    """The pass over the blocks (see the module docstring); a part of `Trainer`,
    whose state it reads."""

    # ---- blocks ------------------------------------------------------------------------
    def _blocks(self, seed: int | None, acts: list[Hidden] | None) -> Event:
        """The block pipeline of one pass (seed None and no acts: the flush, no forward;
        seed None with acts: evaluation, a forward on the clean weights and no
        write-back). Returns the done-event of the last write-back (None on the CPU or
        without an offloaded block). Every rank makes the same passes, so `stamp`
        agrees on the node. The blocks that use a buffer take them in turn (a resident
        block of slices 1 uses none)."""
        self.passes += 1
        stamp = self.passes
        free: list[Event] = [None] * len(self.bufs)
        last: Event = None
        used = 0
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

    def _offloaded_pass(self, block: int, buf: torch.Tensor, seed: int | None,
                        acts: list[Hidden] | None, stamp: int, *, after: Event) -> Event:
        """h2d, [slice_update], [allgather], [fence], update, forward, d2h of an
        offloaded block; returns the event that frees its buffer."""
        evaluating = seed is None and acts is not None
        ready = self._upload(block, buf, stamp, after=after, split=self.split and not evaluating)
        fence = self._fence(block, after=ready)
        if seed is None and acts is not None:   # evaluating
            return self._clean_forward(block, buf[:self.parts.block_numel], acts, after=ready)
        with self.lanes.task("update", block, after=(ready,)) as update:
            self._update_block(buf[:self.parts.block_numel], block, seed,
                               pending=not self.split)
        done = update.done
        if seed is not None:
            assert acts is not None, "a step's pass carries its activations"
            with self.lanes.task("forward", block) as forward:
                self._forward_block(buf[:self.parts.block_numel], acts, block=block)
            done = forward.done
        if self.flags is not None:
            self.flags.wait(block, stamp)
        with self.lanes.task("d2h", block, after=(done, fence)) as d2h:
            self._write_back(block, buf)
        return d2h.done

    def _sharded_pass(self, block: int, shard: torch.Tensor, buf: torch.Tensor,
                      seed: int | None, acts: list[Hidden] | None, *, after: Event) -> Event:
        """A resident block of slices > 1: [slice_update] on the rank's shard, the slice
        group's all-gather into `buf`, update (without slice_update: also the rank's
        slice of the updated block back into its shard), forward. The flush with
        slice_update stops after the slice update (the shard is all the block has).
        Returns the event that frees the buffer."""
        evaluating = seed is None and acts is not None
        ready: Event = None
        if self.split and not evaluating:
            with self.lanes.task("slice_update", block) as sliced:
                self._slice_update(block, shard)
            if seed is None:
                return after
            ready = sliced.done
        with self.lanes.task("allgather", block, after=(after, ready)) as gather:
            _wait(zgroups.all_gather_flat(buf, shard, group=self.env.slice))
        theta = buf[:self.parts.block_numel]
        if seed is None and acts is not None:   # evaluating
            return self._clean_forward(block, theta, acts, after=gather.done)
        with self.lanes.task("update", block, after=(gather.done,)) as update:
            if not self.split and self.pending:
                self._apply_pending(theta, block, self.parts.block_specs, self.z)
                shard.copy_(_piece(buf, self.slice_index, self.env.layout.slices))
            self._update_block(theta, block, seed, pending=False)
        if seed is None:
            return update.done
        assert acts is not None, "a step's pass carries its activations"
        with self.lanes.task("forward", block) as forward:
            self._forward_block(theta, acts, block=block)
        return forward.done

    def _resident_pass(self, block: int, shard: torch.Tensor, seed: int | None,
                       acts: list[Hidden] | None) -> None:
        """A resident block of slices 1 (the shard is the whole block): update and
        forward in place, no buffer, no copy."""
        theta = shard[:self.parts.block_numel]
        if seed is None and acts is not None:
            self._clean_forward(block, theta, acts, after=None)
            return
        with self.lanes.task("update", block):
            self._update_block(theta, block, seed, pending=True)
        if seed is not None:
            assert acts is not None, "a step's pass carries its activations"
            with self.lanes.task("forward", block):
                self._forward_block(theta, acts, block=block)

    def _clean_forward(self, block: int, theta: torch.Tensor, acts: list[Hidden], *,
                       after: Event) -> Event:
        """Evaluation: the block's forward on its clean weights (no perturbation)."""
        with self.lanes.task("forward", block, after=(after,)) as forward:
            self.work.copy_(theta)
            self._forward_block(theta, acts, block=block, streams=CLEAN)
        return forward.done

    def _upload(self, block: int, buf: torch.Tensor, stamp: int, *, after: Event,
                split: bool) -> Event:
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

    def _fence(self, block: int, *, after: Event) -> Event:
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

    def _forward_block(self, theta: torch.Tensor, acts: list[Hidden], *, block: int,
                       streams: tuple[Stream, ...] | None = None) -> None:
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


def _piece(flat: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    size = flat.numel() // parts
    return flat[part * size:(part + 1) * size]


def _wait(work: dist.Work | None) -> None:
    """Wait for an async collective (CUDA: the current stream waits; gloo: blocks)."""
    if work is not None:
        work.wait()
