"""What a run writes: the per-step log and the weights (snapshots and final/).

losses.jsonl: one strict-JSON object per completed step (StepRecord.to_dict): step,
seed, loss_plus, loss_minus, g, loss, lr, data_position, tokens_per_s, step_time_s
(non-finite values are written as null, with "nonfinite": true; a skipped step has
"skipped": true and applied no update). Each line is flushed and fsynced before the
step counts as done: the (seed, g, lr) triples are the whole training history of MeZO,
so initial weights (or a snapshot) + this log rebuild the model exactly (seed replay,
zoexec.rundir). A crash can leave at most a torn last line, which a resume drops.

Weights (a snapshot or final/) are an HF folder (config.json, model.safetensors, and the
tokenizer and generation config of the model folder the run started from, when it had
them), written into a temporary folder and renamed, so a folder is either whole or
absent; non-finite weights are refused, never saved.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from zoplan.errors import ZoError

# Files of a model folder that a saved model carries along (AutoTokenizer, generate).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "generation_config.json")


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One training step as every rank knows it after the loss all-reduce."""

    step: int
    seed: int
    loss_plus: float
    loss_minus: float
    g: float
    lr: float = 0.0
    tokens_per_s: float = 0.0
    step_time_s: float = 0.0
    skipped: bool = False          # a non-finite step skipped (--on-nonfinite skip): no update

    @property
    def loss(self) -> float:
        return 0.5 * (self.loss_plus + self.loss_minus)

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.loss_plus, self.loss_minus, self.g))

    @property
    def update(self) -> tuple[int, float, float] | None:
        """(seed, g, lr) of the update this step applies later, or None."""
        return None if self.skipped or not self.finite else (self.seed, self.g, self.lr)

    def to_dict(self) -> dict:
        out = {**asdict(self), "loss": self.loss, "data_position": self.step}
        if not self.skipped:
            out.pop("skipped")
        bad = [k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)]
        for key in bad:
            out[key] = None
        if bad:
            out["nonfinite"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict) -> StepRecord:
        """A logged line back (null: NaN); ValueError/KeyError/TypeError if malformed."""
        def num(key: str) -> float:
            value = data[key]
            return math.nan if value is None else float(value)
        return cls(step=int(data["step"]), seed=int(data["seed"]), loss_plus=num("loss_plus"),
                   loss_minus=num("loss_minus"), g=num("g"), lr=num("lr"),
                   tokens_per_s=float(data.get("tokens_per_s") or 0.0),
                   step_time_s=float(data.get("step_time_s") or 0.0),
                   skipped=bool(data.get("skipped", False)))


class LossLog:
    """Rank 0's log: losses.jsonl in the run folder, appended and fsynced step by step."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / "losses.jsonl"
        self._handle = self.path.open("a")

    def append(self, record: StepRecord) -> None:
        self._handle.write(json.dumps(record.to_dict(), allow_nan=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()


def read_log(path: Path) -> list[StepRecord]:
    """The completed steps of a log: every whole line up to the first torn or malformed
    one (a crash can tear the last line), which is cut off the file."""
    path = Path(path)
    if not path.is_file():
        return []
    records, good = [], 0
    with path.open("rb") as handle:
        for raw in handle:
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("torn line")
                record = StepRecord.from_dict(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                break
            if records and record.step != records[-1].step + 1:
                raise ZoError(f"{path}: step {record.step} follows step {records[-1].step}")
            records.append(record)
            good += len(raw)
    if good < path.stat().st_size:
        with path.open("r+b") as handle:
            handle.truncate(good)
    return records


def read_losses(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ZoError(f"loss log {path} does not exist")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export_weights(parts, block_flats, folder: Path, *, resident=None,
                   extra_files: Path | None = None, state: dict | None = None) -> Path:
    """Write `folder` (an HF folder: config.json + model.safetensors, the tokenizer
    files of `extra_files` when it has them, and state.json with `state`) atomically,
    in the stored precision; `resident`: the resident weights' clean flat copy
    (models.hf_state_dict). Non-finite weights are refused."""
    from zoexec.models import export_hf_model

    for index, flat in enumerate(block_flats):
        _check_finite(flat, f"block {index}")
    if resident is not None:
        _check_finite(resident, "the resident parts (embeddings, norm, head)")
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_hf_model(parts, block_flats, tmp, resident=resident)
        for name in TOKENIZER_FILES:
            source = Path(extra_files) / name if extra_files else None
            if source is not None and source.is_file():
                shutil.copy2(source, tmp / name)
        if state is not None:
            (tmp / "state.json").write_text(json.dumps(state, indent=1, allow_nan=False) + "\n")
        _fsync_tree(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _check_finite(flat, what: str) -> None:
    import torch

    if not bool(torch.isfinite(flat).all()):
        raise ZoError(f"{what} hold non-finite weights: not saved (the run diverged; "
                      f"resume from an earlier snapshot with a smaller --lr)")


def _fsync_tree(folder: Path) -> None:
    """Data of every file in `folder` on disk before the folder is renamed into place."""
    for path in folder.iterdir():
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
