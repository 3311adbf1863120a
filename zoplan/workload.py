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
the block modules named in `lora_targets`); "prefix" freezes the base and trains
`prefix_tokens` keys and values per block (zoplan.prefix). With either the base is
read-only (`frozen_base`): stored as it computes (param_dtype == compute_dtype, no fp32
masters), never updated nor written back; the adapters or prefixes are fp32 masters on
every rank, so `update` is "master". A workload's dict (to_dict) holds only its own
tuning's keys: plans of full runs keep their bytes.

Estimator (zoplan.estimators, docs/estimators.md): the direction a step perturbs and
updates along ("mezo", "lowrank", "sparse", their settings) and the directions a step
(`directions`); MeZO-SGD with one direction writes no estimator keys either.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

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
from zoplan.prefix import DEFAULT_PREFIX_TOKENS, MAX_PREFIX_TOKENS

UPDATE_MODES = ("master", "stochastic", "plain")
# How a GPU rank runs the zo passes (zoplan.pricing.zo): "torch", one torch kernel per
# operation and z drawn into a buffer (zoexec.maths.zo, what runs today); "fused", one
# kernel per pass that regenerates z (and the rounding's noise) from a counter-based
# generator, updates, rounds and writes the next perturbation in one read and one write
# of the weights. A plan of the torch path writes no key (its bytes as before).
UPDATE_KERNELS = ("torch", "fused")
MAX_BATCH = 2**24        # sequences per step
MAX_SEQ = 2**24          # tokens per sequence (zoplan.models.SHAPE_BOUNDS' positions)
HALF_DTYPES = ("fp16", "bf16")
LORA_KEYS = ("tuning", "lora_r", "lora_alpha", "lora_targets")
PREFIX_KEYS = ("tuning", "prefix_tokens")
FROZEN_BASE = ("lora", "prefix")   # tunings that train small tensors over a read-only base


def default_update(param_dtype: str, tuning: str = "full") -> str:
    """The update mode a workload gets when none is named: fp32 blocks are their own
    MeZO updates); LoRA's adapters and prefixes are fp32 masters."""
    return "master" if param_dtype == "fp32" or tuning in FROZEN_BASE else "stochastic"


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
    tuning: str = "full"         # "full" (every weight), "lora" (adapters on a frozen base)
                                 # or "prefix" (prefix keys and values on a frozen base)
    lora_r: int = DEFAULT_LORA_R             # LoRA: rank of the adapters
    lora_alpha: int = DEFAULT_LORA_ALPHA     # LoRA: scale alpha / r
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS   # LoRA: block modules adapted
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS   # prefix: keys and values per block
    estimator: str = DEFAULT_ESTIMATOR               # mezo, lowrank or sparse
    lowrank_rank: int = DEFAULT_LOWRANK_RANK         # lowrank: r of U V^T
    lowrank_every: int = DEFAULT_LOWRANK_EVERY       # lowrank: steps V is kept
    sparse_share: float = DEFAULT_SPARSE_SHARE       # sparse: share perturbed
    directions: int = 1          # directions a step (each on its part of the batch)
    update_kernel: str = "torch"   # the zo passes on a GPU (UPDATE_KERNELS)

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
        if self.update_kernel not in UPDATE_KERNELS:
            raise ValueError(f"update_kernel must be one of {', '.join(UPDATE_KERNELS)}, "
                             f"got {self.update_kernel!r}")
        if self.update_kernel == "fused" and (self.tuning != "full"
                                              or not self.estimator_spec.is_default):
            raise ValueError("update_kernel 'fused' prices full tuning with MeZO-SGD's one "
                             "direction only; LoRA, prefix and the other estimators run the "
                             "torch path")
        if self.update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {', '.join(UPDATE_MODES)}, "
                             f"got {self.update!r}")
        if self.frozen_base:
            self._check_frozen()
        elif (self.update == "master") != (self.param_dtype == "fp32"):
            raise ValueError(f"update {self.update!r} with param_dtype {self.param_dtype!r}: "
                             f"'master' keeps fp32 blocks, 'stochastic' and 'plain' 16-bit ones")
        if not isinstance(self.tf32, bool):
            raise ValueError(f"tf32 must be true or false, got {self.tf32!r}")
        if self.lengths is not None and not isinstance(self.lengths, RowLengths):
            raise ValueError(f"lengths must be a RowLengths, got {self.lengths!r}")
        spec = self.estimator_spec
        object.__setattr__(self, "sparse_share", spec.sparse_share)
        if self.tuning == "prefix" and not spec.is_default:
            raise ValueError(f"estimator {spec.describe()} with tuning prefix: prefix tuning "
                             f"runs MeZO-SGD with one direction only (docs/estimators.md)")
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
        if self.tuning != "lora" and (self.lora_r, self.lora_alpha, targets) != (
                DEFAULT_LORA_R, DEFAULT_LORA_ALPHA, DEFAULT_LORA_TARGETS):
            raise ValueError(f"lora_r, lora_alpha and lora_targets are settings of tuning "
                             f"'lora', got them with tuning {self.tuning!r} (r {self.lora_r}, "
                             f"alpha {self.lora_alpha}, targets {','.join(targets)})")
        self._check_prefix()

    def _check_prefix(self) -> None:
        tokens = self.prefix_tokens
        if not isinstance(tokens, int) or isinstance(tokens, bool) \
                or not 1 <= tokens <= MAX_PREFIX_TOKENS:
            raise ValueError(f"prefix_tokens must be a whole number in 1..{MAX_PREFIX_TOKENS}, "
                             f"got {tokens!r}")
        if self.tuning != "prefix" and tokens != DEFAULT_PREFIX_TOKENS:
            raise ValueError(f"prefix_tokens is a setting of tuning 'prefix', got "
                             f"{tokens} with tuning {self.tuning!r}")

    def _check_frozen(self) -> None:
        """LoRA and prefix: the base is stored as it computes (no masters: it is never
        updated); the adapters or prefixes are fp32 masters ("master")."""
        if self.update != "master":
            raise ValueError(f"update {self.update!r} with tuning {self.tuning!r}: the "
                             f"trained tensors are fp32 masters ('master'); the base is never "
                             f"updated")
        if self.param_dtype != self.compute_dtype:
            raise ValueError(f"param_dtype {self.param_dtype!r} with compute_dtype "
                             f"{self.compute_dtype!r} and tuning {self.tuning!r}: the frozen "
                             f"base is stored as it computes")

    @property
    def is_lora(self) -> bool:
        return self.tuning == "lora"

    @functools.cached_property
    def estimator_spec(self) -> EstimatorSpec:
        """The estimator and its settings (ValueError for a bad one; cached: the search
        asks thousands of times, and the workload is frozen)."""
        return EstimatorSpec(**{k: getattr(self, k) for k in ESTIMATOR_KEYS})

    @property
    def is_prefix(self) -> bool:
        return self.tuning == "prefix"

    @property
    def frozen_base(self) -> bool:
        """LoRA or prefix: small fp32 tensors trained over a read-only base."""
        return self.tuning in FROZEN_BASE

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

    def to_dict(self) -> dict[str, Any]:
        """The plan's workload: a full workload without the tuning keys (its bytes as
        before LoRA), a LoRA or prefix one with its own; the estimator's keys unless it is
        MeZO-SGD with one direction (zoplan.estimators); with row lengths also `lengths`
        and the derived `priced_seq`."""
        out = asdict(self)
        del out["lengths"]
        keep = {"lora": LORA_KEYS, "prefix": PREFIX_KEYS}.get(self.tuning, ())
        for key in {*LORA_KEYS, *PREFIX_KEYS} - set(keep):
            del out[key]
        if self.is_lora:
            out["lora_targets"] = list(self.lora_targets)
        for key in ESTIMATOR_KEYS:
            del out[key]
        if self.update_kernel == "torch":
            del out["update_kernel"]
        if not self.estimator_spec.is_default:
            out.update(self.estimator_spec.to_dict())
        if self.lengths is not None:
            out["lengths"] = self.lengths.to_dict()
            out["priced_seq"] = self.priced_seq
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
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

    @classmethod
    def for_prefix(cls, *, batch: int, seq: int, compute_dtype: str, tf32: bool = True,
                   tokens: int = DEFAULT_PREFIX_TOKENS) -> Workload:
        """A prefix-tuning workload: the base stored in the compute dtype, fp32 prefixes."""
        return cls(batch=batch, seq=seq, param_dtype=compute_dtype, compute_dtype=compute_dtype,
                   update="master", tf32=tf32, tuning="prefix", prefix_tokens=tokens)
