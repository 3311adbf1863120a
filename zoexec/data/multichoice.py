"""`--task multiple-choice`: a prompt and candidate continuations, one of them right
(COPA, ReCoRD: MeZO's "multiple choice" tasks).

Each row: the prompt from `--template`; the candidates either one template each
(`--choices "{choice1}|{choice2}"`) or one per item of a list column
(`--choices-column`, each item filled into the single `--choices` template as {choice},
default "{choice}"); each candidate follows the prompt after a space (none after
whitespace: zoexec.data.templates.joiner). The label (`--label-column`): the right
candidate's index, the right item's text, or a list of right items (ReCoRD's answers:
any of them counts as right, the first one is trained on).

Training (zoexec.data.batch.Choices, zoexec.model.heads): a row per candidate, the
batch's examples padded to its most candidates with empty rows (masked out); the loss
is the cross-entropy of the right candidate among the candidates' scores, a
candidate's score its log-likelihood after the prompt, averaged per token
(`--choice-score mean`, MeZO's: the large-model code divides by the option's length)
or summed (`sum`). Evaluation: the same rows; the likeliest candidate wins, by summed
log-likelihood (eval_accuracy) and per token (eval_accuracy_norm); eval_loss is the
training loss on the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from zoexec.data.batch import Batch, Choices, EpochOrder, Example, pack_examples
from zoexec.data.records import check_columns
from zoexec.data.templates import fill, joiner, not_a_label, template_fields, text_of
from zoplan.errors import ZoError

if TYPE_CHECKING:
    from zoexec.data.presets import Preset
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import Tokens


@dataclass(frozen=True, kw_only=True)
class MultipleChoice:
    """A multiple-choice example: the prompt, each candidate's ids, the right ones' indices
    (`golds`; the first is `label`, the one trained on)."""

    prompt: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]
    golds: tuple[int, ...]

    @property
    def label(self) -> int:
        return self.golds[0]

    def example(self, index: int | None = None) -> Example:
        return Example(self.prompt, self.candidates[self.label if index is None else index])


# ---- rows of a file --------------------------------------------------------------------
def template_columns(spec: TaskFields, preset: Preset | None) -> list[str]:
    """The columns `spec`'s templates name (not the preset's derived fields, not {choice})."""
    derived = set(preset.derived + preset.choice_derived) if preset else set()
    names = template_fields(cast(str, spec.template))   # multiple choice: TaskFields' check gives one
    for template in spec.choices:
        names += template_fields(template, option="--choices")
    return [n for n in dict.fromkeys(names) if n not in derived and n != "choice"]


def needed_columns(spec: TaskFields, preset: Preset | None) -> list[str]:
    """The template's columns, the candidates' list column and the label's (and the
    columns a preset's derived fields are made from)."""
    extra = [spec.choices_column] if spec.choices_column else []
    derived_from = list(preset.columns) if preset and preset.derive else []
    names = [*template_columns(spec, preset), *extra, spec.label_column, *derived_from]
    return list(dict.fromkeys(names))


def choice_texts(row: dict[str, Any], values: dict[str, str], spec: TaskFields, preset: Preset | None, where: str) -> tuple[list[str], list[str]]:
    """(each candidate's raw item (its text for --choices templates), its text)."""
    if not spec.choices_column:
        texts = [fill(t, values, where=where, option="--choices") for t in spec.choices]
        return texts, texts
    items = row[spec.choices_column]
    if not isinstance(items, (list, tuple)):
        raise ZoError(f"{where}: column {spec.choices_column!r} holds "
                      f"{type(items).__name__}, not a list of candidates")
    if not items:
        raise ZoError(f"{where}: column {spec.choices_column!r} holds an empty list: no "
                      f"candidates")
    items = [text_of(i, spec.choices_column, where) for i in items]
    for index, item in enumerate(items):
        if not item.strip():
            raise ZoError(f"{where}: item {index + 1} of column {spec.choices_column!r} is empty: "
                          f"an empty candidate is no answer")
    items = list(dict.fromkeys(items))
    template = spec.choices[0] if spec.choices else "{choice}"
    texts = [fill(template, {**values, "choice": item,
                             **(preset.choice_fields(row, item, where) if preset else {})},
                  where=where, option="--choices") for item in items]
    return items, texts


def check_candidates(texts: list[str], spec: TaskFields, where: str) -> None:
    """ZoError naming the row and the column when a candidate is empty (it would score 0
    summed log-likelihood and always win) or two read the same (no right answer)."""
    for index, text in enumerate(texts):
        if not text.strip():
            raise ZoError(f"{where}: candidate {index + 1} ({_source(spec, index)}) is empty: an "
                          f"empty candidate scores no tokens and always wins")
    seen: dict[str, int] = {}
    for index, text in enumerate(texts):
        if text in seen:
            raise ZoError(f"{where}: candidates {seen[text] + 1} and {index + 1} "
                          f"({_source(spec, seen[text])}, {_source(spec, index)}) read the same, "
                          f"{text.strip()[:60]!r}: no candidate could be told right")
        seen[text] = index


def _source(spec: TaskFields, index: int) -> str:
    """Where candidate `index` comes from, in words: an item of --choices-column, or a
    --choices template (and the columns it names)."""
    if spec.choices_column:
        return f"item {index + 1} of column {spec.choices_column!r}"
    template = spec.choices[index]
    names = ", ".join(repr(n) for n in template_fields(template))
    return f"--choices {template!r}" + (f", from {names}" if names else "")


def golds_of(value: object, items: list[str], column: str, where: str) -> tuple[int, ...]:
    """The right candidates' indices from the label cell: an index, an item's text, or a
    list of items' texts (in the order the cell lists them)."""
    if isinstance(value, (bool, float)):
        raise ZoError(f"{where}: label {value!r} in column {column!r} is {not_a_label(value)}: "
                      f"give a candidate's index (an integer, 0..{len(items) - 1}) or its text")
    if isinstance(value, str) and value.strip().isdigit() and value.strip() not in items:
        value = int(value.strip())
    if isinstance(value, int):
        if 0 <= value < len(items):
            return (value,)
        raise ZoError(f"{where}: label {value} is not a candidate's index (0..{len(items) - 1})")
    named = [value] if isinstance(value, str) else value
    if isinstance(named, (list, tuple)):
        found = tuple(dict.fromkeys(items.index(str(v)) for v in named if str(v) in items))
        if found:
            return found
    raise ZoError(f"{where}: label {value!r} in column {column!r} is neither a candidate's "
                  f"index nor one of its candidates")


def choice_examples(rows: Sequence[dict[str, Any]], spec: TaskFields, tokens: Tokens, path: str,
                    preset: Preset | None = None, *, first: int = 1) -> list[MultipleChoice]:
    """The multiple-choice examples of `rows` (see the module docstring; the first row
    is row number `first` of the file)."""
    check_columns(rows, needed_columns(spec, preset), path)
    columns = template_columns(spec, preset)
    out: list[MultipleChoice] = []
    for number, row in enumerate(rows, start=first):
        where = f"{path} row {number}"
        values = {n: text_of(row[n], n, where) for n in columns}
        values.update(preset.fields(row, where) if preset else {})
        prompt_text = fill(cast(str, spec.template), values, where=where)
        items, texts = choice_texts(row, values, spec, preset, where)
        check_candidates(texts, spec, where)
        gap = joiner(prompt_text)
        candidates = tuple(tuple(tokens.encode(gap + text, special=False, what=f"candidate {i}",
                                                         where=where))
                           for i, text in enumerate(texts))
        if any(not c for c in candidates):
            raise ZoError(f"{where}: a candidate tokenises to no tokens")
        out.append(MultipleChoice(
            prompt=tuple(tokens.encode(prompt_text, special=True, what="the prompt")),
            candidates=candidates,
            golds=golds_of(row[spec.label_column], items, spec.label_column, where)))
    return out


# ---- training rows -----------------------------------------------------------------------
def choice_batch(examples: list[MultipleChoice], *, score: str, seq: int, pad: int,
                 where: str = "data") -> Batch:
    """A row per candidate of each example, every example padded with empty rows to the
    most candidates any has (masked out of the loss): the candidate loss's batch."""
    size = max(len(ex.candidates) for ex in examples)
    rows: list[Example] = []
    valid: list[list[bool]] = []
    for ex in examples:
        rows += [ex.example(i) for i in range(len(ex.candidates))]
        rows += [Example((), ())] * (size - len(ex.candidates))
        valid.append([i < len(ex.candidates) for i in range(size)])
    batch = pack_examples(rows, seq=seq, pad=pad, where=where)
    answers = torch.tensor([ex.label for ex in examples], dtype=torch.long)
    mask = None if all(map(all, valid)) else torch.tensor(valid, dtype=torch.bool)
    return Batch(batch.ids, batch.labels,
                 Choices(answers, size=size, valid=mask, mean=score == "mean"))


class MultipleChoiceRows:
    """Training rows of a multiple-choice task: the examples in a fresh random order each
    epoch (fixed by `seed` and `tag`), a row per candidate (choice_batch)."""

    def __init__(self, examples: Sequence[MultipleChoice], *, score: str, pad: int, seed: int,
                 tag: int, path: str) -> None:
        self.examples, self.score, self.pad, self.path = examples, score, pad, path
        self.order = EpochOrder(tag, seed)

    def batch(self, step: int, batch_size: int, seq: int) -> Batch:
        picks = self.order.picks(step, batch_size, len(self.examples))
        return choice_batch([self.examples[i] for i in picks], score=self.score, seq=seq,
                            pad=self.pad, where=self.path)

    def epoch_of(self, step: int) -> float | None:
        return self.order.epoch_of(step)

    def check(self, seq: int, rows: Sequence[int] | None = None) -> None:
        """Every example's rows fit `seq` (a ZoError names the row otherwise); `rows`:
        the indices of those checked (None: all)."""
        for index in range(len(self.examples)) if rows is None else rows:
            choice_batch([self.examples[index]], score=self.score, seq=seq, pad=self.pad,
                         where=f"{self.path} row {index + 1}")


# ---- evaluation --------------------------------------------------------------------------
def choice_rows(examples: list[MultipleChoice]) -> tuple[list[Example], list[tuple[int, int]]]:
    """The evaluation rows (a row per candidate, each example's consecutive) and each
    example's (first row, candidates)."""
    rows: list[Example] = []
    groups: list[tuple[int, int]] = []
    for ex in examples:
        groups.append((len(rows), len(ex.candidates)))
        rows += [ex.example(i) for i in range(len(ex.candidates))]
    return rows, groups


def choice_eval_parts(examples: list[MultipleChoice], *, score: str
                      ) -> tuple[list[Example], Callable[[torch.Tensor], dict[str, float]]]:
    """(the evaluation rows, the function of their [CE, tokens] that gives the metrics)."""
    rows, groups = choice_rows(examples)
    golds = [ex.golds for ex in examples]
    return rows, lambda out: choice_metrics(out, groups, golds, score=score)


def choice_metrics(out: torch.Tensor, groups: list[tuple[int, int]],
                   golds: list[tuple[int, ...]], *, score: str) -> dict[str, float]:
    """eval_loss (the training loss: the first gold's cross-entropy among the candidates'
    `score`s, mean over the examples), eval_accuracy (the largest summed log-likelihood
    is a gold) and eval_accuracy_norm (the largest per token), from `out` [rows, 2] of
    (summed CE, tokens) per row (float64)."""
    loss, right, right_norm = 0.0, 0, 0
    for (first, size), gold in zip(groups, golds):
        rows = out[first:first + size]
        summed = -rows[:, 0]
        per_token = summed / rows[:, 1]
        scores = per_token if score == "mean" else summed
        loss -= float(torch.log_softmax(scores, dim=0)[gold[0]])
        right += int(torch.argmax(summed)) in gold
        right_norm += int(torch.argmax(per_token)) in gold
    count = len(groups)
    return {"eval_loss": loss / count if count else math.nan,
            "eval_accuracy": right / count if count else math.nan,
            "eval_accuracy_norm": right_norm / count if count else math.nan}
