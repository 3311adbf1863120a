"""Batches: token ids with the labels the loss predicts, the per-epoch order of rows,
the examples tasks are made of, and each rank's shard of the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoexec.maths.zo import mix_seed
from zoplan.errors import ZoError

IGNORE = -100   # a label that is not predicted (prompt, padding): HF's ignore_index


@dataclass(frozen=True)
class Batch:
    """Rows of token ids [B, S] and their labels [B, S]: the token a position holds
    where the loss predicts it, IGNORE (-100) elsewhere (a prompt, padding). The loss
    of position i is that of predicting labels[i + 1] (zoexec.model.families.causal_lm_loss)."""

    ids: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.ids.shape != self.labels.shape or self.ids.dim() != 2:
            raise ZoError(f"a batch needs ids and labels of one shape [rows, seq], got "
                          f"{tuple(self.ids.shape)} and {tuple(self.labels.shape)}")

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    def select(self, start: int, stop: int) -> Batch:
        return Batch(self.ids[start:stop], self.labels[start:stop])

    def to(self, device) -> Batch:
        return Batch(self.ids.to(device), self.labels.to(device))


def as_batch(rows: torch.Tensor | Batch) -> Batch:
    """A source's answer as a Batch: bare rows are packed text, every token a label."""
    if isinstance(rows, Batch):
        return rows
    return Batch(rows, rows)


def generator(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(mix_seed(*parts))


class EpochOrder:
    """Which of `count` rows each step's batch takes: every epoch visits the rows in a
    fresh random order fixed by (tag, seed, epoch), and a batch may run across an
    epoch's end. Remembers the last batch's shape for `epoch_of`."""

    def __init__(self, tag: int, seed: int) -> None:
        self.tag, self.seed = tag, seed
        self._orders: dict[tuple[int, int], torch.Tensor] = {}
        self._per_epoch: float | None = None

    def _order(self, count: int, epoch: int) -> torch.Tensor:
        key = (count, epoch)
        if key not in self._orders:
            if len(self._orders) > 4:
                self._orders.clear()
            self._orders[key] = torch.randperm(count, generator=generator(self.tag, self.seed, epoch))
        return self._orders[key]

    def picks(self, step: int, batch_size: int, count: int) -> list[int]:
        """The rows of step `step`'s batch of `batch_size`, out of `count`."""
        self._per_epoch = count / batch_size
        return [int(self._order(count, k // count)[k % count])
                for k in range(step * batch_size, (step + 1) * batch_size)]

    def epoch_of(self, step: int) -> float | None:
        """Passes over the rows after `step` (the metrics' "epoch"), once a batch has been
        drawn (it gives the batch size)."""
        return (step + 1) / self._per_epoch if self._per_epoch else None


@dataclass(frozen=True)
class Example:
    """One row: the prompt's ids (no loss) and the target's ids (the loss), but for
    the target positions in `skip` (a packed text row's document starts)."""

    prompt: tuple[int, ...]
    target: tuple[int, ...]
    skip: tuple[int, ...] = ()


def shard(batch, *, data_shard: int, num_shards: int):
    """This rank's contiguous rows of the global batch (a Batch or a tensor of rows;
    data_shard in 0..num_shards-1)."""
    rows = batch.rows if isinstance(batch, Batch) else batch.shape[0]
    if num_shards < 1 or not 0 <= data_shard < num_shards:
        raise ZoError(f"data shard {data_shard} is not in 0..{num_shards - 1}")
    if rows % num_shards:
        raise ZoError(f"global batch ({rows}) is not divisible by the data shards ({num_shards})")
    per = rows // num_shards
    if isinstance(batch, Batch):
        return batch.select(data_shard * per, (data_shard + 1) * per)
    return batch[data_shard * per:(data_shard + 1) * per]
