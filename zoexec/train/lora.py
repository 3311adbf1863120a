"""One rank of a LoRA run (Workload.tuning "lora"): the engine's schedule over a frozen,
read-only base with the adapters (zoexec.model.lora) as the only trained weights.

What changes against zoexec.train.engine.Trainer (whose pipeline, lanes, buffers,
shards and all-gathers it keeps):
  embed      the embeddings once, shared by both perturbations (the resident parts are
             frozen: no update, no z, no perturbed copy; one compute-dtype copy held)
  per block  h2d (or the resident shard), [allgather], then
    update   the block's adapters: step t-1's deferred update (z regenerated for the
             adapter tensors, seed rule (step seed, block, adapter tensor)), z of step t
             and the first perturbation into the working adapters; the block module is
             bound to the base block where it landed (stored as it computes: no copy)
    forward  each perturbation's forward with the adapters' hook, the second
             perturbation of the adapters between them
  no d2h, no write-back fence and no slice update: the store is only ever read.
  head       final norm + LM head + loss per perturbation (nothing rebuilt between them)
Every rank holds every block's adapters (fp32, [blocks, numel]) and applies the same
scalar g to them, so they stay identical without any tensor collective; the flush and
a resume's replay update the adapters alone, without a pass over the blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

import torch

from zoexec.data.batch import Batch
from zoexec.maths.estimators import direction_seed
from zoexec.maths.zo import apply_update, perturb_into
from zoexec.model import heads
from zoexec.model.families import TensorSpec, bind_block, bind_resident, resident_flat
from zoexec.model.lora import (
    AdapterHooks,
    LoraSpec,
    init_adapters,
    is_adapter_folder,
    load_adapters,
    lora_spec,
    save_adapters,
)
from zoexec.runtime import groups as zgroups
from zoexec.store.node import store_staging
from zoexec.train.blocks import _wait
from zoexec.train.engine import SavedState, Trainer
from zoexec.train.state import Event, Hidden, Stream
from zoexec.train.streams import add_at, loss_vector
from zoplan.errors import ZoError
from zoplan.plan import Plan


class TunedSpec(Protocol):
    """The trained tensors of a block (zoexec.model.lora.LoraSpec,
    zoexec.model.prefix.PrefixSpec): their specs in the flat buffer and its size."""

    @property
    def specs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def numel(self) -> int: ...


SpecT = TypeVar("SpecT", bound=TunedSpec)


class FrozenBaseTrainer(Trainer, Generic[SpecT]):
    """The step loop of one rank training small tensors per block over a frozen base
    (module docstring): what LoRA and prefix tuning share; `lora` holds the spec of a
    block's trained tensors, which each kind makes, attaches, starts and saves."""

    writes_back: ClassVar[bool] = False
    lora: SpecT             # the trained tensors of a block
    block_now: int          # the block the working tensors belong to
    adapters: torch.Tensor  # every block's trained tensors: [blocks, numel] fp32
    work_a: torch.Tensor    # the working (perturbed) tensors of one block, compute dtype
    z_a: torch.Tensor       # their direction, fp32

    def __post_init__(self) -> None:
        if self.flags is not None:
            raise ZoError("a LoRA run writes nothing back: it takes no read stamps")
        super().__post_init__()

    def _allocate(self) -> None:
        """The block buffers, the frozen resident parts (compute dtype, once), every
        block's fp32 adapters, one block's working adapters and their z; the rank's
        resident shards. zoplan.memory (_lora_held) models exactly these."""
        parts, dev, lay = self.parts, self.env.device, self.env.layout
        assert parts.param_dtype == parts.dtype, (parts.param_dtype, parts.dtype)
        count = max(1, min(lay.prefetch, self.store.num_blocks))
        self.bufs = [torch.zeros(self.store.stride, dtype=parts.param_dtype, device=dev)
                     for _ in range(count)]
        resident = (parts.resident_master.to(parts.dtype) if parts.resident_master is not None
                    else resident_flat(parts))
        parts.resident_master = None
        parts.to(dev)
        self.work_r = resident.to(dev)
        self.theta_r = self.work_r       # frozen: the clean copy is the working one
        bind_resident(parts, self.work_r)
        self.lora = self._tuned_spec()
        # the base is frozen: no working block, z or resident z (empty: nothing reads them)
        self.work, self.z, self.z_r = (torch.empty(0, dtype=parts.dtype, device=dev)
                                       for _ in range(3))
        self.scratch = []
        self.dirs = self._directions(specs=list(self.lora.specs))
        self.block_now = 0
        self.staging = store_staging(self.env, self.store)
        self.token = torch.zeros(1, device=dev)
        self.adapters = self._initial_adapters().to(dev)
        self.work_a = torch.empty(self.lora.numel, dtype=parts.dtype, device=dev)
        self.z_a = torch.empty(self.lora.numel, dtype=torch.float32, device=dev)
        self._attach(self.work_a)
        self._allocate_shards()

    def _tuned_spec(self) -> SpecT:
        """The trained tensors of a block (their specs and numel)."""
        raise NotImplementedError

    def _attach(self, work: torch.Tensor) -> None:
        """Make the working block compute with the working tensors `work`."""
        raise NotImplementedError

    def _initial_adapters(self) -> torch.Tensor:
        """[blocks, numel] fp32: a resumed run's snapshot (checked), else the kind's
        initialisation."""
        raise NotImplementedError

    # ---- the adapters ------------------------------------------------------------------
    def _apply_adapters(self, block: int) -> None:
        """The pending updates (in order) applied to block `block`'s adapters, each
        along its estimator's directions (zoexec.maths.estimators; weight decay once)."""
        wd, theta = self.cfg.optim.weight_decay, self.adapters[block]
        for pend in self.pending:
            for index, (direction, g) in enumerate(pend.terms):
                decay = wd if index == 0 else 0.0
                if not pend.lr or not (g or decay):
                    continue
                if g:
                    self.dirs.fill(self.z_a, seed=direction_seed(pend.seed, direction),
                                   step=pend.step, block=block, specs=self.lora.specs,
                                   theta=theta)
                apply_update(theta, self.z_a, lr=pend.lr, g=g, weight_decay=decay,
                             decay_mask_or_specs=self.lora.specs)

    def flush(self) -> None:
        """The pending updates applied to every block's adapters (no block pass)."""
        for block in range(self.store.num_blocks):
            self._apply_adapters(block)
        self.pending = ()

    def _draw_adapters(self, block: int, direction: int) -> None:
        """z_a <- d of the step in progress along `direction` (block's adapters)."""
        step, seed = self._step_now()
        self.dirs.fill(self.z_a, seed=direction_seed(seed, direction), step=step, block=block,
                       specs=self.lora.specs, theta=self.adapters[block])

    def _update_block(self, theta: torch.Tensor, block: int, seed: int | None, *,
                      pending: bool) -> None:
        """Bind the base block, [the pending updates of its adapters,] d of step `seed`
        along the first stream's direction and its perturbation of the adapters."""
        bind_block(self.parts, theta)
        self.block_now = block
        if pending:
            self._apply_adapters(block)
        if seed is not None:
            first = self.streams[0]
            self._draw_adapters(block, first.direction)
            perturb_into(self.work_a, self.adapters[block], self.z_a,
                         first.sign * self.cfg.optim.eps)

    def _forward_block(self, theta: torch.Tensor, acts: list[Hidden], *, block: int,
                       streams: tuple[Stream, ...] | None = None) -> None:
        streams = streams or self.streams
        for index, stream in enumerate(streams):
            if index:
                if stream.direction != streams[index - 1].direction:
                    self._draw_adapters(self.block_now, stream.direction)
                perturb_into(self.work_a, self.adapters[self.block_now], self.z_a,
                             stream.sign * self.cfg.optim.eps)
            hidden, ctx = acts[index]
            acts[index] = (self.parts.block_forward(hidden, ctx), ctx)

    def _clean_forward(self, block: int, theta: torch.Tensor, acts: list[Hidden], *,
                       after: Event) -> Event:
        """Evaluation: the base block with its clean adapters."""
        with self.lanes.task("forward", block, after=(after,)) as forward:
            bind_block(self.parts, theta)
            self.work_a.copy_(self.adapters[block])
            for index, (hidden, ctx) in enumerate(acts):
                acts[index] = (self.parts.block_forward(hidden, ctx), ctx)
        return forward.done

    # ---- the step ----------------------------------------------------------------------
    def _embed(self, seed: int, batches: list[Batch]) -> list[Hidden]:
        """The embeddings of each stream's rows, once per distinct rows (frozen: an
        evaluation's, _eval_embed; prefix tuning's after its prefix)."""
        out: list[Hidden] = []
        done: dict[int, Hidden] = {}
        for batch in batches:
            if id(batch) not in done:
                done[id(batch)] = self._eval_embed(batch.ids)
            out.append(done[id(batch)])
        return out

    def _head(self, acts: list[Hidden], batches: list[Batch],
              flags: tuple[float, ...]) -> torch.Tensor:
        """The engine's head (zoexec.model.heads.loss_sum, the task's loss at its labelled
        positions) on each stream's activations, [sum l+, sum l-, count] per direction
        then *flags; the resident parts are frozen, so nothing is rebuilt between them."""
        vec = loss_vector(flags, self.env.device, directions=self.estimator.directions)
        for index, stream in enumerate(self.streams):
            total, count = heads.loss_sum(self.parts, acts[index][0], batches[index])
            add_at(vec, 3 * stream.direction + (0 if stream.sign > 0 else 1), total.double())
            if stream.sign > 0:
                add_at(vec, 3 * stream.direction + 2, count)
        return vec

    def _offloaded_pass(self, block: int, buf: torch.Tensor, seed: int | None,
                        acts: list[Hidden] | None, stamp: int, *, after: Event) -> Event:
        """h2d, [allgather], update (the adapters), forward; nothing written back. The
        buffer is free once the forward is done."""
        assert acts is not None, "every pass of a frozen base forwards (the flush makes none)"
        ready = self._upload(block, buf, stamp, after=after, split=False)
        theta = buf[:self.parts.block_numel]
        if seed is None:
            return self._clean_forward(block, theta, acts, after=ready)
        return self._adapted_forward(block, theta, seed, acts, after=ready)

    def _sharded_pass(self, block: int, shard: torch.Tensor, buf: torch.Tensor,
                      seed: int | None, acts: list[Hidden] | None, *, after: Event) -> Event:
        """A resident block of slices > 1: the slice group's all-gather, update (the
        adapters), forward; the shard never changes."""
        assert acts is not None, "every pass of a frozen base forwards (the flush makes none)"
        with self.lanes.task("allgather", block, after=(after,)) as gather:
            _wait(zgroups.all_gather_flat(buf, shard, group=self.env.slice))
        theta = buf[:self.parts.block_numel]
        if seed is None:
            return self._clean_forward(block, theta, acts, after=gather.done)
        return self._adapted_forward(block, theta, seed, acts, after=gather.done)

    def _adapted_forward(self, block: int, theta: torch.Tensor, seed: int, acts: list[Hidden],
                         *, after: Event) -> Event:
        with self.lanes.task("update", block, after=(after,)):
            self._update_block(theta, block, seed, pending=True)
        with self.lanes.task("forward", block) as forward:
            self._forward_block(theta, acts, block=block)
        return forward.done

    # ---- results -----------------------------------------------------------------------
    def store_shards(self) -> None:
        """Nothing: the base is never changed, the store already holds it."""

    def save(self, folder: Path, *, state: SavedState) -> None:
        """Rank 0: the trained tensors as a PEFT folder with the base's tokenizer; `state`:
        state.json as a function of the folder written so far (the tokenizer's files
        among its checksums)."""
        raise NotImplementedError

    def base_name(self) -> str:
        """What a saved folder names as its base: the model folder's absolute path
        (`zoexec eval FOLDER` finds it from anywhere), or the plan's model."""
        cfg = self.cfg
        path = cfg.model.model_path
        return str(Path(path).resolve()) if path else Plan(cfg.plan).model.name


class LoraTrainer(FrozenBaseTrainer[LoraSpec]):
    """The step loop of one rank training LoRA adapters (module docstring)."""

    hooks: AdapterHooks

    def _tuned_spec(self) -> LoraSpec:
        """The trained tensors of a block (their specs and numel): LoRA's adapters."""
        wl = self.cfg.workload
        return lora_spec(self.parts.block, r=wl.lora_r, alpha=wl.lora_alpha,
                         targets=wl.lora_targets)

    def _attach(self, work: torch.Tensor) -> None:
        """Make the working block compute with the working tensors `work`."""
        self.hooks = AdapterHooks(self.parts.block, self.lora)
        self.hooks.bind(work)

    def _initial_adapters(self) -> torch.Tensor:
        """[blocks, numel] fp32: a resumed run's snapshot (checked), else PEFT's
        initialisation from the run seed."""
        parts = self.parts
        if self.cfg.load_from is not None and is_adapter_folder(self.cfg.load_from):
            return load_adapters(Path(self.cfg.load_from), self.lora,
                                 layer_prefix=parts.layer_prefix, num_blocks=self.store.num_blocks)
        out = torch.empty(self.store.num_blocks, self.lora.numel, dtype=torch.float32)
        for block in range(self.store.num_blocks):
            init_adapters(self.lora, seed=self.cfg.optim.seed, block=block, out=out[block])
        return out

    def save(self, folder: Path, *, state: SavedState) -> None:
        """Rank 0: the adapters as a PEFT folder with the base's tokenizer
        (zoexec.model.lora.save_adapters); `state`: state.json as a function of the
        folder written so far (the tokenizer's files among its checksums)."""
        source = Path(self.cfg.source_dir) if self.cfg.source_dir else None
        save_adapters(folder, self.adapters.cpu(), self.lora, layer_prefix=self.parts.layer_prefix,
                      base=self.base_name(), tokenizer_from=source, state=state)
