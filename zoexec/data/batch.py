"""Batches: token ids with the labels the loss predicts, the per-epoch order of rows,
the examples tasks are made of, and each rank's shard of the global batch."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import overload

import torch
from torch import nn

from zoexec.maths.zo import mix_seed
from zoplan.errors import ZoError

IGNORE = -100   # a label that is not predicted (prompt, padding): HF's ignore_index


@dataclass(frozen=True)
class Choices:
    """The candidate loss's view of a batch (zoexec.model.heads): the examples its rows
    make. `answers` [E]: the correct candidate of each example. `tokens` [E, C]:
    single-token candidates, one row per example, scored at the row's one labelled
    position (the answer position: the prompt's last token predicts it); None: `size`
    rows per example, one per candidate, each labelled on its candidate's tokens, and
    `mean`: a candidate's score is its log-likelihood per token (else summed);
    `valid` [E, size] (None: all): False marks an empty row padding an example with
    fewer candidates (multiple choice), left out of the loss."""

    answers: torch.Tensor
    tokens: torch.Tensor | None = None
    size: int = 1
    valid: torch.Tensor | None = None
    mean: bool = True

    def __post_init__(self) -> None:
        if self.size < 1 or (self.tokens is not None and self.size != 1):
            raise ValueError(f"size must be 1 with tokens, >= 1 without, got {self.size}")
        if self.tokens is not None and self.tokens.shape[0] != self.answers.shape[0]:
            raise ValueError(f"tokens must have a row per answer, got {tuple(self.tokens.shape)} "
                             f"for {self.answers.shape[0]} answers")
        if self.valid is not None and tuple(self.valid.shape) != (self.answers.shape[0], self.size):
            raise ValueError(f"valid must be [examples, size], got {tuple(self.valid.shape)}")

    def select(self, start: int, stop: int) -> Choices:
        """Examples start..stop."""
        tokens = None if self.tokens is None else self.tokens[start:stop]
        valid = None if self.valid is None else self.valid[start:stop]
        return Choices(self.answers[start:stop], tokens, self.size, valid, self.mean)

    def to(self, device: torch.device | str) -> Choices:
        tokens = None if self.tokens is None else self.tokens.to(device)
        valid = None if self.valid is None else self.valid.to(device)
        return Choices(self.answers.to(device), tokens, self.size, valid, self.mean)


def shifted(labels: torch.Tensor) -> torch.Tensor:
    """The label each position predicts: position i that of i + 1 (the last, nothing)."""
    return nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:]


@dataclass(frozen=True)
class Positions:
    """Where a batch's loss reads: `rows` and `cols` [N] of every position that predicts
    a label (row-major), `counts` (host ints) how many each row has. Found where the
    labels are made (the host), before the batch moves to a device: on a GPU, finding
    them there (`nonzero`) makes the host wait for everything queued before it."""

    rows: torch.Tensor
    cols: torch.Tensor
    counts: tuple[int, ...]

    def to(self, device: torch.device | str) -> Positions:
        return Positions(self.rows.to(device, non_blocking=True),
                         self.cols.to(device, non_blocking=True), self.counts)


@dataclass(frozen=True)
class Batch:
    """Rows of token ids [B, S] and their labels [B, S]: the token a position holds
    where the loss predicts it, IGNORE (-100) elsewhere (a prompt, padding). The loss
    of position i is that of predicting labels[i + 1] (zoexec.model.heads). `choices`:
    the rows are candidates of examples and the loss is the candidate loss."""

    ids: torch.Tensor
    labels: torch.Tensor
    choices: Choices | None = None

    def __post_init__(self) -> None:
        if self.ids.shape != self.labels.shape or self.ids.dim() != 2:
            raise ZoError(f"a batch needs ids and labels of one shape [rows, seq], got "
                          f"{tuple(self.ids.shape)} and {tuple(self.labels.shape)}")
        if self.choices is not None and self.choices.answers.shape[0] * self.per_example != self.rows:
            raise ValueError(f"choices must cover the {self.rows} rows, got "
                             f"{self.choices.answers.shape[0]} examples of {self.per_example}")

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])

    @property
    def per_example(self) -> int:
        """Rows per example (candidates with a row each: their number; else 1)."""
        return 1 if self.choices is None else self.choices.size

    @cached_property
    def positions(self) -> Positions:
        """The positions the loss reads (Positions), found where the labels are; every
        candidate row (a row per candidate) must have a labelled token."""
        rows, cols = (shifted(self.labels) != IGNORE).nonzero(as_tuple=True)
        counts = tuple(torch.bincount(rows, minlength=self.rows).tolist())
        choices = self.choices
        if choices is not None and choices.tokens is None:
            valid = [True] * self.rows if choices.valid is None else choices.valid.reshape(-1).tolist()
            if any(ok and not count for ok, count in zip(valid, counts)):
                raise ZoError("a candidate row has no labelled token: a candidate lost its tokens")
        return Positions(rows, cols, counts)

    def select(self, start: int, stop: int) -> Batch:
        """Rows start..stop (whole examples)."""
        k = self.per_example
        if start % k or stop % k:
            raise ValueError(f"rows {start}..{stop} split an example of {k} rows")
        choices = None if self.choices is None else self.choices.select(start // k, stop // k)
        return Batch(self.ids[start:stop], self.labels[start:stop], choices)

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`, its Positions found here first (on the host)."""
        choices = None if self.choices is None else self.choices.to(device)
        moved = Batch(self.ids.to(device), self.labels.to(device), choices)
        moved.__dict__["positions"] = self.positions.to(device)   # cached_property's slot
        return moved


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

    def used(self, steps: int, batch_size: int, count: int) -> list[int]:
        """The rows (of `count`) the batches of steps 0..steps-1 take, in file order."""
        stop = steps * batch_size
        if stop >= count:
            return list(range(count))
        return sorted(int(i) for i in self._order(count, 0)[:stop])

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


def pack_examples(examples: list[Example], *, seq: int, pad: int, width: int | None = None,
                  where: str = "data") -> Batch:
    """A Batch of one example per row, right-padded to the longest row (or `width`),
    at most `seq` tokens: labels IGNORE on the prompt and the padding. A row too long
    loses prompt tokens from its left; a target longer than seq - 1 is refused."""
    rows = []
    for ex in examples:
        if len(ex.target) > seq - (1 if ex.prompt else 0):
            raise ZoError(f"{where}: a target of {len(ex.target)} tokens does not fit a "
                          f"sequence of {seq} after one prompt token; give a plan with a "
                          f"longer seq or shorter completions")
        keep = min(len(ex.prompt), seq - len(ex.target))
        rows.append((ex.prompt[len(ex.prompt) - keep:], ex.target))
    longest = max(len(p) + len(t) for p, t in rows) if rows else 1
    size = max(longest, width or 0)
    ids = torch.full((len(rows), size), pad, dtype=torch.long)
    labels = torch.full((len(rows), size), IGNORE, dtype=torch.long)
    for i, (prompt, target) in enumerate(rows):
        full = torch.tensor([*prompt, *target], dtype=torch.long)
        ids[i, :full.numel()] = full
        labels[i, len(prompt):full.numel()] = full[len(prompt):]
        for j in examples[i].skip:
            labels[i, len(prompt) + j] = IGNORE
    return Batch(ids, labels)


@overload
def shard(batch: Batch, *, data_shard: int, num_shards: int) -> Batch: ...
@overload
def shard(batch: torch.Tensor, *, data_shard: int, num_shards: int) -> torch.Tensor: ...
def shard(batch: Batch | torch.Tensor, *, data_shard: int, num_shards: int) -> Batch | torch.Tensor:
    """This rank's contiguous rows of the global batch (a Batch or a tensor of rows;
    data_shard in 0..num_shards-1); a Batch of candidate rows is cut between examples."""
    rows = batch.rows if isinstance(batch, Batch) else batch.shape[0]
    if num_shards < 1 or not 0 <= data_shard < num_shards:
        raise ZoError(f"data shard {data_shard} is not in 0..{num_shards - 1}")
    k = batch.per_example if isinstance(batch, Batch) else 1
    if (rows // k) % num_shards:
        raise ZoError(f"global batch ({rows // k}) is not divisible by the data shards ({num_shards})")
    per = rows // num_shards
    if isinstance(batch, Batch):
        return batch.select(data_shard * per, (data_shard + 1) * per)
    return batch[data_shard * per:(data_shard + 1) * per]
