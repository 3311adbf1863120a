"""The per-step log a run writes (losses.jsonl) and reads back on resume.

losses.jsonl: one strict-JSON object per completed step (StepRecord.to_dict): step,
seed, loss_plus, loss_minus, g, loss, lr, data_position, tokens_per_s, step_time_s
(non-finite values are written as null, with "nonfinite": true; a skipped step has
"skipped": true and applied no update). Each line is flushed and fsynced before the
step counts as done: the (seed, g, lr) triples are the whole training history of MeZO,
so initial weights (or a snapshot) + this log rebuild the model exactly (seed replay,
zoexec.run.folder). A crash can leave at most a torn last line, which a resume drops.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from zoexec.maths.history import StepRecord
from zoplan.errors import ZoError


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
