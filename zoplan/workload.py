"""Workload: global batch, sequence length and the precisions of one training job."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from zoplan.models import DTYPE_BYTES


@dataclass(frozen=True, kw_only=True)
class Workload:
    batch: int = 16          # global batch (sequences per step, all DDP ranks together)
    seq: int = 2048          # tokens per sequence
    param_dtype: str = "fp16"    # precision the blocks are stored and moved in
    compute_dtype: str = "fp16"  # precision the forward runs in

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.seq < 1:
            raise ValueError(f"seq must be >= 1, got {self.seq}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise ValueError(f"{name} must be one of {', '.join(DTYPE_BYTES)}, "
                                 f"got {getattr(self, name)!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Workload:
        return cls(**data)
