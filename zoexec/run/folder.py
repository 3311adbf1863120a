"""A run folder (`zoexec run --out DIR`): what it holds, who owns it, how it resumes.

    DIR/run.json                   the run's identity: plan sha256 and path, seed, lr,
                                   eps, weight decay, data, initial weights, steps
    DIR/losses.jsonl               one line per completed step (zoexec.run.checkpoint)
    DIR/snapshots/step-000120/     the weights after step 120 (HF folder + state.json)
    DIR/final/                     the weights at the end
    DIR/best/                      --save-best: the best evaluation's weights (zoexec.run.watch)
    DIR/.lock                      held (flock) by the run that owns DIR

A snapshot holds every update up to its step (the pending one flushed). Resuming
(`zoexec run plan.json --resume DIR`) starts from the newest whole snapshot (or the
run's initial weights), applies the logged updates after it in one pass over the
blocks (each block gets the same updates in the same order as in the run: the weights
come out bit for bit), and continues with the next step; the data source is addressed
by step, so the data position is the step. A crash at any instant leaves a consistent
folder: snapshots are renamed into place whole, the log is fsynced line by line and a
torn last line is cut off.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from zoexec.maths.history import StepRecord
from zoexec.run.checkpoint import read_log
from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, load_json

IDENTITY = "run.json"
LOG = "losses.jsonl"
SNAPSHOTS = "snapshots"
FINAL = "final"
LOCK = ".lock"
# the settings a resume takes from run.json (an explicit different value is refused)
SETTINGS = ("seed", "lr", "eps", "weight_decay", "data", "init", "lr_schedule", "warmup_steps",
            "task")
TEXT_TASK = {"name": "text", "text_column": "text"}   # run.json without "task": zoexec.data.tasks' text
_SNAPSHOT = re.compile(r"step-(\d+)")


@dataclass(frozen=True, kw_only=True)
class ResumePlan:
    """Where a resumed run starts: its initial weights (a snapshot folder or the run's
    own init), the logged updates to apply to them, and the next step."""

    init: str
    snapshot_step: int | None
    replay: tuple[tuple[int, float, float], ...]    # (seed, g, lr) in step order
    start_step: int
    settings: dict


class RunDir:
    """The run folder at `path` (see the module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = None

    @property
    def log_path(self) -> Path:
        return self.path / LOG

    @property
    def holds_a_run(self) -> bool:
        return any((self.path / name).exists() for name in (IDENTITY, LOG, SNAPSHOTS, "final"))

    # ---- ownership -----------------------------------------------------------------------
    def lock(self) -> None:
        """Own the folder while the run is alive (ZoError if another run owns it)."""
        self.path.mkdir(parents=True, exist_ok=True)
        handle = (self.path / LOCK).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            handle.close()
            raise ZoError(f"{self.path} is in use by another run (pid {owner}); wait for it "
                          f"or give another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
            (self.path / LOCK).unlink(missing_ok=True)

    def check_free(self) -> None:
        """ZoError if a live run owns the folder (the lock is taken and released)."""
        if (self.path / LOCK).exists():
            self.lock()
            self.unlock()

    def clear(self) -> None:
        """Remove a previous run's files (--overwrite): only what a run writes."""
        for name in (IDENTITY, LOG, SNAPSHOTS, "final", "best"):
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)

    # ---- identity ------------------------------------------------------------------------
    def write_identity(self, cfg, plan_sha256: str) -> None:
        data = {"schema_version": 1, "tool": f"zoexec {__version__}",
                "plan_sha256": plan_sha256, "plan_path": str(cfg.plan_path),
                "steps": cfg.optim.steps, **cfg.settings()}
        atomic_write_text(self.path / IDENTITY, json.dumps(data, indent=1) + "\n")

    def read_identity(self) -> dict:
        path = self.path / IDENTITY
        if not path.is_file():
            raise ZoError(f"{self.path} holds no run to resume (no {IDENTITY})")
        data = load_json(path, what="run identity")
        if isinstance(data, dict) and data.get("task") is None:
            data["task"] = dict(TEXT_TASK)   # written before tasks: the text task
        missing = [k for k in ("plan_sha256", "steps", *SETTINGS) if k not in data]
        if not isinstance(data, dict) or missing:
            raise ZoError(f"{path} is not a run identity (missing {', '.join(missing)})")
        return data

    # ---- snapshots -----------------------------------------------------------------------
    def snapshot_path(self, step: int) -> Path:
        return self.path / SNAPSHOTS / f"step-{step:06d}"

    def snapshots(self) -> list[tuple[int, Path]]:
        """Whole snapshots (their state.json written), oldest first."""
        folder = self.path / SNAPSHOTS
        out = []
        for path in folder.iterdir() if folder.is_dir() else ():
            match = _SNAPSHOT.fullmatch(path.name)
            if match and (path / "state.json").is_file():
                out.append((int(match[1]), path))
        return sorted(out)

    def final(self) -> tuple[int, Path] | None:
        """(step, path) of final/ when it is whole (a run that ended; --steps can extend it)."""
        state = self.path / FINAL / "state.json"
        try:
            return int(json.loads(state.read_text())["step"]), state.parent
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def prune(self, keep: int) -> None:
        """Keep the newest `keep` snapshots; remove half-written ones (a run killed while
        saving leaves .step-NNNNNN.tmp)."""
        for _, path in self.snapshots()[:-keep] if keep > 0 else []:
            shutil.rmtree(path, ignore_errors=True)
        for path in (self.path / SNAPSHOTS).glob(".step-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)

    def records(self) -> list[StepRecord]:
        return read_log(self.log_path)

    # ---- resuming ------------------------------------------------------------------------
    def resume_plan(self, *, plan_sha256: str, given: dict) -> ResumePlan:
        """Where `zoexec run --resume` starts, from the identity, the newest whole
        snapshot and the log. `given`: settings the user passed (None: not given)."""
        ident = self.read_identity()
        if ident["plan_sha256"] != plan_sha256:
            raise ZoError(f"{self.path} was run with another plan (sha256 "
                          f"{ident['plan_sha256'][:12]}, this plan {plan_sha256[:12]}; it "
                          f"was {ident.get('plan_path', '?')})")
        for key in SETTINGS:
            if given.get(key) is not None and given[key] != ident[key]:
                if key == "task":
                    raise ZoError(f"the task {_task_text(given[key])} differs from the run being "
                                  f"resumed ({_task_text(ident[key])}): a resumed run keeps its "
                                  f"task")
                raise ZoError(f"--{key.replace('_', '-')} {given[key]} differs from the run "
                              f"being resumed ({ident[key]}): a resumed run keeps its settings")
        records = self.records()
        final = self.final()
        snaps = [(step, path) for step, path in self.snapshots() + ([final] if final else [])
                 if not records or step <= records[-1].step]
        snaps.sort()
        step, path = snaps[-1] if snaps else (None, None)
        replay = tuple(r.update for r in records
                       if (step is None or r.step > step) and r.update is not None)
        return ResumePlan(init=str(path) if path else ident["init"], snapshot_step=step,
                          replay=replay, start_step=records[-1].step + 1 if records else 0,
                          settings={k: ident[k] for k in (*SETTINGS, "steps")})


def _task_text(task) -> str:
    """A task dict of run.json in a line: "classification (template=..., ...)"."""
    if not isinstance(task, dict):
        return repr(task)
    rest = ", ".join(f"{k}={v!r}" for k, v in task.items() if k != "name")
    return f"{task.get('name')} ({rest})" if rest else str(task.get("name"))
