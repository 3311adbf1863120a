"""Workload: global batch, sequence length, and how one training job keeps and updates
its weights.

Precision is three choices (docs/precision.md):
- `compute_dtype`: what the forward runs in (fp16, bf16 or fp32; fp32 GEMMs on CUDA use
  TF32 tensor cores when `tf32` is allowed);
- `param_dtype`: what the blocks are stored in (host store, uploads, write-back);
- `update`: how the MeZO update reaches the stored weights:
    master      fp32 master weights: the blocks are stored, moved and updated in fp32
                and cast to the compute dtype on the device (param_dtype fp32);
    stochastic  16-bit storage; the update (and weight decay) is computed in fp32 and
                rounded stochastically when written back, seeded by (step seed, block,
                tensor): unbiased in expectation, every rank rounds alike;
    plain       16-bit storage, round to nearest: updates below half a unit in the last
                place are lost (only when asked for).

Tuning (docs/lora.md): "full" trains every weight (the above); "lora" freezes the base
and trains LoRA adapters (zoplan.lora: rank `lora_r`, scale `lora_alpha` / `lora_r`, on
the block modules named in `lora_targets`). The base is read-only: stored as it
computes (param_dtype == compute_dtype, no fp32 masters), never updated nor written
back; the adapters are fp32 masters on every rank, so `update` is "master". A full
workload's dict (to_dict) holds no tuning keys: plans of full runs keep their bytes.

Estimator (zoplan.estimators, docs/estimators.md): the direction a step perturbs and
updates along ("mezo", "lowrank", "sparse", their settings) and the directions a step
(`directions`); MeZO-SGD with one direction writes no estimator keys either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from zoplan.estimators import (
    DEFAULT_ESTIMATOR,
    DEFAULT_LOWRANK_EVERY,
    DEFAULT_LOWRANK_RANK,
    DEFAULT_SPARSE_SHARE,
    ESTIMATOR_KEYS,
    EstimatorSpec,
)
from zoplan.lengths import RowLengths, expected_width
from zoplan.lora import (
    DEFAULT_LORA_ALPHA,
    DEFAULT_LORA_R,
    DEFAULT_LORA_TARGETS,
    MAX_LORA_R,
    TUNINGS,
)
from zoplan.models import DTYPE_BYTES

UPDATE_MODES = ("master", "stochastic", "plain")
MAX_BATCH = 2**24        # sequences per step
MAX_SEQ = 2**24          # tokens per sequence (zoplan.models.SHAPE_BOUNDS' positions)
HALF_DTYPES = ("fp16", "bf16")
LORA_KEYS = ("tuning", "lora_r", "lora_alpha", "lora_targets")


def default_update(param_dtype: str, tuning: str = "full") -> str:
    """The update mode a workload gets when none is named: fp32 blocks are their own
    masters; 16-bit blocks are rounded stochastically (round to nearest loses most
    MeZO updates); LoRA's adapters are fp32 masters."""
    return "master" if param_dtype == "fp32" or tuning == "lora" else "stochastic"


@dataclass(frozen=True, kw_only=True)
class Workload:
    batch: int = 16          # global batch (sequences per step, all DDP ranks together)
    seq: int = 2048          # tokens per sequence
    param_dtype: str = "fp16"    # precision the blocks are stored and moved in
    compute_dtype: str = "fp16"  # precision the forward runs in
    update: str = ""             # how updates reach the stored weights (UPDATE_MODES);
                                 # default: master for fp32 blocks, else stochastic
    tf32: bool = True            # fp32 GEMMs on CUDA may use TF32 tensor cores
    lengths: RowLengths | None = None   # the data's row lengths (`zoplan optimize
                                        # --lengths`): steps priced at the padded width
    tuning: str = "full"         # "full" (every weight) or "lora" (adapters on a frozen base)
    lora_r: int = DEFAULT_LORA_R             # LoRA: rank of the adapters
    lora_alpha: int = DEFAULT_LORA_ALPHA     # LoRA: scale alpha / r
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS   # LoRA: block modules adapted
    estimator: str = DEFAULT_ESTIMATOR               # mezo, lowrank or sparse
    lowrank_rank: int = DEFAULT_LOWRANK_RANK         # lowrank: r of U V^T
    lowrank_every: int = DEFAULT_LOWRANK_EVERY       # lowrank: steps V is kept
    sparse_share: float = DEFAULT_SPARSE_SHARE       # sparse: share perturbed
    directions: int = 1          # directions a step (each on its part of the batch)

    def __post_init__(self) -> None:
        for name in ("batch", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise ValueError(f"{name} must be one of {', '.join(DTYPE_BYTES)}, "
                                 f"got {getattr(self, name)!r}")
        self._check_tuning()
        if not self.update:
            object.__setattr__(self, "update", default_update(self.param_dtype, self.tuning))
        if self.update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {', '.join(UPDATE_MODES)}, "
                             f"got {self.update!r}")
        if self.tuning == "lora":
            self._check_lora()
        elif (self.update == "master") != (self.param_dtype == "fp32"):
            raise ValueError(f"update {self.update!r} with param_dtype {self.param_dtype!r}: "
                             f"'master' keeps fp32 blocks, 'stochastic' and 'plain' 16-bit ones")
        if not isinstance(self.tf32, bool):
            raise ValueError(f"tf32 must be true or false, got {self.tf32!r}")
        if self.lengths is not None and not isinstance(self.lengths, RowLengths):
            raise ValueError(f"lengths must be a RowLengths, got {self.lengths!r}")
        spec = self.estimator_spec
        object.__setattr__(self, "sparse_share", spec.sparse_share)
        if self.batch % self.directions:
            raise ValueError(f"batch ({self.batch}) must be divisible by directions "
                             f"({self.directions}): each direction evaluates an equal part "
                             f"of the global batch")

    def _check_tuning(self) -> None:
        if self.tuning not in TUNINGS:
            raise ValueError(f"tuning must be one of {', '.join(TUNINGS)}, got {self.tuning!r}")
        if isinstance(self.lora_targets, list):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        for name in ("lora_r", "lora_alpha"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.lora_r > MAX_LORA_R:
            raise ValueError(f"lora_r must be <= {MAX_LORA_R}, got {self.lora_r}")
        targets = self.lora_targets
        if (not isinstance(targets, tuple) or not targets or len(set(targets)) != len(targets)
                or not all(isinstance(t, str) and t.isidentifier() for t in targets)):
            raise ValueError(f"lora_targets must be distinct module names (e.g. q_proj, "
                             f"v_proj), got {targets!r}")
        if self.tuning == "full" and (self.lora_r, self.lora_alpha, targets) != (
                DEFAULT_LORA_R, DEFAULT_LORA_ALPHA, DEFAULT_LORA_TARGETS):
            raise ValueError(f"lora_r, lora_alpha and lora_targets are settings of tuning "
                             f"'lora', got them with tuning 'full' (r {self.lora_r}, alpha "
                             f"{self.lora_alpha}, targets {','.join(targets)})")

    def _check_lora(self) -> None:
        """LoRA: the base is stored as it computes (no masters: it is never updated);
        the adapters are fp32 masters ("master")."""
        if self.update != "master":
            raise ValueError(f"update {self.update!r} with tuning 'lora': the adapters are "
                             f"fp32 masters ('master'); the base is never updated")
        if self.param_dtype != self.compute_dtype:
            raise ValueError(f"param_dtype {self.param_dtype!r} with compute_dtype "
                             f"{self.compute_dtype!r} and tuning 'lora': the frozen base is "
                             f"stored as it computes")

    @property
    def is_lora(self) -> bool:
        return self.tuning == "lora"

    @property
    def estimator_spec(self) -> EstimatorSpec:
        """The estimator and its settings (ValueError for a bad one)."""
        return EstimatorSpec(**{k: getattr(self, k) for k in ESTIMATOR_KEYS})

    def check_bounds(self) -> None:
        """Raise ValueError for sizes no plan may hold (a search prunes what does not
        fit memory instead)."""
        for name, high in (("batch", MAX_BATCH), ("seq", MAX_SEQ)):
            if getattr(self, name) > high:
                raise ValueError(f"{name} must be <= {high}, got {getattr(self, name)}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    @property
    def priced_seq(self) -> int | float:
        """The width the step is priced at: `seq`, or with row lengths the expected
        padded width of a batch, at most `seq` (zoplan.lengths). Memory is sized for seq."""
        if self.lengths is None:
            return self.seq
        return expected_width(self.lengths.histogram, batch=self.batch, cap=self.seq)

    @property
    def rows_per_example(self) -> int:
        return 1 if self.lengths is None else self.lengths.rows_per_example

    @property
    def head_share(self) -> float:
        """The share of the priced tokens whose final norm and LM head a run computes:
        the labelled positions (zoplan.lengths' head_positions) over the priced row
        tokens of an example; 1 without row lengths (packed text: nearly every position)."""
        if self.lengths is None or self.lengths.head_positions is None:
            return 1.0
        return min(1.0, self.lengths.head_positions / (self.rows_per_example * self.priced_seq))

    def priced_tokens(self, ddp: int) -> int | float:
        """Tokens one DDP rank's forward is priced at (padding included)."""
        return self.batch // ddp * self.rows_per_example * self.priced_seq

    def to_dict(self) -> dict:
        """The plan's workload: a full workload without the tuning keys (its bytes as
        before LoRA), a LoRA one with them; the estimator's keys unless it is MeZO-SGD
        with one direction (zoplan.estimators); with row lengths also `lengths` and the
        derived `priced_seq`."""
        out = asdict(self)
        del out["lengths"]
        if not self.is_lora:
            for key in LORA_KEYS:
                del out[key]
        else:
            out["lora_targets"] = list(self.lora_targets)
        for key in ESTIMATOR_KEYS:
            del out[key]
        if not self.estimator_spec.is_default:
            out.update(self.estimator_spec.to_dict())
        if self.lengths is not None:
            out["lengths"] = self.lengths.to_dict()
            out["priced_seq"] = self.priced_seq
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Workload:
        """The inverse of to_dict; a written priced_seq must be the one derived."""
        data = dict(data)
        priced = data.pop("priced_seq", None)
        if data.get("lengths") is not None:
            data["lengths"] = RowLengths.from_dict(data["lengths"])
        workload = cls(**data)
        if (priced is not None or workload.lengths is not None) \
                and priced != workload.priced_seq:
            raise ValueError(f"priced_seq must be {workload.priced_seq!r} (derived from "
                             f"lengths), got {priced!r}")
        return workload

    @classmethod
    def for_update(cls, *, batch: int, seq: int, compute_dtype: str, update: str,
                   tf32: bool = True, lengths: RowLengths | None = None) -> Workload:
        """The workload of an update mode: 'master' stores fp32 blocks, the others store
        the 16-bit compute dtype (fp32 compute admits only 'master'). Full tuning."""
        if compute_dtype == "fp32" and update != "master":
            raise ValueError(f"update {update!r} rounds to 16-bit storage, but the compute "
                             f"precision is fp32: use 'master'")
        param = "fp32" if update == "master" else compute_dtype
        return cls(batch=batch, seq=seq, param_dtype=param, compute_dtype=compute_dtype,
                   update=update, tf32=tf32, lengths=lengths)

    @classmethod
    def for_lora(cls, *, batch: int, seq: int, compute_dtype: str, tf32: bool = True,
                 r: int = DEFAULT_LORA_R, alpha: int = DEFAULT_LORA_ALPHA,
                 targets: tuple[str, ...] = DEFAULT_LORA_TARGETS) -> Workload:
        """A LoRA workload: the base stored in the compute dtype, fp32 adapters."""
        return cls(batch=batch, seq=seq, param_dtype=compute_dtype, compute_dtype=compute_dtype,
                   update="master", tf32=tf32, tuning="lora", lora_r=r, lora_alpha=alpha,
                   lora_targets=tuple(targets))
