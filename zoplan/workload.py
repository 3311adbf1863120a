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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from zoplan.lengths import RowLengths, expected_width
from zoplan.models import DTYPE_BYTES

UPDATE_MODES = ("master", "stochastic", "plain")
MAX_BATCH = 2**24        # sequences per step
MAX_SEQ = 2**24          # tokens per sequence (zoplan.models.SHAPE_BOUNDS' positions)
HALF_DTYPES = ("fp16", "bf16")


def default_update(param_dtype: str) -> str:
    """The update mode a workload gets when none is named: fp32 blocks are their own
    masters; 16-bit blocks are rounded stochastically (round to nearest loses most
    MeZO updates)."""
    return "master" if param_dtype == "fp32" else "stochastic"


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
        if not self.update:
            object.__setattr__(self, "update", default_update(self.param_dtype))
        if self.update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {', '.join(UPDATE_MODES)}, "
                             f"got {self.update!r}")
        if (self.update == "master") != (self.param_dtype == "fp32"):
            raise ValueError(f"update {self.update!r} with param_dtype {self.param_dtype!r}: "
                             f"'master' keeps fp32 blocks, 'stochastic' and 'plain' 16-bit ones")
        if not isinstance(self.tf32, bool):
            raise ValueError(f"tf32 must be true or false, got {self.tf32!r}")
        if self.lengths is not None and not isinstance(self.lengths, RowLengths):
            raise ValueError(f"lengths must be a RowLengths, got {self.lengths!r}")

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

    def priced_tokens(self, ddp: int) -> int | float:
        """Tokens one DDP rank's forward is priced at (padding included)."""
        return self.batch // ddp * self.rows_per_example * self.priced_seq

    def to_dict(self) -> dict:
        """The fields; with row lengths also `lengths` and the derived `priced_seq`."""
        out = asdict(self)
        del out["lengths"]
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
        the 16-bit compute dtype (fp32 compute admits only 'master')."""
        if compute_dtype == "fp32" and update != "master":
            raise ValueError(f"update {update!r} rounds to 16-bit storage, but the compute "
                             f"precision is fp32: use 'master'")
        param = "fp32" if update == "master" else compute_dtype
        return cls(batch=batch, seq=seq, param_dtype=param, compute_dtype=compute_dtype,
                   update=update, tf32=tf32, lengths=lengths)
