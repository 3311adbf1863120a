"""The zeroth-order estimators a workload may run, and the facts of them both halves share.

An estimator decides the direction d a step perturbs the trainable weights along and
updates them along (theta +- eps*d for the two forwards, g = (l+ - l-) / 2eps, then
theta -= lr * g * d), never stored: regenerated from seeds whenever needed
(docs/estimators.md has the maths and the papers):

- "mezo": d = z ~ N(0, I) over every weight (MeZO-SGD, arXiv 2305.17333).
- "lowrank": every matrix W (m x n) of a block is perturbed along d = U V^T / sqrt(r),
  U (m x r) drawn afresh each step, V (n x r) kept for `lowrank_every` steps (LOZO,
  arXiv 2410.07698; SubZero, arXiv 2410.08989): r(m+n) random values instead of m*n;
  vectors (biases, norms) get z as with mezo.
- "sparse": d = m * z with m the mask of the `sparse_share` smallest-magnitude weights
  of each tensor (Sparse MeZO, arXiv 2402.15751), recomputed from the weights as they
  are at each step (the mask of the perturbation and of its update are the same: the
  update of step t is applied to the weights step t perturbed).

`directions` q > 1 (n-SPSA; ZO-Bench, arXiv 2402.11592, "q-RGE"): q directions a
step, direction j evaluated on the j-th of q equal parts of the global batch (on a
layout with DDP groups, a group's rows lie in one or a few parts: each group perturbs
along its own direction), and theta -= lr * (1/q) sum_j g_j d_j. Each direction sees
1/q of the batch, so a step costs the forward work of one MeZO step plus q-1 more
directions' draws and passes.

Torch-free: the planner prices these settings (zoplan.pricing.estimators) and zoexec draws
them (zoexec.maths.estimators).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoplan.names import ESTIMATORS as ESTIMATORS  # declared there, read here

DEFAULT_ESTIMATOR = "mezo"
DEFAULT_LOWRANK_RANK = 2       # ours; LOZO's experiments use small ranks (its r = 1..8)
DEFAULT_LOWRANK_EVERY = 50     # steps V is kept (LOZO's lazy sampling interval nu)
DEFAULT_SPARSE_SHARE = 0.25    # ours: a quarter of each tensor perturbed
MAX_LOWRANK_RANK = 64
MAX_DIRECTIONS = 64
# sparse: a tensor's threshold is the share-quantile of |w| over every SPARSE_STRIDE-th
# element from its first (a fixed sample: an exact quantile of a whole tensor costs a
# selection over all of it, ~10x a z draw on a CPU)
SPARSE_STRIDE = 16
ESTIMATOR_KEYS = ("estimator", "lowrank_rank", "lowrank_every", "sparse_share", "directions")
DEFAULTS = {"estimator": DEFAULT_ESTIMATOR, "lowrank_rank": DEFAULT_LOWRANK_RANK,
            "lowrank_every": DEFAULT_LOWRANK_EVERY, "sparse_share": DEFAULT_SPARSE_SHARE,
            "directions": 1}
OWN_KEYS = {"mezo": (), "lowrank": ("lowrank_rank", "lowrank_every"),
            "sparse": ("sparse_share",)}


@dataclass(frozen=True, kw_only=True)
class EstimatorSpec:
    """An estimator and its settings (module docstring); ValueError naming a bad one."""

    estimator: str = DEFAULT_ESTIMATOR
    lowrank_rank: int = DEFAULT_LOWRANK_RANK
    lowrank_every: int = DEFAULT_LOWRANK_EVERY
    sparse_share: float = DEFAULT_SPARSE_SHARE
    directions: int = 1

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, "
                             f"got {self.estimator!r}")
        for name, high in (("lowrank_rank", MAX_LOWRANK_RANK), ("lowrank_every", None),
                           ("directions", MAX_DIRECTIONS)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1 \
                    or (high is not None and value > high):
                bound = f" and <= {high}" if high else ""
                raise ValueError(f"{name} must be a whole number >= 1{bound}, got {value!r}")
        share = self.sparse_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) \
                or not math.isfinite(share) or not 0 < share <= 1:
            raise ValueError(f"sparse_share must be a number in (0, 1], got {share!r}")
        object.__setattr__(self, "sparse_share", float(share))
        if self.estimator == "sparse" and self.directions > 1:
            raise ValueError(f"directions {self.directions} with estimator 'sparse': the mask "
                             f"of each direction's update is taken from the weights the step "
                             f"perturbed, which the first direction's update changes; sparse "
                             f"runs one direction a step")
        foreign = [k for k in ("lowrank_rank", "lowrank_every", "sparse_share")
                   if k not in OWN_KEYS[self.estimator] and getattr(self, k) != DEFAULTS[k]]
        if foreign:
            raise ValueError(f"{', '.join(foreign)}: not a setting of estimator "
                             f"{self.estimator!r} (given {', '.join(str(getattr(self, k)) for k in foreign)})")

    @property
    def is_default(self) -> bool:
        """MeZO-SGD with one direction: what a plan without estimator keys runs."""
        return self.estimator == DEFAULT_ESTIMATOR and self.directions == 1

    def to_dict(self) -> dict[str, object]:
        """The estimator's name, its own settings and the directions (no other keys)."""
        return {"estimator": self.estimator,
                **{k: getattr(self, k) for k in OWN_KEYS[self.estimator]},
                "directions": self.directions}

    def describe(self) -> str:
        """One line: "lowrank (rank 2, V every 50 steps), 4 directions"."""
        own = {"mezo": "", "lowrank": f" (rank {self.lowrank_rank}, V every "
                                      f"{self.lowrank_every} steps)",
               "sparse": f" (share {self.sparse_share:g})"}[self.estimator]
        more = f", {self.directions} directions" if self.directions > 1 else ""
        return f"{self.estimator}{own}{more}"


def is_matrix(shape: tuple[int, ...]) -> bool:
    """Whether lowrank perturbs a tensor of this shape as a matrix (2-D or more: the
    first dimension against the rest); vectors get z."""
    return len(shape) >= 2


def matrix_dims(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows m, columns n) of a tensor perturbed as a matrix."""
    return shape[0], math.prod(shape[1:])


def tile_rows(columns: int, chunk: int) -> int:
    """Rows of each tile a lowrank d is computed in (U's rows times V^T, one product a
    tile): about one z chunk's elements, at least one row. A range of a block gets every
    tile it touches computed whole, so a slice gets the whole block's bits."""
    return max(1, chunk // max(1, columns))


def direction_parts(*, examples: int, directions: int, data_shard: int,
                    num_shards: int) -> list[tuple[int, int, int]]:
    """(direction j, first, stop) of each direction's examples in a data shard's rows,
    relative to the shard's first example: direction j owns the global examples
    [j*E/q, (j+1)*E/q), a shard the examples [s*E/S, (s+1)*E/S). ValueError when the
    global batch is not divisible by the directions."""
    if examples % directions:
        raise ValueError(f"the global batch ({examples}) is not divisible by the directions "
                         f"({directions}): each direction evaluates an equal part of it")
    per_dir, per_shard = examples // directions, examples // num_shards
    lo, hi = data_shard * per_shard, (data_shard + 1) * per_shard
    return [(j, max(lo, j * per_dir) - lo, min(hi, (j + 1) * per_dir) - lo)
            for j in range(directions) if max(lo, j * per_dir) < min(hi, (j + 1) * per_dir)]


# ---- sizes the memory model and the pricing need ----------------------------------------------
def largest_tile(shapes: list[tuple[int, ...]], chunk: int) -> int:
    """Elements of the largest lowrank tile over these tensors (0: no matrix)."""
    return max((min(m, tile_rows(n, chunk)) * n for m, n in
                (matrix_dims(s) for s in shapes if is_matrix(s))), default=0)


def factor_numel(shapes: list[tuple[int, ...]], rank: int) -> int:
    """lowrank: U and V of the largest matrix, r(m + n) values (drawn together)."""
    return max(((m + n) * rank for m, n in (matrix_dims(s) for s in shapes if is_matrix(s))),
               default=0)


def sample_numel(numel: int) -> int:
    """sparse: the weights of a tensor of `numel` its threshold is taken over."""
    return -(-numel // SPARSE_STRIDE)


def stream_examples(*, examples: int, directions: int, num_shards: int) -> tuple[int, int]:
    """(forwards a rank runs per sign, examples of its largest one): the directions that
    meet data shard 0 (every shard alike when the counts divide)."""
    parts = direction_parts(examples=examples, directions=directions, data_shard=0,
                            num_shards=num_shards)
    return max(1, len(parts)), max((hi - lo for _, lo, hi in parts), default=0)
