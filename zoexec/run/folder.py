"""A run folder (`zoexec run --out DIR`): what it holds, who owns it, how it resumes.

    DIR/run.json                   the run's identity: plan sha256 and path, seed, lr,
                                   eps, weight decay, data, initial weights, steps, the
                                   lr schedule's segments, the checkpoint options, the
                                   inputs' absolute paths and fingerprints, what decides
                                   z (device, versions), the plan's estimator; sealed
                                   by a digest
    DIR/losses.jsonl               one line per completed step (zoexec.run.checkpoint)
    DIR/snapshots/checkpoint-120/  the weights after step 120 (HF folder + state.json,
                                   which holds the sha256 of every other file)
    DIR/final/                     the weights at the end (checksummed alike)
    DIR/best/                      --save-best: the best evaluation's weights (zoexec.run.watch)
    DIR/.lock                      held (flock) by the run that owns DIR

Steps count as HF Trainer's: "after step N" is N updates done, in every file and line
(the code counts from 0: `StepRecord.step`; `start_step` is the steps done). An older
zoexec's folder (step-NNNNNN, state.json without "global_step", a log from step 0) is
mapped by those markers and resumes exactly (docs/run-folder.md, "One step number").

A snapshot holds every update up to its step (the pending one flushed). Resuming
(`zoexec run plan.json --resume DIR`) starts from the newest whole snapshot whose
checksums hold (or the run's initial weights), applies the logged updates after it in
one pass over the blocks (each block gets the same updates in the same order as in
the run: the weights come out bit for bit), and continues with the next step; the data
source is addressed by step, so the data position is the step. A crash at any instant
leaves a consistent folder: snapshots are renamed into place whole, the log is fsynced
line by line and a torn last line is cut off.

Nothing read back is trusted unread (zoexec.run.verify): run.json's digest, every
logged line's seed and lr against the run's seed rule and schedule, the data's hash
and the model's headers, each snapshot's checksums (a damaged one is passed over for
the one before it plus the log, and said so). Saved weights are tied to their run:
each state.json records the run's digest (run.json's "run_digest", fixed when the run
starts), its step and the digest of the logged history through that step; a saved
folder of another run, of another step than its name, or of another history than the
log's (copied in from elsewhere) is refused, whichever it is, before anything trains.
Any other damage (a missing or corrupt log beside snapshots, a changed input, an
edited run.json) is one ZoError naming the file, and nothing in the folder is changed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from zoexec.config import KEPT, SETTINGS, RunConfig  # what a resume keeps: the options' `kept`
from zoexec.data.section import TaskOptions
from zoexec.maths.history import StepRecord, Update
from zoexec.maths.schedule import lr_from
from zoexec.maths.zo import step_seed
from zoexec.model.saved import check_saved
from zoexec.run.checkpoint import LogRead, read_log_checked
from zoexec.run.verify import (
    binding_problem,
    check_seal,
    history_digest,
    input_change,
    order_change,
    saved_step,
    seal,
    unbound,
)
from zoexec.run.watch import BEST
from zoexec.runtime.procwatch import undone_on_stop
from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, kind_of, load_json, loads_strict, sha256_json

SCHEMA_VERSION = 2
IDENTITY = "run.json"
LOG = "losses.jsonl"
SNAPSHOTS = "snapshots"
FINAL = "final"
LOCK = ".lock"
RUN_FILES = (IDENTITY, LOG, SNAPSHOTS, FINAL, "best", "metrics.jsonl", "runs", "wandb",
             "mlruns")   # what a run writes
_SNAPSHOT = re.compile(r"checkpoint-([1-9]\d*)")   # checkpoint-N: the weights after N steps
_OLD_SNAPSHOT = re.compile(r"step-(\d+)")         # before: step-NNNNNN after N + 1 steps


@dataclass(frozen=True, kw_only=True)
class ResumePlan:
    """Where a resumed run starts: its initial weights (a verified snapshot folder or
    the run's own init) and the steps they hold (`snapshot_step`), the logged updates to
    apply to them, the steps done (`start_step`: the next step's index), the log's
    whole bytes (a torn last line after them is cut off), and notes for the terminal."""

    init: str
    snapshot_step: int | None
    replay: tuple[Update, ...]    # the logged updates (step, seed, g, lr, gs) in step order
    start_step: int
    settings: dict[str, Any]
    identity: dict[str, Any]
    log_bytes: int = 0
    history: str = ""     # the digest of the logged history (verify.history_digest)
    notes: tuple[str, ...] = ()


class RunDir:
    """The run folder at `path` (see the module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock: IO[str] | None = None
        self.run_digest: str | None = None   # run.json's, once written (rank 0)

    @property
    def log_path(self) -> Path:
        return self.path / LOG

    @property
    def holds_a_run(self) -> bool:
        return any((self.path / name).exists() for name in (IDENTITY, LOG, SNAPSHOTS, FINAL))

    # ---- ownership -----------------------------------------------------------------------
    def lock(self) -> None:
        """Own the folder while the run is alive (ZoError if another run owns it). The
        lock file is unlinked only by its holder, before it lets go (`unlock`), so a lock
        taken on a file that is no longer the one at the path (opened before its owner
        unlinked it) is no lock: it is dropped and the path's file tried again."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.check_own()
        while self._lock is None:
            handle = self._open_lock()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                owner = handle.read().strip() or "?"
                handle.close()
                raise ZoError(f"{self.path} is in use by another run (pid {owner}); wait for it "
                              f"or give another --out") from None
            if not _same_file(handle, self.path / LOCK):   # unlinked by the owner meanwhile
                handle.close()
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            self._lock = handle

    def _open_lock(self) -> IO[str]:
        try:
            return os.fdopen(os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                                     0o666), "r+")
        except OSError as exc:
            raise ZoError(f"cannot lock {self.path / LOCK}: {exc.strerror or exc}") from None

    def unlock(self) -> None:
        """Let go of the folder: the lock file is unlinked while still held (whoever
        opened it meanwhile finds it gone once it gets the lock, and tries again)."""
        if self._lock is not None:
            if _same_file(self._lock, self.path / LOCK):
                (self.path / LOCK).unlink(missing_ok=True)
            self._lock.close()
            self._lock = None

    def check_free(self) -> None:
        """ZoError if a live run owns the folder (the lock is taken and released), or
        if it is not the tool's alone (check_own)."""
        self.check_own()
        if (self.path / LOCK).exists():
            self.lock()
            self.unlock()

    def check_own(self) -> None:
        """ZoError, before anything is written or removed, when a path zoexec writes in
        the folder is a symbolic link (a write or a removal would go where it points),
        neither a regular file nor a folder (a FIFO blocks whoever opens it), or a
        saved-weights folder zoexec did not write (no state.json: a user's own)."""
        for path in self._own_paths():
            if path.is_symlink():
                raise ZoError(f"{path} is a symbolic link (to {os.readlink(path)}): zoexec "
                              f"writes and removes only real files in its run folder; put "
                              f"the file or folder itself there, or give another --out")
            kind = kind_of(path)
            if kind not in ("a file", "a folder"):   # a FIFO would block a read or a write
                raise ZoError(f"{path} is {kind}, not a regular file: zoexec reads and writes "
                              f"only regular files in its run folder")
        for name in (FINAL, BEST):
            folder = self.path / name
            if folder.is_dir() and not (folder / "state.json").is_file():
                raise ZoError(f"{folder} was not written by zoexec (no state.json): a run "
                              f"would replace it; move it away or give another --out")

    def _own_paths(self) -> Iterator[Path]:
        """Every path under the folder that zoexec writes, reads or removes (not
        following links): its files, its folders and everything in them."""
        names = (*RUN_FILES, LOCK, f".{FINAL}.tmp", f".{BEST}.tmp")
        for name in names:
            top = self.path / name
            if not (top.exists() or top.is_symlink()):
                continue
            yield top
            if top.is_dir() and not top.is_symlink():
                for root, dirs, files in os.walk(top):
                    yield from (Path(root) / n for n in (*dirs, *files))

    def present(self) -> set[str]:
        """The names zoexec writes that are in the folder now."""
        return {n for n in (*RUN_FILES, LOCK) if (self.path / n).exists()}

    def clear(self, *, keep: AbstractSet[str] = frozenset()) -> None:
        """Remove a run's files (--overwrite; `keep`: names left alone): only what a run
        writes, each known by its name and marker (a saved folder's state.json, a
        snapshot's name, TensorBoard's event files); anything else stays. check_own first."""
        self.check_own()
        for name in {IDENTITY, LOG, "metrics.jsonl"} - keep:
            (self.path / name).unlink(missing_ok=True)
        for name in {FINAL, BEST} - keep:
            if (self.path / name / "state.json").is_file():
                shutil.rmtree(self.path / name)
        if SNAPSHOTS not in keep:
            for _, path, _ in self._snapshot_folders():
                shutil.rmtree(path)
            self.prune(0)
        if "runs" not in keep:
            for path in (self.path / "runs").glob("events.out.tfevents.*"):
                path.unlink()
        for name in {SNAPSHOTS, "runs"} - keep:
            _remove_if_empty(self.path / name)

    def discard(self, *, before: set[str]) -> None:
        """Undo a new run that failed before its first step: the files it wrote (not
        those in `before`: there when it started). Called holding the lock; the folder
        itself goes after `unlock` when the run created it (undone_on_failure)."""
        self.clear(keep=before)

    # ---- identity ------------------------------------------------------------------------
    def write_identity(self, cfg: RunConfig, plan_sha256: str, *,
                       z: dict[str, Any] | None = None) -> None:
        """run.json of a new run (sealed; `z`: what decides z on its devices)."""
        self.write_sealed(identity_of(cfg, plan_sha256, z=z))

    def write_sealed(self, data: dict[str, Any]) -> None:
        atomic_write_text(self.path / IDENTITY, json.dumps(seal(data), indent=1) + "\n")
        self.run_digest = data["run_digest"]

    def read_identity(self) -> dict[str, Any]:
        """run.json, its digest checked (ZoError: missing, older, edited)."""
        path = self.path / IDENTITY
        if not path.is_file():
            raise ZoError(f"{self.path} holds no run to resume (no {IDENTITY})")
        data = load_json(path, what="run identity")
        if not isinstance(data, dict):
            raise ZoError(f"{path} is not a run identity (a JSON object)")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ZoError(f"{path} has schema_version {data.get('schema_version')!r}, not "
                          f"{SCHEMA_VERSION} (written by an older zoexec, without checksums): "
                          f"it cannot be resumed with verification; start a new run")
        check_seal(data, path)
        missing = [k for k in ("plan_sha256", "steps", "schedule", "inputs", *SETTINGS, *KEPT)
                   if k not in data]
        if missing:
            raise ZoError(f"{path} is not a run identity (missing {', '.join(missing)})")
        data.setdefault("run_digest", data["digest"])   # a run begun before it was recorded
        return data

    # ---- snapshots -----------------------------------------------------------------------
    def snapshot_path(self, step: int) -> Path:
        """The snapshot of the weights after `step` steps (checkpoint-N, as HF names it)."""
        return self.path / SNAPSHOTS / f"checkpoint-{step}"

    def snapshots(self) -> list[tuple[int, Path]]:
        """Whole snapshots (their state.json written), oldest first."""
        return sorted((step, path) for step, path, whole in self._snapshot_folders() if whole)

    def _snapshot_folders(self) -> list[tuple[int, Path, bool]]:
        folder = self.path / SNAPSHOTS
        out: list[tuple[int, Path, bool]] = []
        for path in folder.iterdir() if folder.is_dir() else ():
            step = snapshot_step(path.name)
            if step is not None and path.is_dir():
                out.append((step, path, (path / "state.json").is_file()))
        return out

    def final(self) -> tuple[int, Path] | None:
        """(step, path) of final/ when it is whole (a run that ended; --steps can extend it)."""
        state = self.path / FINAL / "state.json"
        try:
            step = saved_step(loads_strict(state.read_text()))
        except (OSError, ValueError, TypeError, AttributeError, RecursionError):
            return None
        return None if step is None else (step, state.parent)

    def prune(self, keep: int) -> None:
        """Keep the newest `keep` snapshots; remove half-written ones (a run killed while
        saving leaves .checkpoint-N.tmp) and snapshot folders without their state.json."""
        for _, path in self.snapshots()[:-keep] if keep > 0 else []:
            shutil.rmtree(path, ignore_errors=True)
        for _, path, whole in self._snapshot_folders():
            if not whole:
                shutil.rmtree(path, ignore_errors=True)
        for pattern in (".checkpoint-*.tmp", ".step-*.tmp"):   # .step-: an older zoexec's
            for path in (self.path / SNAPSHOTS).glob(pattern):
                shutil.rmtree(path, ignore_errors=True)

    def records(self) -> list[StepRecord]:
        return list(read_log_checked(self.log_path).records)

    # ---- resuming ------------------------------------------------------------------------
    def resume_plan(self, *, plan_sha256: str, given: dict[str, Any],
                    accept_moved: bool = False) -> ResumePlan:
        """Where `zoexec run --resume` starts, from the identity, the log and the newest
        snapshot whose checksums hold; every check before anything is changed. `given`:
        settings the user passed (None: not given)."""
        ident = self.read_identity()
        if ident["plan_sha256"] != plan_sha256:
            raise ZoError(f"{self.path} was run with another plan (sha256 "
                          f"{ident['plan_sha256'][:12]}, this plan {plan_sha256[:12]}; it "
                          f"was {ident.get('plan_path', '?')})")
        _check_settings(ident, given)
        ident, moved = _checked_inputs(ident, given, accept_moved=accept_moved)
        order = order_change(ident["inputs"].get("data"), ident["task"])
        if order:
            raise ZoError(f"{self.path}: {order}")
        log = self._verified_log(ident)
        done = histories(ident["run_digest"], log.records)
        self._check_bindings(ident["run_digest"], done)
        step, path, notes = self._start_point(log)
        replay = tuple(r.update for r in log.records   # r.step: counted from 0
                       if (step is None or r.step >= step) and r.update is not None)
        return ResumePlan(init=str(path) if path else ident["init"], snapshot_step=step,
                          replay=replay, start_step=len(log.records),
                          settings={k: ident[k] for k in (*SETTINGS, *KEPT, "steps")},
                          identity=ident, log_bytes=log.good_bytes,
                          history=done[-1] if done else ident["run_digest"],
                          notes=(*moved, *notes))

    def saved_folders(self) -> list[tuple[int | None, Path]]:
        """Every folder of saved weights: (the steps done its name gives, path):
        snapshots by their names, final/ and best/ (None: named by no step)."""
        found = [(step, path) for step, path, _ in self._snapshot_folders()]
        return found + [(None, self.path / name) for name in (FINAL, BEST) if
                        (self.path / name).is_dir()]

    def _check_bindings(self, run_digest: str, histories: list[str]) -> None:
        """ZoError when saved weights in the folder are not this run's (another run's,
        another step's, another history's: zoexec.run.verify.binding_problem)."""
        for step, path in sorted(self.saved_folders(), key=lambda s: str(s[1])):
            problem = binding_problem(path, step=step, run_digest=run_digest,
                                      histories=histories)
            if problem:
                raise ZoError(f"{problem}: weights copied in from elsewhere are not resumed "
                              f"from; move {path} out of the run folder to resume from the "
                              f"log")

    def _verified_log(self, ident: dict[str, Any]) -> LogRead:
        """The log, each line's seed and lr checked against the run's seed rule and lr
        schedule; a missing or empty log beside saved weights is refused."""
        log = read_log_checked(self.log_path)
        saved = [step for step, _ in self.snapshots()] + [f[0] for f in [self.final()] if f]
        if not log.records and saved:
            what = "is empty" if self.log_path.is_file() else "is missing"
            raise ZoError(f"{self.log_path} {what} but the folder holds weights saved after "
                          f"step {max(saved)}: the log they continue from is lost and the "
                          f"run cannot be resumed exactly")
        for number, record in enumerate(log.records, 1):
            _check_record(self.log_path, number, record, ident, first=log.first)
        if saved and log.records and max(saved) > len(log.records):
            raise ZoError(f"{self.log_path} ends after step {len(log.records)} but the folder "
                          f"holds weights saved after step {max(saved)}: the log lost lines")
        return log

    def _start_point(self, log: LogRead) -> tuple[int | None, Path | None, list[str]]:
        """The newest saved weights (final/ or a snapshot) within the log whose checksums
        hold; a damaged one is passed over for the one before it, with a note."""
        last = len(log.records)   # the steps the log holds
        final = self.final()
        saved = sorted(s for s in self.snapshots() + ([final] if final else []) if s[0] <= last)
        notes: list[str] = []
        for step, path in reversed(saved):
            problem = check_saved(path) or unbound(path)
            if problem is None:
                return step, path, notes
            notes.append(f"zoexec: warning: {path} is damaged ({problem}): not used; the run "
                         f"resumes from the weights saved before it and the log")
        return None, None, notes


def _check_settings(ident: dict[str, Any], given: dict[str, Any]) -> None:
    """An explicit setting that differs from the run's is refused (paths: _checked_inputs)."""
    for key in SETTINGS:
        if key in ("data", "init") or given.get(key) is None or given[key] == ident[key]:
            continue
        if key == "task" and _same_task(given[key], ident[key]):
            continue
        if key == "task":
            raise ZoError(f"the task {_task_text(given[key])} differs from the run being "
                          f"resumed ({_task_text(ident[key])}): a resumed run keeps its task")
        raise ZoError(f"--{key.replace('_', '-')} {given[key]} differs from the run "
                      f"being resumed ({ident[key]}): a resumed run keeps its settings")


_OPTION = {"data": "--data", "init": "--model-path"}
_INPUT = {"data": "data", "init": "model"}


def _checked_inputs(ident: dict[str, Any], given: dict[str, Any], *,
                    accept_moved: bool) -> tuple[dict[str, Any], list[str]]:
    """The run's data and model checked against their recorded fingerprints; a path given
    that is not the recorded one is taken only with --accept-moved-inputs and the same
    fingerprint. Returns the identity with the paths in use, and notes."""
    ident, notes = dict(ident), list[str]()
    for key in ("data", "init"):
        recorded = ident["inputs"].get(_INPUT[key])
        path = given.get(key)
        if path in (None, "random", "synthetic") or recorded is None:
            if path not in (None, ident[key]):
                raise ZoError(f"{_OPTION[key]} {path} differs from the run being resumed "
                              f"({ident[key]}): a resumed run keeps its settings")
            path = None
        elif str(Path(path).resolve()) == recorded["path"]:
            path = None
        change = input_change(_INPUT[key], recorded, path)
        if change:
            raise ZoError(change + ("" if path else f"; a resumed run needs the same {_INPUT[key]}"))
        if path is None:
            continue
        if not accept_moved:
            raise ZoError(f"{_OPTION[key]} {path} is not the run's {_INPUT[key]} "
                          f"({recorded['path']}); it holds the same content: give "
                          f"--accept-moved-inputs to resume with it")
        moved = str(Path(path).resolve())
        ident[key] = moved
        ident["inputs"] = {**ident["inputs"], _INPUT[key]: {**recorded, "path": moved}}
        notes.append(f"zoexec: {_INPUT[key]} moved: {recorded['path']} -> {moved} (the same "
                     f"content; run.json updated)")
    return ident, notes


def _check_record(path: Path, number: int, record: StepRecord, ident: dict[str, Any], *,
                  first: int) -> None:
    """A logged line's seed is the seed rule's for its step, its lr the schedule's, its
    directions' g's as many as the run's estimator has directions (one: none). `first`:
    the log's first step (LogRead.first): the messages give the line's own "step"."""
    want = step_seed(ident["seed"], record.step)
    shown = record.step + first
    if record.seed != want:
        raise ZoError(f"{path}:{number}: step {shown} has seed {record.seed}, but the "
                      f"run's seed rule gives {want} (--seed {ident['seed']}): the log was "
                      f"altered and cannot be replayed")
    directions = (ident.get("estimator") or {}).get("directions", 1)
    if len(record.gs) != (directions if directions > 1 else 0):
        raise ZoError(f"{path}:{number}: step {shown} has {len(record.gs)} directions' g "
                      f"(gs), but the run's estimator takes {directions}: the log was altered "
                      f"and cannot be replayed")
    if record.update is None:
        return
    lr = logged_lr(ident, record.step)
    if record.lr != lr:
        raise ZoError(f"{path}:{number}: step {shown} has lr {record.lr!r}, but the "
                      f"run's schedule gives {lr!r}: the log was altered and cannot be replayed")


def snapshot_step(name: str) -> int | None:
    """The steps done a snapshot folder's name gives: checkpoint-N, N; an older zoexec's
    step-NNNNNN (counted from 0), N + 1; None: not a snapshot's name."""
    match = _SNAPSHOT.fullmatch(name)
    if match:
        return int(match[1])
    old = _OLD_SNAPSHOT.fullmatch(name)
    return int(old[1]) + 1 if old else None


def histories(run_digest: str, records: Iterable[StepRecord]) -> list[str]:
    """The digest of the run's history through each logged step (verify.history_digest)."""
    out: list[str] = []
    previous = run_digest
    for record in records:
        previous = history_digest(previous, record.step, record.update)
        out.append(previous)
    return out


def logged_lr(ident: dict[str, Any], step: int) -> float:
    """The lr of `step` by run.json's schedule segments ([start, total] each)."""
    start, total = next((s, t) for s, t in reversed(ident["schedule"]) if s <= step)
    return lr_from(step, start=start, lr=ident["lr"], schedule=ident["lr_schedule"],
                   warmup=ident["warmup_steps"], total=total)


def identity_of(cfg: RunConfig, plan_sha256: str, *, z: dict[str, Any] | None) -> dict[str, Any]:
    """run.json's content (unsealed) for the run `cfg` describes."""
    inputs = cfg.inputs or {"data": None, "model": None}
    settings = cfg.settings()
    for key in ("data", "init"):
        if inputs.get(_INPUT[key]):
            settings[key] = inputs[_INPUT[key]]["path"]
    c = cfg.checkpoint
    body = {"schema_version": SCHEMA_VERSION, "tool": f"zoexec {__version__}",
            "plan_sha256": plan_sha256, "plan_path": str(Path(cfg.plan_path).resolve()),
            "steps": cfg.optim.steps, **settings,
            "schedule": [list(s) for s in cfg.schedule] or [[0, cfg.optim.steps]],
            "extensions": list(cfg.extensions), "save_every": c.save_every,
            "save_steps": c.save_steps, "keep": c.keep, **cfg.run_options(), "inputs": inputs, "z": z,
            "estimator": cfg.workload.estimator_spec.to_dict()}   # the plan's (its sha256 pins it)
    return {**body, "run_digest": sha256_json(body)}   # fixed for the run's life


@contextmanager
def undone_on_failure(cfg: RunConfig | None) -> Iterator[None]:
    """A new run's folder removed again when the run fails before its first step is
    logged (a rank's error, a bad shard, a full store, a stop signal: `undo` is what
    zoexec.runtime.procwatch.stop_at_once runs): the same command can run again."""
    out = cfg.checkpoint.out if cfg is not None else None
    existed = out is not None and Path(out).exists()
    before = RunDir(out).present() if out is not None and existed else set()
    try:
        with undone_on_stop(lambda: _undo(cfg, existed=existed, before=before)):
            yield
    except BaseException:
        _undo(cfg, existed=existed, before=before)
        raise


def _undo(cfg: RunConfig | None, *, existed: bool, before: set[str]) -> None:
    """Remove what a new run wrote in its folder if it logged no step (undone_on_failure)."""
    if cfg is None or cfg.checkpoint.out is None or cfg.resumed:
        return
    rundir = RunDir(cfg.checkpoint.out)
    try:
        rundir.lock()   # not another run's folder; held while its files go
        try:
            if not read_log_checked(rundir.log_path).records and not rundir.snapshots():
                rundir.discard(before=before)
        finally:
            rundir.unlock()
            if not existed:
                _remove_if_empty(rundir.path)
    except (OSError, ZoError):
        pass


def _same_file(handle: IO[str], path: Path) -> bool:
    """Whether the open `handle` is the file at `path` now (not unlinked, not replaced)."""
    try:
        mine, there = os.fstat(handle.fileno()), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def say(lines: Iterable[str]) -> None:
    """Notes of the run folder (a damaged snapshot passed over, an extension) on stderr."""
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def _same_task(given: dict[str, Any], recorded: Any) -> bool:
    """Two task records naming the same task (one written before a field was recorded,
    or recorded only when set, reads as its default)."""
    try:
        return TaskOptions.from_record(given) == TaskOptions.from_record(recorded)
    except (ZoError, ValueError, TypeError):   # a record this zoexec cannot read: not the same
        return False


def _task_text(task: Any) -> str:
    """A task dict of run.json in a line: "classification (template=..., ...)"."""
    if not isinstance(task, dict):
        return repr(task)
    rest = ", ".join(f"{k}={v!r}" for k, v in task.items() if k != "name")
    return f"{task.get('name')} ({rest})" if rest else str(task.get("name"))
