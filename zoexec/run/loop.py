"""The training loop of one rank around the engine's steps: the log, snapshots, stops,
non-finite steps, and the end of the run (zoexec.run.folder describes the run folder).

Every step's loss all-reduce also carries two flags summed over the world, so the
ranks decide together, at the same step boundary:
- stop: a rank got SIGINT or SIGTERM (the launcher forwards the one it gets, once;
  under torchrun the rank gets it itself): the ranks save a snapshot and exit with 130
  or 143;
- snapshot: rank 0's clock says a snapshot is due (--save-every with a duration).
A snapshot flushes the pending update into every block (the same maths as applying it
at the next step) and rank 0 writes the weights of node 0's store.
A non-finite loss or g is never applied: the run stops (the weights of the step before
saved as a snapshot, exit 1), or with --on-nonfinite skip the step is logged as
skipped and training goes on (at most MAX_SKIPS in a row).
With --eval-data, every rank evaluates the held-out set (zoexec.run.evaluate) after every
--eval-every steps and after the last step, in lock-step; rank 0 reports the metrics,
and with --save-best writes a better evaluation's weights as best/. A climbing loss
warns or stops the run (--on-divergence; the rule: zoexec.run.watch).
At the end, rank 0 writes the weights (final/) first, then the trace.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import torch

from zoexec.config import RunConfig
from zoexec.maths.history import StepHistory, StepRecord
from zoexec.model.export import export_weights
from zoexec.model.saved import folder_checksums
from zoexec.run.agree import check_nodes
from zoexec.run.checkpoint import LossLog
from zoexec.run.evaluate import Evaluator
from zoexec.run.folder import FINAL, RunDir
from zoexec.run.report import Reporter
from zoexec.run.verify import binding
from zoexec.run.watch import BEST, BestMetric, Divergence
from zoexec.run.writes import write_failed
from zoexec.runtime.groups import DistEnv
from zoexec.runtime.procwatch import StopRequest
from zoexec.store.loading import fill_timeout_s
from zoexec.store.node import monitored_barrier
from zoexec.train.engine import SavedState, Trainer
from zoexec.train.lora import FrozenBaseTrainer
from zoplan.errors import ZoError

MAX_SKIPS = 10
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}   # SIGHUP: as SIGTERM


class RunStopped(Exception):
    """The run stopped on purpose before its last step (a signal, a non-finite step):
    `exit_code` and a one-line message; the snapshot it left, if any, is named. Every
    rank raises it at the same step (the flags and the loss are all-reduced)."""

    on_purpose = True

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TrainLoop:
    """Drive a Trainer from cfg.start_step to cfg.optim.steps (see the module docstring)."""

    def __init__(self, trainer: Trainer, rundir: RunDir | None, reporter: Reporter,
                 evaluator: Evaluator | None = None, *,
                 stop: StopRequest | None = None) -> None:
        self.trainer, self.rundir, self.reporter = trainer, rundir, reporter
        self.evaluator = evaluator   # zoexec.run.evaluate.Evaluator: --eval-data
        self.stop = stop             # the rank's stop signals (rank_main installs them)
        self.cfg, self.env = trainer.cfg, trainer.env
        self.log = (LossLog(rundir.path, keep_bytes=self.cfg.log_bytes, start_step=self.cfg.start_step,
                            history=self.cfg.history or rundir.run_digest)
                    if rundir and self.env.rank == 0 else None)
        self.last_save_s = time.monotonic()
        self.skips = 0
        self.divergence = Divergence(self.cfg.optim.divergence_window)
        best, out = self.cfg.checkpoint.best, self.cfg.checkpoint.out
        self.best = best and BestMetric(*best, Path(out) if self.cfg.resumed and out is not None else None)

    @property
    def records(self) -> StepHistory:
        """This invocation's steps (the reporter's compact history: kept once)."""
        return self.reporter.records

    def run(self) -> list[StepRecord]:
        cfg = self.cfg
        try:
            if cfg.replay:
                self.trainer.replay(cfg.replay)
            self.reporter.begin()
            if cfg.evaluate_first and self.evaluator is not None:   # a resume: the builder's
                self._evaluate(cfg.start_step - 1)
            for step in range(cfg.start_step, cfg.optim.steps):
                record, (stop, save) = self.trainer.step(step, lr=cfg.lr_of(step),
                                                         flags=self._flags())
                record = self._checked(record)
                if self.log:
                    self.log.append(record)
                self.reporter.train(record, epoch=self._epoch(step))
                if self.evaluator is not None and self.evaluator.due(step, cfg.optim.steps - 1):
                    self._evaluate(step)
                self._watch(record)
                self._alter_store_for_tests(step)
                if stop:
                    self._stopped(step)
                if self._save_due(step, save):
                    self.snapshot(step)
                elif self._check_due(step):
                    check_nodes(self.trainer, self.env, step=step)
                if self.trainer.speed:
                    self.trainer.speed.after_step(step + 1, cfg.optim.steps)
        finally:
            self.reporter.close()
            if self.log:
                self.log.close()
        return list(self.records)

    # ---- per step ----------------------------------------------------------------------
    def _epoch(self, step: int) -> float | None:
        """Passes over the data after `step`, when the data source can tell
        (`epoch_of(step)`), for the metrics."""
        epoch_of = getattr(self.trainer.source, "epoch_of", None)
        epoch: float | None = epoch_of(step) if callable(epoch_of) else None
        return epoch

    def _flags(self) -> tuple[float, float]:
        """This rank's (stop, snapshot) requests for the step's all-reduce."""
        every = self.cfg.checkpoint.every_s
        due = (self.rundir is not None and every is not None and self.env.rank == 0
               and time.monotonic() - self.last_save_s >= every)
        return float(self._signum() is not None), float(due)

    def _save_due(self, step: int, clock: float) -> bool:
        if self.rundir is None or step == self.cfg.optim.steps - 1:
            return False   # the last step's weights are final/
        every = self.cfg.checkpoint.every_steps
        return bool(clock) or (every is not None and (step + 1) % every == 0)

    def _check_due(self, step: int) -> bool:
        every = self.cfg.checkpoint.check_nodes_every
        return every is not None and (step + 1) % every == 0 and step < self.cfg.optim.steps - 1

    def _alter_store_for_tests(self, step: int) -> None:
        """cfg.alter_store_at (node, step), for tests: that node's store gets one bit
        of block 0 flipped after that step (a node whose memory changed the weights)."""
        at = self.cfg.alter_store_at
        if at is None or (self.env.place.node, step) != tuple(at) or self.env.local_rank != 0:
            return
        bits = self.trainer.store.weights(0)[:1].view(torch.int32)
        bits ^= 1

    def _checked(self, record: StepRecord) -> StepRecord:
        """Set the step's update pending, or handle a non-finite step."""
        if record.finite:
            self.skips = 0
            self.trainer.set_pending(record)
            return record
        self.skips += 1
        what = (f"step {record.step + 1}: the loss is not finite (loss+ {record.loss_plus}, "
                f"loss- {record.loss_minus}, g {record.g})")
        if self.cfg.optim.on_nonfinite == "skip" and self.skips <= MAX_SKIPS:
            self._say(f"zoexec: warning: {what}: skipped, no update")
            record = StepRecord(**{**record.__dict__, "skipped": True})
            self.trainer.set_pending(record)
            return record
        first = record.step == self.cfg.start_step
        if self.log and not (first and not self.cfg.resumed):   # a new run's first: undone whole
            self.log.append(record)
        self.trainer.set_pending(record)   # nothing: a non-finite update is never applied
        saved = self.snapshot(record.step - 1) if not first else None
        hint = (f"; {self.skips} in a row" if self.cfg.optim.on_nonfinite == "skip"
                else "; --on-nonfinite skip would skip such steps")
        where = self._where(saved) if saved is not None or self.rundir is None else (
            f"; nothing new saved in {self.rundir.path}" if self.cfg.resumed
            else f"; nothing trained: {self.rundir.path} is removed again")
        raise RunStopped(f"{what}: stopped without applying it{where}{hint}", 1)

    def _evaluate(self, step: int) -> None:
        """Evaluate after `step`; with --save-best, a better evaluation's weights as best/."""
        assert self.evaluator is not None, "evaluated without --eval-data"
        metrics = self.evaluator.run(self.trainer)
        if self.best and self.best.improved(metrics):   # the same on every rank
            folder = self.rundir.path / BEST if self.rundir else None   # rank 0 writes
            self._write_weights(folder, step, **self.best.state())
        # recorded after best/: a run killed between them evaluates again on its resume
        self.reporter.evaluate(step + 1, metrics)

    def _watch(self, record: StepRecord) -> None:
        """A climbing loss (zoexec.run.watch): a warning, or the run stops (a snapshot)."""
        what = self.divergence.add(record)
        if what is None:
            return
        if self.cfg.optim.on_divergence == "warn":
            self._say(f"zoexec: warning: step {record.step + 1}: {what}; lower --lr (now "
                      f"{record.lr:g})")
            return
        saved = self.snapshot(record.step)
        raise RunStopped(f"step {record.step + 1}: {what}: stopped{self._where(saved)}; lower "
                         f"--lr (now {record.lr:g}), or give --on-divergence warn", 1)

    def _stopped(self, step: int) -> None:
        signum = self._signum() or signal.SIGTERM
        saved = self.snapshot(step)
        raise RunStopped(f"stopped by {signal.Signals(signum).name} after step "
                         f"{step + 1}{self._where(saved)}", EXIT_CODES[signum])

    def _signum(self) -> int | None:
        """The stop signal this rank got (None: none)."""
        return self.stop.signum if self.stop is not None else None

    def _where(self, saved: Path | None) -> str:
        if saved is None:
            return " (no --out: nothing saved)"
        return f"; snapshot {saved}; resume with: {self.cfg.resume_command()}"

    def _say(self, text: str) -> None:
        if self.env.rank == 0:
            print(text, file=sys.stderr, flush=True)

    # ---- snapshots and the end -----------------------------------------------------------
    def snapshot(self, step: int) -> Path | None:
        """Every update through the step of index `step` flushed into the blocks; rank 0
        writes them to snapshots/checkpoint-N, N = step + 1 the steps done (the newest
        cfg.checkpoint.keep kept). Collective: every rank has the
        RunDir (rank 0 alone owns and writes it)."""
        self.trainer.flush()
        self.last_save_s = time.monotonic()
        check_nodes(self.trainer, self.env, step=step)
        if self.rundir is None:
            return None
        path = self.rundir.snapshot_path(step + 1)
        self._write_weights(path, step)
        if self.env.rank == 0:
            self.rundir.prune(self.cfg.checkpoint.keep)
        return path

    def finish(self) -> None:
        """The weights at the end: final/ (a snapshot of the last step too)."""
        self.trainer.flush()
        last = self.records[-1].step if self.records else self.cfg.start_step - 1
        if last >= 0:
            check_nodes(self.trainer, self.env, step=last)
        if self.rundir is not None and last >= 0:   # a resume that only saves: no records
            self._write_weights(self.rundir.path / FINAL, last)
            if self.env.rank == 0:
                self.rundir.prune(self.cfg.checkpoint.keep)

    def _write_weights(self, path: Path | None, step: int, **state: object) -> None:
        """Rank 0 writes the weights after the step of index `step` (step + 1 done) to `path` (the adapters or prefixes
        alone in a LoRA or prefix run); state.json records what ties them to the run
        (zoexec.run.verify.binding), `state` and the checksums of every file."""
        trainer, store = self.trainer, self.trainer.store
        if not self.cfg.workload.frozen_base:
            trainer.store_shards()   # resident blocks: node 0's first slice group into the store
        if self.env.rank == 0 and path is not None:
            assert self.rundir is not None and self.log is not None, "rank 0 saves to its folder"
            state = {**binding(run_digest=self.rundir.run_digest, step=step + 1,
                               history=self.log.history(step)),
                     "seed": self.cfg.optim.seed, **self._kind(), **state}
            try:
                self._export(path, lambda tmp: {**state, "files": folder_checksums(tmp)})
            except OSError as exc:
                raise ZoError(_write_failed(path, exc)) from None
        monitored_barrier(self.env, self.env.host_world, what="rank 0 to save the weights",
                          timeout_s=fill_timeout_s(0 if self.cfg.workload.frozen_base else store.nbytes,
                                                   base_s=self.env.timeout_s))

    def _kind(self) -> dict[str, object]:
        """What state.json says of the weights: the update mode, or the LoRA (prefix)
        settings and the base they adapt (its path and fingerprint; None: random
        weights), which `zoexec export --merge` checks."""
        wl = self.cfg.workload
        if not wl.frozen_base:
            return {"update": wl.update}
        base = (self.cfg.inputs or {}).get("model")
        if wl.tuning == "prefix":
            return {"tuning": "prefix", "base": base, "prefix": {"tokens": wl.prefix_tokens}}
        return {"tuning": "lora", "base": base,
                "lora": {"r": wl.lora_r, "alpha": wl.lora_alpha, "targets": list(wl.lora_targets)}}

    def _export(self, path: Path, state: SavedState) -> None:
        """The weights as an HF folder (full) or a PEFT adapter folder (LoRA, prefix)."""
        trainer = self.trainer
        if isinstance(trainer, FrozenBaseTrainer):   # the workload's frozen_base
            trainer.save(path, state=state)
            return
        store = trainer.store
        export_weights(trainer.parts, [store.weights(b) for b in range(store.num_blocks)],
                       path, resident=trainer.clean_resident_cpu(),
                       extra_files=Path(self.cfg.source_dir) if self.cfg.source_dir else None,
                       state=state, max_shard_bytes=self.cfg.checkpoint.max_shard_bytes)


def _write_failed(path: Path, exc: OSError) -> str:
    """A failed save in one line: the folder, why, and the free space where it was."""
    return write_failed(path, exc, what="the weights to", tail=" (the last snapshot before it is kept)")


def prepare_rundir(cfg: RunConfig, env: DistEnv, plan_sha256: str, *,
                   z: dict[str, object]) -> RunDir | None:
    """Rank 0 owns the run folder (the lock) and writes its identity: a new run's, with
    what decides z (`z`), or a resumed run's as the builder updated it (an extension,
    a moved input); the other ranks get None. A ZoError (the folder in use) before
    anything is written."""
    if cfg.checkpoint.out is None or env.rank != 0:
        return None
    rundir = RunDir(cfg.checkpoint.out)
    rundir.lock()
    if not cfg.resumed:
        rundir.write_identity(cfg, plan_sha256, z=z)
    elif cfg.identity is not None:
        rundir.write_sealed(cfg.identity)
    return rundir
