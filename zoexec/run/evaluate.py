"""Evaluation: held-out loss, accuracy and F1 through the offloaded block pipeline.

`Evaluator.run(trainer)` scores an EvalSet (zoexec.data.tasks) with Trainer.evaluate, on the
clean weights (pending updates flushed), in calls of the plan's global batch: every
rank of the job makes the same calls (the slice groups gather each block), each
scores its data shard's rows of every call, and the rank that computes l+ for a data
shard (one per shard) places its rows' (summed CE, labelled tokens) in a [rows, 2]
tensor that is summed over the world, so every rank ends with every row's loss and
the metrics are the same whatever the layout. Rows are padded to the call's longest
row, and the last call with empty rows (no labels, no loss). A classification example
with single-token candidates is one row: its candidates are all scored from the
logits at its answer position (zoexec.data.choices); `--eval-samples N` scores N
examples drawn with a fixed seed. A generation task's answers are then generated
greedily (zoexec.train.generate) and scored (eval_exact_match, eval_f1).

`zoexec eval` runs the same path on one rank (zoexec.launch.evaluate).
"""

from __future__ import annotations

import torch

from zoexec.config import RunConfig
from zoexec.data.sources import make_eval_set
from zoexec.data.tasks import EvalSet
from zoexec.runtime.errors import failing
from zoexec.train.engine import Trainer
from zoexec.train.generate import greedy


class Evaluator:
    """Evaluation of `eval_set` every `every` steps (None: at the end only) and after
    the last step; `batch`: rows per call over the whole job (the plan's batch)."""

    def __init__(self, eval_set: EvalSet, *, batch: int, seq: int, every: int | None = None) -> None:
        self.eval_set, self.batch, self.seq, self.every = eval_set, batch, seq, every

    def due(self, step: int, last: int) -> bool:
        """Evaluate after `step` (0-based) of a run whose last step is `last`?"""
        return step == last or (self.every is not None and (step + 1) % self.every == 0)

    def run(self, trainer: Trainer) -> dict[str, float]:
        """The metrics of the eval set with the trainer's clean weights (collective: every
        rank calls it at the same step)."""
        env = trainer.env
        ddp = env.layout.ddp
        per = max(1, self.batch // ddp)
        call = per * ddp
        count = len(self.eval_set.rows)
        out = torch.zeros(count, self.eval_set.width, dtype=torch.float64)
        counts = trainer.signs[0] > 0
        for start in range(0, count, call):
            batch = self.eval_set.pack(start, min(start + call, count), rows=call, seq=self.seq)
            lo = trainer.data_shard * per
            scores = trainer.evaluate(batch.select(lo, lo + per))
            stop = min(per, count - start - lo)
            if counts and stop > 0:
                out[start + lo:start + lo + stop] = scores[:stop]
        if env.place.world_size > 1:
            import torch.distributed as dist

            out = out.to(trainer.token.device)
            with failing("eval", rank=env.rank):
                dist.all_reduce(out, group=env.world)
            out = out.cpu()
        metrics = self.eval_set.metrics(out)
        decoding = self.eval_set.decoding
        if decoding is not None:   # generation: the answers generated, scored
            metrics.update(decoding.metrics(greedy(trainer, decoding, batch=self.batch)))
        return metrics


def make_evaluator(cfg: RunConfig) -> Evaluator | None:
    """The run's Evaluator (None without --eval-data); the eval set is read here."""
    if not cfg.task.eval_data:
        return None
    wl = cfg.workload
    eval_set = make_eval_set(cfg.task.eval_data, cfg.task, vocab=cfg.model_spec.vocab,
                             seq=wl.seq, tokenizer_dir=cfg.tokenizer_dir,
                             samples=cfg.task.eval_samples, train_path=_train_path(cfg))
    return Evaluator(eval_set, batch=wl.batch, seq=wl.seq, every=cfg.logging.eval_every)


def _train_path(cfg: RunConfig) -> str | None:
    """Where demonstrations come from by default: the training data (zoexec eval: the
    evaluated file)."""
    return None if cfg.task.data == "synthetic" else cfg.task.data
