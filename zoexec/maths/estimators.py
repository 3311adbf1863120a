"""The estimators' directions (zoplan.estimators): d of a block, or of a flat range of it,
drawn into a buffer for the perturbation and again for the deferred update.

Addressing (the contract every rank relies on, as z's in zoexec.maths.zo):
- direction j of a step with seed s draws from seed s_j = direction_seed(s, j)
  (s itself for j = 0, so one direction is MeZO's seed rule);
- "mezo": d = z of (s_j, block, tensor, chunk) (zo.z_block);
- "lowrank": a matrix tensor i (zoplan.estimators.is_matrix; m x n) gets
  d = U V^T / sqrt(r): U (m x r, row-major) drawn whole with normal_ from
  mix_seed(s_j, block, i, LOWRANK_U) and scaled by 1/sqrt(r) element-wise, V (n x r)
  from mix_seed(v_seed(run seed, step // every), block, i, LOWRANK_V) (the same V for
  `lowrank_every` steps, whatever the direction); d is computed in tiles of
  zoplan.estimators.tile_rows rows (one product of U's rows by V^T each, in fp32) and
  a range gets every tile it touches computed whole and cut, so a slice holds exactly
  the whole block's bits. Vectors get z, with the seeds and chunks z has.
- "sparse": d = z where |theta| <= h_i, 0 elsewhere, h_i the `sparse_share`-quantile of
  |theta| over every zoplan.estimators.SPARSE_STRIDE-th element of tensor i of the
  weights the step perturbs (a fixed sample). The update of step t is applied to those
  same weights (the deferred update comes before anything else changes them), so the
  update's mask is the perturbation's. A range cannot see a whole tensor: the
  thresholds computed when the whole block was drawn are kept (the last two steps') for
  the update on the slice; a resume's replay updates whole blocks.
Nothing of the model's size is kept: U and V are drawn again where needed (r(m+n)
values a matrix), the tiles use one fp32 scratch of a z chunk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from zoexec.maths.zo import _chunk_of, _spec_fields, mix_seed, z_block, z_range
from zoplan.estimators import (
    SPARSE_STRIDE,
    EstimatorSpec,
    is_matrix,
    largest_tile,
    matrix_dims,
    tile_rows,
)

LOWRANK_U, LOWRANK_V, DIRECTION_TAG = 0x4C55, 0x4C56, 0x4452
Thresholds = dict[tuple[int, int], list[torch.Tensor]]   # (step, block) -> each tensor's h_i


class FlatTensor(Protocol):
    """A tensor's place in a block's flat buffer (zoexec.model.families.TensorSpec)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def offset(self) -> int: ...

    @property
    def numel(self) -> int: ...

    @property
    def stop(self) -> int: ...


def direction_seed(seed: int, index: int) -> int:
    """The seed of direction `index` of a step whose seed is `seed`."""
    return seed if index == 0 else mix_seed(seed, DIRECTION_TAG, index)


def v_seed(run_seed: int, step: int, every: int) -> int:
    """lowrank: the seed of V during the `every` steps that hold `step`."""
    return mix_seed(run_seed, LOWRANK_V, step // every)


def _gaussian(seed: int, rows: int, cols: int, device: torch.device | str) -> torch.Tensor:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.empty(rows, cols, dtype=torch.float32, device=device).normal_(generator=gen)


def lowrank_factors(seed: int, vseed: int, block: int, index: int, shape: Sequence[int], rank: int,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(U / sqrt(r), V) of matrix tensor `index` of `block` (fp32, on `device`)."""
    m, n = matrix_dims(tuple(shape))
    u = _gaussian(mix_seed(seed, block, index, LOWRANK_U), m, rank, device)
    u.mul_(1.0 / math.sqrt(rank))
    return u, _gaussian(mix_seed(vseed, block, index, LOWRANK_V), n, rank, device)


class Directions:
    """Draws the estimator's d (module docstring) into flat buffers; one per stream of
    work that may run concurrently (its own scratch). `thresholds` (sparse) may be shared."""

    def __init__(self, spec: EstimatorSpec, *, run_seed: int, device: torch.device | str,
                 thresholds: Thresholds | None = None, shapes: Iterable[Sequence[int]] = ()) -> None:
        """`shapes`: of every tensor it will draw (the lowrank tile is sized for the
        largest: zoplan.estimators.largest_tile; drawn tensors beyond them grow it)."""
        self.spec, self.run_seed, self.device = spec, run_seed, torch.device(device)
        self.chunk = _chunk_of(self.device)
        self.thresholds: Thresholds = {} if thresholds is None else thresholds
        self.tile_numel = largest_tile([tuple(s) for s in shapes], self.chunk)
        self._tile: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return self.spec.estimator

    def fill(self, out: torch.Tensor, *, seed: int, step: int, block: int, specs: Sequence[FlatTensor],
             theta: torch.Tensor | None = None, start: int | None = None,
             edge: torch.Tensor | None = None) -> torch.Tensor:
        """d of step `step` (direction seed `seed`) of `block` into `out`: the whole block
        (start None; `out` as long as the block) or its flat range [start, start +
        len(out)) (the update on the slice; `edge`: z's scratch for the chunks it cuts).
        `theta`: the weights the step perturbs, over the same range (sparse)."""
        if self.name == "lowrank":
            self._lowrank(out, seed=seed, step=step, block=block, specs=specs, start=start,
                          edge=edge)
        else:
            _z(out, seed, block, specs, start=start, edge=edge)
        if self.name == "sparse":
            self._mask(out, theta, step=step, block=block, specs=specs, start=start)
        return out

    # ---- lowrank -------------------------------------------------------------------------
    def _lowrank(self, out: torch.Tensor, *, seed: int, step: int, block: int,
                 specs: Sequence[FlatTensor], start: int | None, edge: torch.Tensor | None) -> None:
        vectors: list[tuple[int, int]] = [(s.offset, 0) if is_matrix(s.shape) else (s.offset, s.numel) for s in specs]
        _z(out, seed, block, vectors, start=start, edge=edge)
        lo = 0 if start is None else start
        hi = lo + out.numel()
        vseed = v_seed(self.run_seed, step, self.spec.lowrank_every)
        for index, spec in enumerate(specs):
            if not is_matrix(spec.shape) or spec.offset >= hi or spec.stop <= lo:
                continue
            self._tiles(out, *lowrank_factors(seed, vseed, block, index, spec.shape,
                                              self.spec.lowrank_rank, device=out.device),
                        offset=spec.offset, lo=lo, hi=hi)   # U, V freed before the next

    def _tiles(self, out: torch.Tensor, u: torch.Tensor, v: torch.Tensor, *, offset: int, lo: int,
               hi: int) -> None:
        """Rows of U V^T into out (block coordinates [lo, hi)), tile by tile."""
        m, n = u.shape[0], v.shape[0]
        rows = tile_rows(n, self.chunk)
        first = max(0, (lo - offset) // n // rows * rows)
        for r0 in range(first, m, rows):
            a, b = offset + r0 * n, offset + min(m, r0 + rows) * n   # the tile in the block
            if a >= hi:
                break
            inside = a >= lo and b <= hi
            if inside and out.dtype == torch.float32:
                torch.mm(u[r0:r0 + rows], v.T, out=out[a - lo:b - lo].view(-1, n))
                continue
            tile = self._scratch(b - a).view(-1, n)
            torch.mm(u[r0:r0 + rows], v.T, out=tile)
            x, y = max(a, lo), min(b, hi)
            out[x - lo:y - lo].copy_(tile.view(-1)[x - a:y - a])

    def _scratch(self, numel: int) -> torch.Tensor:
        """The fp32 tile scratch (made at the first tile that is not written in place:
        a 16-bit d, or a tile a range cuts)."""
        if self._tile is None or self._tile.numel() < numel:
            self._tile = None
            self._tile = torch.empty(max(numel, self.tile_numel), dtype=torch.float32,
                                     device=self.device)
        return self._tile[:numel]

    # ---- sparse --------------------------------------------------------------------------
    def _mask(self, out: torch.Tensor, theta: torch.Tensor | None, *, step: int, block: int,
              specs: Sequence[FlatTensor], start: int | None) -> None:
        """Zero d where |theta| > the tensor's threshold, chunk by chunk (times the mask:
        a third of masked_fill_'s time here; a negative z becomes -0, which moves no
        weight either)."""
        assert theta is not None and theta.numel() >= out.numel(), "sparse needs theta"
        lo = 0 if start is None else start
        hi = lo + out.numel()
        if start is None:
            self._remember(step, block, self.threshold_values(theta, specs))
        found = self.thresholds.get((step, block))
        assert found is not None, f"no sparse thresholds of step {step}, block {block}"
        for index, spec in enumerate(specs):
            a, b = max(spec.offset, lo), min(spec.stop, hi)
            for x in range(a, b, self.chunk):
                y = min(b, x + self.chunk)
                out[x - lo:y - lo].mul_(theta[x - lo:y - lo].abs() <= found[index])

    def threshold_values(self, theta: torch.Tensor, specs: Sequence[FlatTensor]) -> list[torch.Tensor]:
        """Each tensor's h_i from the whole block's weights `theta` (module docstring),
        as device scalars (never read on the host: no wait for the device)."""
        out = []
        for spec in specs:
            sample = theta[spec.offset:spec.stop:SPARSE_STRIDE].abs().float()
            k = max(1, math.ceil(self.spec.sparse_share * sample.numel()))
            out.append(sample.kthvalue(k).values if sample.numel()
                       else torch.zeros((), device=theta.device))
        return out

    def _remember(self, step: int, block: int, values: list[torch.Tensor]) -> None:
        """Keep the thresholds of (step, block); drop those of steps before step - 1."""
        self.thresholds[(step, block)] = values
        for key in [k for k in self.thresholds if k[0] < step - 1]:
            del self.thresholds[key]


def _z(out: torch.Tensor, seed: int, block: int, specs: Sequence[FlatTensor] | Sequence[tuple[int, int]], *,
       start: int | None, edge: torch.Tensor | None) -> None:
    """z of the block (start None) or of the range [start, start + len(out))."""
    if start is None:
        z_block(seed, block, specs, out=out)
    else:
        z_range(seed, block, specs, start, start + out.numel(), out=out, scratch=edge)


def spec_stop(spec: FlatTensor | tuple[int, int]) -> int:
    offset, numel = _spec_fields(spec)
    return offset + numel
