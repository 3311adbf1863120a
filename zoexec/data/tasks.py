"""The task types' shared parts (the types themselves: zoexec.data.tasktypes; a run
reads a task's data through zoexec.data.sources): the tokenizer with a task's checks
(Tokens), the examples of the completion and classification types, training rows of
one example each (ExampleRows), and the evaluation set every type returns (EvalSet).

Data files are read with the `datasets` library from local files only (JSONL, JSON,
CSV, Parquet, or a folder written by `Dataset.save_to_disk`); nothing is downloaded.
A text task's JSONL file keeps zoexec.data.text's line-by-line reader (each line checked,
problems named by line). `--eval-samples N` evaluates N examples (text: rows) drawn
with a fixed seed. `--demonstrations K` puts K training examples before each prompt
(zoexec.data.demos); `--task-preset NAME` gives the options of one of MeZO's tasks
(zoexec.data.presets).

Every source answers batch(step, batch_size, seq) with a Batch deterministic in
(seed, step), the same on every rank (zoexec.data.batch.shard keeps each rank's rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from zoexec.data.batch import Batch, Choices, EpochOrder, Example, pack_examples
from zoexec.data.choices import classification_metrics, subset
from zoexec.data.generation import Decoding
from zoexec.data.records import check_columns
from zoexec.data.rowfile import CHARS_PER_TOKEN
from zoexec.data.templates import joiner, not_a_label, template_fields, text_of
from zoplan.errors import ZoError

if TYPE_CHECKING:
    from zoexec.data.taskfields import TaskFields

T = TypeVar("T")
TAG_ROWS = 0x5257   # the training rows' order (every prompt type's)


# ---- examples: a prompt and the tokens the loss counts after it --------------------------------
class Tokens:
    """A tokenizer with the checks a task needs: ids within the model's vocabulary, text
    that does not vanish."""

    def __init__(self, tokenizer: Any, *, vocab: int, where: str, budget: int | None = None) -> None:
        self.tokenizer, self.vocab, self.where = tokenizer, vocab, where
        self.budget = budget   # characters of a text tokenised (zoexec.data.rowfile.text_budget)
        tok = tokenizer
        self.eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else self.eos
        self.pad = pad if pad is not None else 0

    def encode(self, text: str, *, special: bool, what: str, where: str | None = None) -> list[int]:
        """The ids of `text`. Past the budget a prompt (`what` "the prompt") keeps its
        last `budget` characters; any other text (an answer, a candidate) is refused,
        naming `where` (default: the file): it cannot fit the sequence."""
        if self.budget is not None and len(text) > self.budget:
            if what != "the prompt":
                raise ZoError(f"{where or self.where}: {what} is {len(text):,} characters, more "
                              f"than the sequence can hold ({self.budget:,}: "
                              f"{CHARS_PER_TOKEN} characters a token of seq counted)")
            text = text[len(text) - self.budget:]
        ids = list(self.tokenizer(text, add_special_tokens=special)["input_ids"])
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise ZoError(f"{self.where}: {what} has token id {bad[0]}, outside the model's "
                          f"vocabulary (0..{self.vocab - 1}): the tokenizer is not the model's")
        return ids


def completion_examples(rows: Sequence[dict[str, Any]], spec: TaskFields, tokens: Tokens, path: str, *,
                        first: int = 1) -> list[Example]:
    """The examples of `rows` (the first one row number `first` of the file)."""
    check_columns(rows, (spec.prompt_column, spec.completion_column), path)
    out: list[Example] = []
    for number, row in enumerate(rows, start=first):
        where = f"{path} row {number}"
        prompt = tokens.encode(text_of(row[spec.prompt_column], spec.prompt_column, where),
                               special=True, what="the prompt")
        target = tokens.encode(text_of(row[spec.completion_column], spec.completion_column, where),
                               special=False, what="the completion", where=where)
        if not target:
            raise ZoError(f"{where}: the completion tokenises to no tokens: nothing to learn")
        if tokens.eos is not None and not spec.no_eos:
            target.append(tokens.eos)
        out.append(Example(tuple(prompt), tuple(target)))
    return out


@dataclass(frozen=True, kw_only=True)
class Labelled:
    """A classification example: the prompt, every candidate's ids, the label's index."""

    prompt: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]
    label: int

    def example(self, index: int | None = None) -> Example:
        return Example(self.prompt, self.candidates[self.label if index is None else index])


def label_word_ids(spec: TaskFields, tokens: Tokens) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    template = cast(str, spec.template)   # classification: TaskFields' check gives one
    for word in spec.label_words:
        ids = tokens.encode(joiner(template) + word, special=False, what=f"label word {word!r}")
        if not ids:
            raise ZoError(f"label word {word!r} tokenises to no tokens with this tokenizer")
        unk = tokens.tokenizer.unk_token_id
        if unk is not None and unk in ids:
            raise ZoError(f"label word {word!r} is not in the tokenizer's vocabulary (it "
                          f"tokenises to the unknown token)")
        out.append(tuple(ids))
    if len(set(out)) != len(out):
        raise ZoError(f"label words {', '.join(spec.label_words)} tokenise to the same tokens")
    return tuple(out)


def _label_index(value: object, spec: TaskFields, where: str) -> int:
    words = [w.strip() for w in spec.label_words]
    if isinstance(value, (bool, float)):
        raise ZoError(f"{where}: label {value!r} in column {spec.label_column!r} is "
                      f"{not_a_label(value)}: give an integer (0..{len(words) - 1}) or one of the "
                      f"label words ({', '.join(words)})")
    if isinstance(value, str):
        if value.strip() in words:
            return words.index(value.strip())
        if value.strip().lstrip("-").isdigit():
            value = int(value.strip())
    if isinstance(value, int) and 0 <= value < len(words):
        return value
    raise ZoError(f"{where}: label {value!r} in column {spec.label_column!r} is neither "
                  f"0..{len(words) - 1} nor one of the label words ({', '.join(words)})")


def classification_examples(rows: Sequence[dict[str, Any]], spec: TaskFields, tokens: Tokens, path: str, *,
                            first: int = 1) -> list[Labelled]:
    """The examples of `rows` (the first one row number `first` of the file)."""
    template = cast(str, spec.template)   # classification: TaskFields' check gives one
    fields = template_fields(template)
    check_columns(rows, (*fields, spec.label_column), path)
    candidates = label_word_ids(spec, tokens)
    out: list[Labelled] = []
    for number, row in enumerate(rows, start=first):
        where = f"{path} row {number}"
        values = {name: text_of(row[name], name, where) for name in fields}
        prompt = tokens.encode(template.format(**values), special=True, what="the prompt")
        out.append(Labelled(prompt=tuple(prompt), candidates=candidates,
                            label=_label_index(row[spec.label_column], spec, where)))
    return out


# ---- rows of examples --------------------------------------------------------------------------
class ExampleRows:
    """Training rows of a completion or classification task: one example per row,
    visited in a fresh random order each epoch (fixed by `seed`), padded to the
    batch's longest row (pack_examples)."""

    def __init__(self, examples: Sequence[Example], *, pad: int, seed: int, path: str) -> None:
        self.examples, self.pad, self.seed, self.path = examples, pad, seed, path
        self.order = EpochOrder(TAG_ROWS, seed)

    def batch(self, step: int, batch_size: int, seq: int) -> Batch:
        picks = self.order.picks(step, batch_size, len(self.examples))
        return pack_examples([self.examples[i] for i in picks], seq=seq, pad=self.pad,
                             where=self.path)

    def epoch_of(self, step: int) -> float | None:
        """Passes over the examples after `step` (the metrics' "epoch")."""
        return self.order.epoch_of(step)

    def check(self, seq: int, rows: Sequence[int] | None = None) -> None:
        """Every example fits `seq` with a prompt token (a ZoError names the row
        otherwise); `rows`: the indices of those checked (None: all)."""
        for index in range(len(self.examples)) if rows is None else rows:
            ex = self.examples[index]
            if len(ex.target) > seq - (1 if ex.prompt else 0):
                pack_examples([ex], seq=seq, pad=self.pad, where=f"{self.path} row {index + 1}")


# ---- evaluation sets ---------------------------------------------------------------------------
@dataclass(kw_only=True)
class EvalSet:
    """Rows to score and how to turn their scores into metrics: `rows` (Examples, in
    order). Classification: `labels[e]`, the label of example e, and either `tokens`
    (single-token candidates: row e is example e, each candidate scored at its answer
    position) or `groups[e]` = (first row, candidates, label) (a row per candidate,
    consecutive); `loss`: the training loss, whose value on the data is eval_loss."""

    rows: Sequence[Example]   # a list, or rows made as they are read (packed text: EvalRows)
    pad: int
    groups: list[tuple[int, int, int]] | None = None
    scored: list[int] | None = None   # rows whose loss is the vocabulary loss (None: all)
    tokens: tuple[int, ...] | None = None
    labels: list[int] | None = None
    loss: str = "vocabulary"
    scorer: Callable[[torch.Tensor], dict[str, float]] | None = None   # other metrics of the rows' [CE, tokens]
    decoding: Decoding | None = None   # generation: what to generate (zoexec.train.generate)

    @property
    def width(self) -> int:
        """Figures per row that Trainer.evaluate returns (zoexec.model.heads.row_scores)."""
        return 2 if self.tokens is None else len(self.tokens)

    def pack(self, start: int, stop: int, *, rows: int, seq: int) -> Batch:
        """Rows start..stop as a Batch of `rows` rows (empty rows after them: no label)."""
        chunk = list(self.rows[start:stop])
        chunk += [Example((), ())] * (rows - len(chunk))
        batch = pack_examples(chunk, seq=seq, pad=self.pad, where="eval data")
        if self.tokens is None:
            return batch
        tokens = torch.tensor(self.tokens, dtype=torch.long).expand(rows, -1)
        return Batch(batch.ids, batch.labels,
                     Choices(torch.zeros(rows, dtype=torch.long), tokens=tokens))

    def metrics(self, out: torch.Tensor) -> dict[str, float]:
        """eval_loss, and for classification eval_accuracy and eval_f1 (two labels, label
        1 positive), from `out` (float64, a row of `width` figures per row: [summed CE,
        labelled tokens], or the candidates' log-probabilities); `scorer`'s instead
        (multiple choice: zoexec.data.multichoice.choice_metrics)."""
        if self.scorer is not None:
            return self.scorer(out)
        if self.tokens is not None:
            labels = cast(list[int], self.labels)   # set with tokens (classification)
            right = out[torch.arange(len(labels)), labels]
            return classification_metrics(out, labels, loss=self.loss,
                                          vocabulary_loss=float(-right.mean()))
        scored = out if self.scored is None else out[self.scored]
        total, count = float(scored[:, 0].sum()), float(scored[:, 1].sum())
        vocabulary = total / count if count else math.nan
        if self.groups is None:
            return {"eval_loss": vocabulary}
        widest = max(size for _, size, _ in self.groups)
        scores = torch.full((len(self.groups), widest), -math.inf, dtype=torch.float64)
        for e, (first, size, _) in enumerate(self.groups):
            rows = out[first:first + size]
            scores[e, :size] = -rows[:, 0] / rows[:, 1]   # mean log-likelihood per token
        return classification_metrics(scores, [label for _, _, label in self.groups],
                                      loss=self.loss, vocabulary_loss=vocabulary)


# ---- evaluation sets of the types ---------------------------------------------------------
def classification_eval_set(examples: list[Labelled], spec: TaskFields, *, pad: int) -> EvalSet:
    """The classification examples' evaluation rows: a row each with single-token
    candidates (scored at the answer position), else a row per candidate."""
    labels = [ex.label for ex in examples]
    if all(len(c) == 1 for c in examples[0].candidates):   # the label words: all alike
        return EvalSet(rows=[ex.example() for ex in examples], pad=pad, labels=labels,
                       tokens=tuple(c[0] for c in examples[0].candidates),
                       loss=spec.classification_loss)
    out: list[Example] = []
    groups: list[tuple[int, int, int]] = []
    scored: list[int] = []
    for ex in examples:
        groups.append((len(out), len(ex.candidates), ex.label))
        scored.append(len(out) + ex.label)
        out.extend(ex.example(i) for i in range(len(ex.candidates)))
    return EvalSet(rows=out, pad=pad, groups=groups, scored=scored, labels=labels,
                   loss=spec.classification_loss)


def some(items: Sequence[T], samples: int | None) -> Sequence[T]:
    """--eval-samples: `samples` of `items`, drawn with a fixed seed, in order (a list of
    those read); all of them (`items` itself, nothing read) when None or not fewer."""
    if samples is None or samples >= len(items):
        return items
    return some_list(items, samples)


def some_list(items: Sequence[T], samples: int | None) -> list[T]:
    """some() as a list, every item picked read (each by its index)."""
    return [items[i] for i in subset(len(items), samples)]
