"""Classification's candidates as rows, for the candidate loss and the evaluation.

An example (zoexec.data.tasks.Labelled: a prompt, every candidate's ids, the label)
becomes rows in one of two ways (`classification_batch`):
- single-token candidates (every label word one token, the usual case): ONE row per
  example, the prompt and the correct candidate's token, labelled on that token; the
  candidates' ids ride along (zoexec.data.batch.Choices.tokens) and the head scores them
  all from the logits at the answer position (zoexec.model.heads);
- longer candidates: a row per candidate (prompt + candidate, labelled on the
  candidate's tokens), the example's rows consecutive; a candidate's score is the mean
  log-probability of its tokens (MeZO).
With `--classification-loss vocabulary` a training example is one row, the correct
candidate's tokens labelled, and the loss is their cross-entropy over the vocabulary.

`classification_metrics` turns the candidates' scores into eval_accuracy, eval_f1
(two labels, label 1 positive) and eval_loss (the run's training loss on the data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from zoexec.data.batch import Batch, Choices, EpochOrder, Example, generator, pack_examples

_TAG_SUBSET = 0x5355   # the --eval-samples subset's order


class Candidates(Protocol):
    """A classification example (zoexec.data.tasks.Labelled): every candidate's ids, the
    label's index, and the row of a candidate (default: the label's)."""

    @property
    def candidates(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def label(self) -> int: ...
    def example(self, index: int | None = None) -> Example: ...


def single_tokens(examples: Sequence[Candidates]) -> bool:
    """Is every candidate of every example one token?"""
    return all(len(c) == 1 for ex in examples for c in ex.candidates)


def classification_batch(examples: Sequence[Candidates], *, loss: str, seq: int, pad: int,
                         where: str = "data") -> Batch:
    """The rows of `examples` for `loss` ("candidates" or "vocabulary"); see the module
    docstring."""
    answers = torch.tensor([ex.label for ex in examples], dtype=torch.long)
    if loss == "vocabulary":
        return pack_examples([ex.example() for ex in examples], seq=seq, pad=pad, where=where)
    if single_tokens(examples):
        batch = pack_examples([ex.example() for ex in examples], seq=seq, pad=pad, where=where)
        tokens = torch.tensor([[c[0] for c in ex.candidates] for ex in examples], dtype=torch.long)
        return Batch(batch.ids, batch.labels, Choices(answers, tokens=tokens))
    size = len(examples[0].candidates)
    assert all(len(ex.candidates) == size for ex in examples), "one number of candidates"
    rows = [ex.example(i) for ex in examples for i in range(size)]
    batch = pack_examples(rows, seq=seq, pad=pad, where=where)
    return Batch(batch.ids, batch.labels, Choices(answers, size=size))


class ChoiceRows:
    """Training rows of a classification task: examples visited in a fresh random order
    each epoch (fixed by `seed` and `tag`), made into rows for `loss`."""

    def __init__(self, examples: Sequence[Candidates], *, loss: str, pad: int, seed: int, tag: int,
                 path: str | Path) -> None:
        self.examples, self.loss, self.pad, self.path = examples, loss, pad, path
        self.order = EpochOrder(tag, seed)

    def batch(self, step: int, batch_size: int, seq: int) -> Batch:
        picks = self.order.picks(step, batch_size, len(self.examples))
        return classification_batch([self.examples[i] for i in picks], loss=self.loss,
                                    seq=seq, pad=self.pad, where=str(self.path))

    def epoch_of(self, step: int) -> float | None:
        """Passes over the examples after `step` (the metrics' "epoch")."""
        return self.order.epoch_of(step)

    def check(self, seq: int, rows: Sequence[int] | None = None) -> None:
        """Every example's rows fit `seq` (a ZoError names the row otherwise); `rows`:
        the indices of those checked (None: all)."""
        for index in range(len(self.examples)) if rows is None else rows:
            classification_batch([self.examples[index]], loss=self.loss, seq=seq, pad=self.pad,
                                 where=f"{self.path} row {index + 1}")


def subset(count: int, samples: int | None) -> list[int]:
    """--eval-samples: `samples` of `count` examples drawn with a fixed seed, in file
    order (the same ones in `zoexec run` and `zoexec eval`); all of them when None or
    when samples >= count."""
    if samples is None or samples >= count:
        return list(range(count))
    order = torch.randperm(count, generator=generator(_TAG_SUBSET, 0))
    return sorted(int(i) for i in order[:samples])


def classification_metrics(scores: torch.Tensor, labels: list[int], *, loss: str,
                           vocabulary_loss: float) -> dict[str, float]:
    """eval_loss, eval_accuracy and (two labels) eval_f1 of `scores` [examples,
    candidates] (float64: a candidate's log-likelihood, the largest wins). eval_loss:
    the candidate loss (the mean over the examples of the correct candidate's
    cross-entropy among the scores) or, for loss "vocabulary", `vocabulary_loss`."""
    target = torch.tensor(labels, dtype=torch.long)
    picks = scores.argmax(dim=1)
    out = {"eval_loss": vocabulary_loss}
    if loss == "candidates":
        ce = torch.nn.functional.cross_entropy(scores, target, reduction="sum")
        out["eval_loss"] = float(ce) / len(labels) if labels else math.nan
    out["eval_accuracy"] = float((picks == target).double().mean())
    if scores.shape[1] == 2:
        tp = int(((picks == 1) & (target == 1)).sum())
        fp = int(((picks == 1) & (target == 0)).sum())
        fn = int(((picks == 0) & (target == 1)).sum())
        out["eval_f1"] = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    return out
