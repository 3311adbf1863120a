"""Layout: how the ranks of a job split the work of one step.

world = nodes x local_ranks. Rank r sits on node r // local_ranks.
- PertP (axis "pertp", 1 or 2): with 2, rank r computes the "+" perturbation when r is
  even and the "-" one when odd; the pair shares a data shard and exchanges losses.
  With 1, every rank runs both ("+-", the ZO2 dual forward).
- DDP (axis "ddp"): data shard of rank r is r // pertp; the global batch is cut into
  `ddp` equal shards; only scalars are all-reduced.
- Slicing (`slices` = slice group size s): local ranks [k*s, (k+1)*s) form slice group
  k of their node; each uploads 1/s of every block, the group all-gathers it.
- Write-back: after the forward every local rank holds the whole updated block, so the
  write-back of a block is shared by ALL local ranks of the node (1/local_ranks each);
  a node's host copy of a block is written exactly once.
- prefetch: number of block buffers per rank (blocks in flight).
- slice_update: the deferred update of step t-1 is applied by each slice owner to its
  own slice before the all-gather (z for 1/s of the block), instead of by every rank to
  the whole gathered block; the perturbation still draws z for the whole block, so z is
  generated 1 + 1/s times per block per step instead of 2. Same maths, same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from zoplan.errors import ZoError


def axes_label(axes: dict[str, Any]) -> str:
    """Short name of a layout, e.g. "pertp2xddp4 s8 p3"; also for axes that are not a
    valid Layout (the planner names what it rejected)."""
    nodes = axes.get("nodes", 1)
    return (f"pertp{axes['pertp']}xddp{axes['ddp']}" + (f"x{nodes}n" if nodes > 1 else "")
            + f" s{axes['slices']} p{axes['prefetch']}"
            + (" su" if axes.get("slice_update") else ""))


# Bounds of a layout's degrees: far beyond any machine, small enough that a layout's
# rank table and simulation stay finite.
MAX_RANKS = 2**20
MAX_NODES = 100_000
MAX_PREFETCH = 1024
LAYOUT_BOUNDS = {"ddp": MAX_RANKS, "nodes": MAX_NODES, "slices": MAX_RANKS,
                 "prefetch": MAX_PREFETCH}


class Axis(str, Enum):
    PERTP = "pertp"
    DDP = "ddp"
    SLICES = "slices"


@dataclass(frozen=True, kw_only=True)
class Layout:
    pertp: int = 1
    ddp: int = 1
    nodes: int = 1
    slices: int = 1
    prefetch: int = 2
    slice_update: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.slice_update, bool):
            raise ValueError(f"slice_update must be true or false, got {self.slice_update!r}")
        for name in ("pertp", "ddp", "nodes", "slices", "prefetch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.pertp > 2:
            raise ValueError(f"pertp must be 1 or 2, got {self.pertp}")
        if self.world_size % self.nodes:
            raise ValueError(f"pertp ({self.pertp}) x ddp ({self.ddp}) = {self.world_size} "
                             f"is not divisible by nodes ({self.nodes})")
        if self.local_ranks % self.slices:
            raise ValueError(f"slices ({self.slices}) does not divide the "
                             f"{self.local_ranks} ranks of a node")

    def check_bounds(self) -> None:
        """Raise ValueError for degrees no plan or trace may hold (LAYOUT_BOUNDS, and at
        most MAX_RANKS ranks); what a search builds is bounded by its profile instead."""
        for name, high in LAYOUT_BOUNDS.items():
            if getattr(self, name) > high:
                raise ValueError(f"{name} must be <= {high}, got {getattr(self, name)}")
        if self.world_size > MAX_RANKS:
            raise ValueError(f"pertp ({self.pertp}) x ddp ({self.ddp}) = {self.world_size} "
                             f"ranks, more than {MAX_RANKS}")

    @property
    def world_size(self) -> int:
        return self.pertp * self.ddp

    @property
    def local_ranks(self) -> int:
        return self.world_size // self.nodes

    def node_of(self, rank: int) -> int:
        return rank // self.local_ranks

    def local_rank_of(self, rank: int) -> int:
        return rank % self.local_ranks

    def role_of(self, rank: int) -> str:
        if self.pertp == 1:
            return "+-"
        return "+" if rank % 2 == 0 else "-"

    def data_shard_of(self, rank: int) -> int:
        return rank // self.pertp

    def slice_group_of(self, rank: int) -> int:
        """Global index of the rank's slice group."""
        return rank // self.slices

    def slice_index_of(self, rank: int) -> int:
        return rank % self.slices

    def slice_group_ranks(self, rank: int) -> list[int]:
        first = self.slice_group_of(rank) * self.slices
        return list(range(first, first + self.slices))

    def rank_table(self) -> list[dict[str, Any]]:
        return [{"rank": r, "node": self.node_of(r), "local_rank": self.local_rank_of(r),
                 "role": self.role_of(r), "data_shard": self.data_shard_of(r),
                 "slice_group": self.slice_group_of(r), "slice_index": self.slice_index_of(r)}
                for r in range(self.world_size)]

    def label(self) -> str:
        return axes_label(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The axes by name (asdict's, without its deep copy: every axis is a scalar)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ZoError(f"malformed layout {data!r}: {exc}") from None
