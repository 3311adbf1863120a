"""The step's streams of one rank (zoexec.train.engine's module docstring): which
forwards it makes (direction, sign, its examples), their batches, the resident parts'
perturbation and embedding at the start of a step, and the head's summed losses in the
all-reduce vector at its end. `StreamEnds` is a part of `Trainer`."""

from __future__ import annotations

import torch

from zoexec.data.batch import Batch, as_batch, shard
from zoexec.maths.zo import RESIDENT_BLOCK, perturb_into
from zoexec.model import heads
from zoexec.train.state import Hidden, Stream
from zoexec.train.updates import ZoUpdates
from zoplan.estimators import direction_parts

SIGNS: dict[str, tuple[float, ...]] = {"+-": (1.0, -1.0), "+": (1.0,), "-": (-1.0,)}


def rank_streams(*, signs: tuple[float, ...], examples: int, directions: int, data_shard: int,
                 num_shards: int) -> tuple[Stream, ...]:
    """The rank's forwards of a step: each direction whose part of the global batch
    meets the rank's shard (zoplan.estimators.direction_parts), with each sign of its
    role."""
    parts = direction_parts(examples=examples, directions=directions, data_shard=data_shard,
                            num_shards=num_shards)
    return tuple(Stream(direction=j, sign=sign, first=lo, stop=hi)
                 for j, lo, hi in parts for sign in signs)


class StreamEnds(ZoUpdates):
    """The ends of a step: its batches, the embedding, the head (see the module
    docstring); a part of `Trainer`, whose state it reads."""

    def _batches(self, step: int) -> list[Batch]:
        """Each stream's rows of the rank's shard of the step's batch, on the device (one
        batch for every stream with one direction; each part found on the host)."""
        wl = self.cfg.workload
        assert self.source is not None, "a Trainer without data only evaluates"
        rows = as_batch(self.source.batch(step, wl.batch, wl.seq))
        mine = shard(rows, data_shard=self.data_shard, num_shards=self.env.layout.ddp)
        if self.estimator.directions == 1:
            return [mine.to(self.env.device)] * len(self.streams)
        k = mine.per_example
        parts: dict[tuple[int, int], Batch] = {}
        for st in self.streams:
            if (st.first, st.stop) not in parts:
                parts[(st.first, st.stop)] = mine.select(st.first * k, st.stop * k).to(self.env.device)
        return [parts[(st.first, st.stop)] for st in self.streams]

    def _eval_embed(self, ids: torch.Tensor) -> Hidden:
        """An evaluation's (hidden, ctx) entering block 0 (prefix tuning: after its prefix)."""
        return self.parts.embed(ids)

    def _embed(self, seed: int, batches: list[Batch]) -> list[Hidden]:
        """The resident parts' pending updates, then per stream its perturbation (d
        drawn again when the direction changes) and the embedding of its rows."""
        specs = self.parts.resident_specs
        terms = self._terms() if self.zk else None   # the counter paths: with the first perturbation
        if terms is None:
            self._apply_pending(self.theta_r, RESIDENT_BLOCK, specs, self.z_r)
        acts: list[Hidden] = []
        drawn: int | None = None
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

    def _head(self, acts: list[Hidden], batches: list[Batch],
              flags: tuple[float, ...]) -> torch.Tensor:
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


def loss_vector(flags: tuple[float, ...], device: torch.device, *,
                directions: int = 1) -> torch.Tensor:
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


def add_at(vec: torch.Tensor, index: int, value: float | torch.Tensor) -> None:
    """vec[index] += value (a Python number or a device scalar), on the device."""
    vec[index:index + 1].add_(value)
