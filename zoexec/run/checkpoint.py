"""The per-step log a run writes (losses.jsonl) and reads back on resume.

losses.jsonl: one strict-JSON object per completed step (StepRecord.to_dict): step
(the steps done with it: 1 for the first, as metrics.jsonl, snapshots and state.json
count; a log begun by a zoexec before that counts from 0 and keeps counting so, its
first line says which: FIRST_STEP), seed, loss_plus, loss_minus, g, loss, lr, data_position, tokens_per_s, step_time_s
(non-finite values are written as null, with "nonfinite": true; a skipped step has
"skipped": true and applied no update). Each line is flushed and fsynced before the
step counts as done: the (seed, g, lr) triples are the whole training history of MeZO,
so initial weights (or a snapshot) + this log rebuild the model exactly (seed replay,
zoexec.run.folder). A crash can leave at most a torn last line, which a resume drops;
any other bad line is damage, and a resume is refused (read_log_checked).
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from zoexec.maths.history import StepRecord
from zoexec.run.verify import history_digest
from zoexec.run.writes import writing
from zoplan.errors import ZoError
from zoplan.io import loads_strict

_STRICT_JSON = json.JSONEncoder(allow_nan=False)   # one encoder (zoexec.run.report.STRICT_JSON)


FIRST_STEP = 1   # the "step" of a log's first line; 0 in a log begun before it counted so
_OLD_FIRST_STEP = 0


_MODES = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND}


def open_own(path: Path, mode: str) -> IO[str]:
    """A run folder's text file opened for writing ("w" or "a") without following a
    symbolic link (ELOOP: an OSError, never a write where the link points)."""
    return os.fdopen(os.open(path, _MODES[mode] | os.O_NOFOLLOW, 0o666), mode)


class LossLog:
    """Rank 0's log: losses.jsonl in the run folder, appended and fsynced step by step.
    `keep_bytes`: a resumed run's whole lines (LogRead.good_bytes): a torn last line
    after them is cut off before the first new line. `history`: the digest of the run's
    history before `start_step` (zoexec.run.verify.history_digest: the run's digest for
    a new run; None: a run with no run.json, its config built by hand); the log carries
    it on with each step, for saved weights to record.
    Records count from 0 (`StepRecord.step`); a line's "step" is that plus the log's
    first step (FIRST_STEP; a resumed log's own, read from its first line)."""

    def __init__(self, out_dir: Path, *, keep_bytes: int | None = None, history: str | None = "",
                 start_step: int = 0) -> None:
        self.path = Path(out_dir) / "losses.jsonl"
        self.first = _first_step(self.path) if keep_bytes else FIRST_STEP
        with self._writing():
            if keep_bytes is not None and self.path.is_file() \
                    and self.path.stat().st_size > keep_bytes:
                with self.path.open("r+b") as handle:
                    handle.truncate(keep_bytes)
            self._handle = open_own(self.path, "a")
        self._histories = {start_step - 1: history}   # the last two steps' digests

    def _writing(self) -> AbstractContextManager[None]:
        """A refused write (a full disk): one line naming the log (zoexec.run.writes)."""
        return writing(self.path, what="the log", folder=self.path.parent)

    def append(self, record: StepRecord) -> None:
        with self._writing():
            line = {**record.to_dict(), "step": record.step + self.first}
            self._handle.write(_STRICT_JSON.encode(line) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        previous = self._histories[record.step - 1]
        self._histories = {record.step - 1: previous,
                           record.step: history_digest(previous, record.step, record.update)}

    def history(self, step: int) -> str | None:
        """The digest of the history through `step` (the last logged step or the one
        before it)."""
        return self._histories[step]

    def close(self) -> None:
        """Closed; a line a full disk refused is dropped (append said so; a torn line
        is cut off at the resume)."""
        if not self._handle.closed:
            try:
                self._handle.close()
            except OSError:
                pass


@dataclass(frozen=True, kw_only=True)
class LogRead:
    """A log as read: its whole lines' records (counted from 0), their bytes, whether a
    torn last line (a crash while writing it) follows them, and the "step" of its first
    line (FIRST_STEP; 0 in a log begun before: a line's step is a record's + first)."""

    records: tuple[StepRecord, ...]
    good_bytes: int
    torn: bool
    first: int = FIRST_STEP


def read_log_checked(path: Path) -> LogRead:
    """Every line of a log, read without changing it: a whole line that is not a step
    record, or steps out of order, is a ZoError naming the line; only a torn last line
    (no newline: a crash while writing it) is left out (and reported). The first line's
    step is FIRST_STEP, or 0 in a log begun before it (each next one more)."""
    path = Path(path)
    if not path.is_file():
        return LogRead(records=(), good_bytes=0, torn=False)
    records: list[StepRecord] = []
    good, torn, first = 0, False, FIRST_STEP
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.endswith(b"\n"):
                torn = True
                break
            record = _record(path, number, raw)
            if not records and record.step == _OLD_FIRST_STEP:
                first = _OLD_FIRST_STEP   # counted from 0: a log begun before FIRST_STEP
            want = records[-1].step + 1 if records else first
            if record.step != want:
                raise ZoError(f"{path}:{number}: step {record.step} where step {want} belongs "
                              f"(the log is damaged; a resume cannot trust it)")
            records.append(record)
            good += len(raw)
    return LogRead(records=tuple(replace(r, step=r.step - first) for r in records),
                   good_bytes=good, torn=torn, first=first)


def _first_step(path: Path) -> int:
    """The step a log's first whole line gives (FIRST_STEP when it has none): a resumed
    log goes on counting as it began."""
    try:
        with path.open("rb") as handle:
            raw = handle.readline()
        step: Any = loads_strict(raw)["step"] if raw.endswith(b"\n") else FIRST_STEP
    except (OSError, ValueError, KeyError, TypeError):
        return FIRST_STEP
    return _OLD_FIRST_STEP if step == _OLD_FIRST_STEP else FIRST_STEP


def _record(path: Path, number: int, raw: bytes) -> StepRecord:
    try:
        return StepRecord.from_dict(loads_strict(raw))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ZoError(f"{path}:{number} is not a step record ({type(exc).__name__}: "
                      f"{str(exc)[:80]}); only a torn last line is a crash's trace: the log "
                      f"is damaged and a resume cannot trust it") from None


def read_log(path: Path) -> list[StepRecord]:
    """The completed steps of a log (read_log_checked's records; the file is not changed)."""
    return list(read_log_checked(path).records)


def read_losses(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise ZoError(f"loss log {path} does not exist")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
