"""What a run leaves behind: the per-step (seed, g, loss) log and the final weights.

losses.jsonl: one JSON object per step (StepRecord.to_dict): step, seed, loss_plus,
loss_minus, g, loss, tokens_per_s, step_time_s. The (seed, g) pairs are the whole
training history of MeZO: initial weights + this log rebuild the model (seed replay).
The log is appended to `.losses.jsonl.partial` while the run goes and renamed to
losses.jsonl when it completes; final/ (config.json + model.safetensors, loadable by
from_pretrained) is written into a temporary folder and renamed, so an output is
either whole or absent.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from zoplan.errors import ZoError


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One training step as every rank knows it after the loss all-reduce."""

    step: int
    seed: int
    loss_plus: float
    loss_minus: float
    g: float
    tokens_per_s: float = 0.0
    step_time_s: float = 0.0

    @property
    def loss(self) -> float:
        return 0.5 * (self.loss_plus + self.loss_minus)

    def to_dict(self) -> dict:
        return {**asdict(self), "loss": self.loss}


class LossLog:
    """Rank 0's loss log: appended step by step, made final by `close`."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.partial = self.out_dir / ".losses.jsonl.partial"
        self._handle = self.partial.open("w")

    def append(self, record: StepRecord) -> None:
        self._handle.write(json.dumps(record.to_dict()) + "\n")
        self._handle.flush()

    def close(self) -> Path:
        self._handle.close()
        final = self.out_dir / "losses.jsonl"
        os.replace(self.partial, final)
        return final

    def abandon(self) -> None:
        """Leave the partial log (a failed run's history) but never losses.jsonl."""
        if not self._handle.closed:
            self._handle.close()


def read_losses(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ZoError(f"loss log {path} does not exist")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export_final(parts, block_flats, out_dir: Path, *, resident=None) -> Path:
    """Write out_dir/final/ (config.json + model.safetensors) atomically, in the stored
    precision (fp32 masters with update "master"); `resident`: the resident weights'
    clean flat copy (models.hf_state_dict)."""
    from zoexec.models import export_hf_model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".final.tmp"
    final = out_dir / "final"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_hf_model(parts, block_flats, tmp, resident=resident)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
