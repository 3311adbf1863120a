"""What one rank's `Trainer` holds (zoexec.train.engine's module docstring), declared
once for the parts it is made of (zoexec.train.updates.ZoUpdates, .streams.StreamEnds,
.blocks.BlockPipeline), and the protocols of its collaborators: the lanes its tasks
run on (zoexec.runtime.lanes) and the data source its steps read. A step's forwards
(`Stream`) live here too: every part reads them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from zoexec.config import RunConfig
from zoexec.data.batch import Batch
from zoexec.maths.estimators import Directions
from zoexec.maths.history import Update
from zoexec.model.adapter import Context
from zoexec.model.families import ModelParts
from zoexec.model.precision import LostUpdates
from zoexec.runtime.groups import DistEnv
from zoexec.runtime.lanes import Task
from zoexec.runtime.pinning import Staging
from zoexec.store.blocks import BlockStore
from zoexec.store.fence import ReadFlags
from zoexec.train.speed import SpeedMonitor
from zoexec.train.zokernel import ZoPass
from zoplan.estimators import EstimatorSpec

# What a later task waits on: a task's `done` (a CUDA event), or None (nothing, or the CPU)
Event = object
# The activations of one stream entering a block: hidden states and the ctx every block
# takes (ModelParts.embed: a kwargs dict)
Hidden = tuple[torch.Tensor, Context]


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


class Lanes(Protocol):
    """A rank's lanes (zoexec.runtime.lanes: CpuLanes, CudaLanes): a step's tasks, each
    run inside `task`, after the events of `after`."""

    def begin_step(self, step: int, *, record: bool = True) -> None: ...

    def task(self, kind: str, block: int = ..., *, after: tuple[Event, ...] = (),
             record: bool = True) -> AbstractContextManager[Task]: ...

    def end_step(self) -> None: ...


class BatchSource(Protocol):
    """The training data (zoexec.data.sources.make_source): the rows of a step's batch
    (token ids, or a Batch with its labels)."""

    def batch(self, step: int, batch_size: int, seq: int) -> torch.Tensor | Batch: ...


class TrainerState:
    """The state of a rank's Trainer, which its parts read and write: the Trainer's
    fields, then what it derives from them (__post_init__) and allocates (_allocate,
    _allocate_shards); a LoRA or prefix run's additions are its own
    (zoexec.train.lora)."""

    # the Trainer's fields (zoexec.train.engine.Trainer)
    cfg: RunConfig
    env: DistEnv
    parts: ModelParts
    store: BlockStore
    source: BatchSource | None          # None: evaluation only (no step)
    lanes: Lanes
    pending: tuple[Update, ...]         # deferred updates, applied in order at the next pass
    flags: ReadFlags | None             # CPU write-back fence (share_read_flags)
    passes: int                         # block passes so far: the fence's stamp
    speed: SpeedMonitor | None
    writes_back: ClassVar[bool]         # False: a read-only store (zoexec.train.lora)

    # derived from the layout and the workload
    signs: tuple[float, ...]            # the role's perturbation signs (streams.SIGNS)
    data_shard: int
    slice_index: int
    estimator: EstimatorSpec
    streams: tuple[Stream, ...]         # the rank's forwards of a step
    now: tuple[int, int] | None         # (step, seed) of the step in progress
    fence_needed: bool
    split: bool                         # the update on the slice (Layout.slice_update)
    rounding: LostUpdates
    zo_kernel: str                      # zoexec.maths.paths: torch, counter or fused
    zk: ZoPass | None                   # the counter paths' pass (None: the torch path)
    zk_kind: str                        # how a 16-bit theta stores an update

    # device buffers (a LoRA run: work, z and z_r are None; nothing of the base changes)
    bufs: list[torch.Tensor]            # the blocks' prefetch buffers (param dtype, padded)
    work: torch.Tensor                  # the working block (compute dtype)
    z: torch.Tensor
    theta_r: torch.Tensor               # the resident parts: clean, stored precision
    work_r: torch.Tensor                # perturbed, compute precision
    z_r: torch.Tensor
    scratch: list[torch.Tensor]         # the stochastic rounding's fp32 chunks
    dirs: Directions
    staging: Staging | None             # pinned staging ring (an unpinned CUDA store)
    token: torch.Tensor                 # the CUDA write-back fence's all-reduce

    # the resident blocks' shards and the slice update's own buffers
    shards: dict[int, torch.Tensor]
    slice_z: torch.Tensor
    slice_edge: torch.Tensor | None
    slice_scratch: list[torch.Tensor]
    slice_dirs: Directions
