"""Tasks: what a row of data holds and which of its tokens the loss counts.

Data files are read with the `datasets` library from local files only (JSONL, JSON,
CSV, Parquet, or a folder written by `Dataset.save_to_disk`); nothing is downloaded.
A text task's JSONL file keeps zoexec.data.text's line-by-line reader (each line checked,
problems named by line). Five tasks (`--task`):

text            packed language modelling (zoexec.data.text.TextData): documents (column
                `--text-column`, or `input_ids`) tokenised, an EOS after each, joined and
                cut into rows of the plan's seq; every token is predicted except the
                first token of each document, so a document's tokens (and the EOS that
                ends it) never predict the next document's. Attention still sees the
                earlier documents of a row, as in the HF Trainer's packing.
completion      one example per row: the prompt (`--prompt-column`) tokenised with the
                tokenizer's special tokens, then the completion (`--completion-column`)
                without them and an EOS (when the tokenizer has one); the loss counts the
                completion's tokens and that EOS only. Rows are padded to the longest row
                of the batch (pad id: the tokenizer's pad, else EOS, else 0; never a label).
                A row longer than the plan's seq loses tokens from the left of its prompt;
                a completion that does not fit with one prompt token is refused.
classification  MeZO's prompt style: `--template` (e.g. "{sentence} It was": each {name}
                is a column) makes the prompt, and `--label-words` (e.g.
                "terrible,great": label 0, 1, ...; a label is an index or one of the
                words) the candidates, each scored as " " + word after the prompt
                (a leading space, as MeZO's templates). Training loss
                (`--classification-loss`): "candidates" (the default, MeZO's: the
                cross-entropy of the correct candidate among the candidates' scores at
                the answer position) or "vocabulary" (the LM loss of the correct label
                word's tokens over the whole vocabulary: a completion row); rows and
                scores: zoexec.data.choices. Evaluation: every candidate scored by its
                log-likelihood after the prompt (single tokens: all from one forward of
                the example; longer ones: the mean per token, a row each); accuracy =
                the argmax is the label; F1 of label 1 with two labels; eval_loss = the
                training loss on the data.
multiple-choice a prompt and candidate continuations (COPA, ReCoRD): zoexec.data.multichoice.
generation      a prompt and free-text gold answers (SQuAD, DROP), evaluated by greedy
                decoding, exact match and F1: zoexec.data.generation.
`--eval-samples N` evaluates N examples (text: rows) drawn with a fixed seed.
`--demonstrations K` puts K training examples before each prompt (zoexec.data.demos);
`--task-preset NAME` gives the options of one of MeZO's tasks (zoexec.data.presets).

Every source answers batch(step, batch_size, seq) with a Batch deterministic in
(seed, step), the same on every rank (zoexec.data.batch.shard keeps each rank's rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from zoexec.data.batch import Batch, Choices, EpochOrder, Example, pack_examples
from zoexec.data.choices import LOSSES, ChoiceRows, classification_metrics, subset
from zoexec.data.demos import check_demonstrations, demonstrations_from, with_demonstrations
from zoexec.data.generation import Decoding, check_generation, decoding_of, generation_examples
from zoexec.data.multichoice import (
    MultipleChoiceRows,
    check_choices,
    choice_eval_parts,
    choice_examples,
)
from zoexec.data.presets import TASKS, preset
from zoexec.data.records import check_columns, load_records
from zoexec.data.templates import joiner, not_a_label, template_fields, text_of
from zoexec.data.text import SyntheticTask, TextData, check_data, load_tokenizer
from zoplan.errors import ZoError

TEMPLATED = ("classification", "multiple-choice", "generation")   # tasks with --template
_TAG_ROWS = 0x5257


# ---- the task's options ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """The task and its columns (see the module docstring); `to_dict` is what run.json
    records (a resume refuses another)."""

    name: str = "text"
    text_column: str = "text"
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    label_column: str = "label"
    template: str | None = None
    label_words: tuple[str, ...] = field(default=())
    classification_loss: str = "candidates"
    task_preset: str | None = None
    choices: tuple[str, ...] = field(default=())
    choices_column: str | None = None
    choice_score: str = "mean"
    answer_column: str = "answer"
    max_new_tokens: int = 32
    stop_at: str = "eos"
    demonstrations: int = 0
    demonstrations_in_training: bool = False
    demonstrations_seed: int = 0
    demonstrations_data: str | None = None

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ZoError(f"--task {self.name!r}: give one of {', '.join(TASKS)}")
        if self.template is not None and self.name not in TEMPLATED:
            raise ZoError(f"--template is one of the options of --task "
                          f"{', '.join(TEMPLATED)}, not of --task {self.name}")
        if self.label_words and self.name != "classification":
            raise ZoError("--label-words is an option of --task classification")
        if (self.choices or self.choices_column) and self.name != "multiple-choice":
            raise ZoError("--choices and --choices-column are options of --task multiple-choice")
        preset(self.task_preset)
        check_demonstrations(self)
        check_generation(self)
        if self.name == "multiple-choice":
            check_choices(self)
        if self.name != "classification":
            return
        if not self.template:
            raise ZoError("--task classification needs --template, e.g. \"{sentence} It was\" "
                          "(each {name} is a column of the data)")
        if not template_fields(self.template):
            raise ZoError(f"--template {self.template!r} names no column: put the text's "
                          f"column in braces, e.g. \"{{sentence}} It was\"")
        if len(self.label_words) < 2:
            raise ZoError("--task classification needs --label-words with two or more words, "
                          "comma-separated (label 0 first), e.g. \"terrible,great\"")
        if any(not w.strip() for w in self.label_words):
            raise ZoError(f"--label-words {','.join(self.label_words)!r}: a label word is empty")
        if len(set(self.label_words)) != len(self.label_words):
            raise ZoError(f"--label-words {','.join(self.label_words)!r}: a word appears twice")
        if self.classification_loss not in LOSSES:
            raise ZoError(f"--classification-loss {self.classification_loss!r}: give one of "
                          f"{', '.join(LOSSES)}")

    def to_dict(self) -> dict:
        out = {"name": self.name}
        for key in _RECORDED[self.name] + self._recorded_extras():
            value = getattr(self, key)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def _recorded_extras(self) -> tuple[str, ...]:
        demos = ("demonstrations", "demonstrations_in_training", "demonstrations_seed",
                 "demonstrations_data") if self.demonstrations else ()
        return (("task_preset",) if self.task_preset else ()) + demos

    @classmethod
    def from_dict(cls, data: dict | None) -> TaskSpec:
        if not data:
            return cls()
        data = dict(data)
        if data.get("name") == "classification":   # runs from before the candidate loss
            data.setdefault("classification_loss", "vocabulary")
        for key in ("label_words", "choices"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)

_RECORDED = {   # what run.json records of each task (TaskSpec.to_dict)
    "text": ("text_column",), "completion": ("prompt_column", "completion_column"),
    "classification": ("template", "label_words", "label_column", "classification_loss"),
    "multiple-choice": ("template", "choices", "choices_column", "label_column", "choice_score"),
    "generation": ("template", "prompt_column", "answer_column", "max_new_tokens", "stop_at")}


def parse_label_words(text: str | None) -> tuple[str, ...]:
    """--label-words "terrible,great" -> ("terrible", "great") (each stripped)."""
    if text is None:
        return ()
    return tuple(word.strip() for word in text.split(","))


# ---- examples: a prompt and the tokens the loss counts after it --------------------------------
class Tokens:
    """A tokenizer with the checks a task needs: ids within the model's vocabulary, text
    that does not vanish."""

    def __init__(self, tokenizer, *, vocab: int, where) -> None:
        self.tokenizer, self.vocab, self.where = tokenizer, vocab, where
        tok = tokenizer
        self.eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else self.eos
        self.pad = pad if pad is not None else 0

    def encode(self, text: str, *, special: bool, what: str) -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=special)["input_ids"])
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise ZoError(f"{self.where}: {what} has token id {bad[0]}, outside the model's "
                          f"vocabulary (0..{self.vocab - 1}): the tokenizer is not the model's")
        return ids


def completion_examples(rows, spec: TaskSpec, tokens: Tokens, path) -> list[Example]:
    check_columns(rows, (spec.prompt_column, spec.completion_column), path)
    out = []
    for number, row in enumerate(rows, start=1):
        where = f"{path} row {number}"
        prompt = tokens.encode(text_of(row[spec.prompt_column], spec.prompt_column, where),
                               special=True, what="the prompt")
        target = tokens.encode(text_of(row[spec.completion_column], spec.completion_column, where),
                               special=False, what="the completion")
        if not target:
            raise ZoError(f"{where}: the completion tokenises to no tokens: nothing to learn")
        if tokens.eos is not None:
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


def label_word_ids(spec: TaskSpec, tokens: Tokens) -> tuple[tuple[int, ...], ...]:
    out = []
    for word in spec.label_words:
        ids = tokens.encode(joiner(spec.template) + word, special=False, what=f"label word {word!r}")
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


def _label_index(value, spec: TaskSpec, where: str) -> int:
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


def classification_examples(rows, spec: TaskSpec, tokens: Tokens, path) -> list[Labelled]:
    fields = template_fields(spec.template)
    check_columns(rows, (*fields, spec.label_column), path)
    candidates = label_word_ids(spec, tokens)
    out = []
    for number, row in enumerate(rows, start=1):
        where = f"{path} row {number}"
        values = {name: text_of(row[name], name, where) for name in fields}
        prompt = tokens.encode(spec.template.format(**values), special=True, what="the prompt")
        out.append(Labelled(prompt=tuple(prompt), candidates=candidates,
                            label=_label_index(row[spec.label_column], spec, where)))
    return out


# ---- rows of examples --------------------------------------------------------------------------
class ExampleRows:
    """Training rows of a completion or classification task: one example per row,
    visited in a fresh random order each epoch (fixed by `seed`), padded to the
    batch's longest row (pack_examples)."""

    def __init__(self, examples: list[Example], *, pad: int, seed: int, path) -> None:
        self.examples, self.pad, self.seed, self.path = examples, pad, seed, path
        self.order = EpochOrder(_TAG_ROWS, seed)

    def batch(self, step: int, batch_size: int, seq: int):
        picks = self.order.picks(step, batch_size, len(self.examples))
        return pack_examples([self.examples[i] for i in picks], seq=seq, pad=self.pad,
                             where=self.path)

    def epoch_of(self, step: int) -> float | None:
        """Passes over the examples after `step` (the metrics' "epoch")."""
        return self.order.epoch_of(step)


# ---- evaluation sets ---------------------------------------------------------------------------
@dataclass(kw_only=True)
class EvalSet:
    """Rows to score and how to turn their scores into metrics: `rows` (Examples, in
    order). Classification: `labels[e]`, the label of example e, and either `tokens`
    (single-token candidates: row e is example e, each candidate scored at its answer
    position) or `groups[e]` = (first row, candidates, label) (a row per candidate,
    consecutive); `loss`: the training loss, whose value on the data is eval_loss."""

    rows: list[Example]
    pad: int
    groups: list[tuple[int, int, int]] | None = None
    scored: list[int] | None = None   # rows whose loss is the vocabulary loss (None: all)
    tokens: tuple[int, ...] | None = None
    labels: list[int] | None = None
    loss: str = "vocabulary"
    scorer: Callable[[torch.Tensor], dict] | None = None   # other metrics of the rows' [CE, tokens]
    decoding: Decoding | None = None   # generation: what to generate (zoexec.train.generate)

    @property
    def width(self) -> int:
        """Figures per row that Trainer.evaluate returns (zoexec.model.heads.row_scores)."""
        return 2 if self.tokens is None else len(self.tokens)

    def pack(self, start: int, stop: int, *, rows: int, seq: int) -> Batch:
        """Rows start..stop as a Batch of `rows` rows (empty rows after them: no label)."""
        chunk = self.rows[start:stop]
        chunk = chunk + [Example((), ())] * (rows - len(chunk))
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
            right = out[torch.arange(len(self.labels)), self.labels]
            return classification_metrics(out, self.labels, loss=self.loss,
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


# ---- building sources and eval sets ------------------------------------------------------------
def _tokens(tokenizer_dir, *, vocab: int, where) -> Tokens:
    return Tokens(load_tokenizer(tokenizer_dir, where=where), vocab=vocab, where=where)


def make_task_source(path, spec: TaskSpec, *, vocab: int, seed: int = 0, tokenizer_dir=None,
                     seq: int | None = None):
    """The training source of `spec` over the file or folder `path` (`seq`: the rows'
    length, which demonstrations in training are fitted to)."""
    if spec.name == "text":
        return TextData.from_path(path, vocab=vocab, seed=seed, tokenizer_dir=tokenizer_dir,
                                  column=spec.text_column)
    rows = load_records(path)
    tokens = _tokens(tokenizer_dir, vocab=vocab, where=path)
    examples = task_examples(rows, spec, tokens, path)
    if spec.demonstrations_in_training:
        demos = _demonstrations(spec, tokens, spec.demonstrations_data or path,
                                rows=rows if spec.demonstrations_data is None else None)
        examples = with_demonstrations(examples, rows, demos, seq=seq, reserve=_target_length)
    if spec.name == "classification":
        return ChoiceRows(examples, loss=spec.classification_loss, pad=tokens.pad, seed=seed,
                          tag=_TAG_ROWS, path=path)
    if spec.name == "multiple-choice":
        return MultipleChoiceRows(examples, score=spec.choice_score, pad=tokens.pad, seed=seed,
                                  tag=_TAG_ROWS, path=path)
    if spec.name == "generation":
        examples = [ex.example() for ex in examples]
    return ExampleRows(examples, pad=tokens.pad, seed=seed, path=path)


def task_examples(rows, spec: TaskSpec, tokens: Tokens, path) -> list:
    """The examples of `rows`: Example (completion), Labelled (classification),
    MultipleChoice or Answered (generation)."""
    if spec.name == "completion":
        return completion_examples(rows, spec, tokens, path)
    if spec.name == "classification":
        return classification_examples(rows, spec, tokens, path)
    if spec.name == "multiple-choice":
        return choice_examples(rows, spec, tokens, path, preset(spec.task_preset))
    return generation_examples(rows, spec, tokens, path)


def _target_length(example) -> int:
    """The tokens a row needs after its prompt: the longest candidate, or the target."""
    if hasattr(example, "candidates"):
        return max(len(c) for c in example.candidates)
    return len(example.target)


def _demonstrations(spec: TaskSpec, tokens: Tokens, pool, *, rows=None):
    """The demonstrations of `spec` drawn from the file `pool` (`rows`: its rows, read
    already)."""
    rows = load_records(pool) if rows is None else rows
    return demonstrations_from(task_examples(rows, spec, tokens, pool), rows, spec=spec,
                               tokens=tokens, where=pool)


def make_eval_set(path, spec: TaskSpec, *, vocab: int, seq: int, tokenizer_dir=None,
                  samples: int | None = None, train_path=None) -> EvalSet:
    """The evaluation rows of `spec` over `path`: text cut into rows of `seq` (the
    last shorter), a completion per row, the classification examples (a row each
    with single-token candidates, else a row per candidate), a row per candidate of
    each multiple-choice example, or a generation example's answer row and its prompt
    to generate from; `samples`: that many of them, drawn with a fixed seed
    (zoexec.data.choices.subset). With demonstrations, they are drawn from
    spec.demonstrations_data, else `train_path`, else `path`."""
    if spec.name == "text":
        data = TextData.from_path(path, vocab=vocab, seed=0, tokenizer_dir=tokenizer_dir,
                                  column=spec.text_column)
        return EvalSet(rows=_some(data.eval_examples(seq), samples), pad=0)
    rows = load_records(path)
    tokens = _tokens(tokenizer_dir, vocab=vocab, where=path)
    examples = task_examples(rows, spec, tokens, path)
    rows, examples = _some(rows, samples), _some(examples, samples)
    demos = None
    if spec.demonstrations:
        demos = _demonstrations(spec, tokens, spec.demonstrations_data or train_path or path)
    examples_fed = with_demonstrations(examples, rows, demos, seq=seq, reserve=_target_length)
    if spec.name == "completion":
        return EvalSet(rows=examples_fed, pad=tokens.pad)
    if spec.name == "multiple-choice":
        return _choice_eval_set(examples_fed, spec, pad=tokens.pad)
    if spec.name == "generation":
        prompts = with_demonstrations(examples, rows, demos, seq=seq,
                                      reserve=lambda ex: spec.max_new_tokens)
        return EvalSet(rows=[ex.example() for ex in examples_fed], pad=tokens.pad,
                       decoding=decoding_of(prompts, spec, tokens, seq=seq))
    return _classification_eval_set(examples_fed, spec, pad=tokens.pad)


def _classification_eval_set(examples: list, spec: TaskSpec, *, pad: int) -> EvalSet:
    labels = [ex.label for ex in examples]
    if all(len(c) == 1 for c in examples[0].candidates):   # the label words: all alike
        return EvalSet(rows=[ex.example() for ex in examples], pad=pad, labels=labels,
                       tokens=tuple(c[0] for c in examples[0].candidates),
                       loss=spec.classification_loss)
    out, groups, scored = [], [], []
    for ex in examples:
        groups.append((len(out), len(ex.candidates), ex.label))
        scored.append(len(out) + ex.label)
        out.extend(ex.example(i) for i in range(len(ex.candidates)))
    return EvalSet(rows=out, pad=pad, groups=groups, scored=scored, labels=labels,
                   loss=spec.classification_loss)


def _choice_eval_set(examples: list, spec: TaskSpec, *, pad: int) -> EvalSet:
    rows, scorer = choice_eval_parts(examples, score=spec.choice_score)
    return EvalSet(rows=rows, pad=pad, scorer=scorer)


def _some(items: list, samples: int | None) -> list:
    return [items[i] for i in subset(len(items), samples)]


def check_task_data(path, spec: TaskSpec, *, vocab: int, batch: int, seq: int,
                    tokenizer_dir=None) -> None:
    """What a rank would refuse in a task's data, found before any rank starts: every
    row read and tokenised, each fitting `seq` (the text task: zoexec.data.text.check_data)."""
    if spec.name == "text":
        check_data(str(path), vocab=vocab, batch=batch, seq=seq, tokenizer_dir=tokenizer_dir,
                   column=spec.text_column)
        return
    source = make_task_source(path, spec, vocab=vocab, tokenizer_dir=tokenizer_dir, seq=seq)
    if isinstance(source, (ChoiceRows, MultipleChoiceRows)):
        source.check(seq)
        return
    for number, ex in enumerate(source.examples, start=1):
        if len(ex.target) > seq - (1 if ex.prompt else 0):
            pack_examples([ex], seq=seq, pad=source.pad, where=f"{path} row {number}")


def make_source(source: str, *, vocab: int, seed: int = 0, tokenizer_dir=None, task=None,
                seq: int | None = None):
    """"synthetic" -> SyntheticTask; a file or folder -> the source of `task` (a
    zoexec.data.tasks.TaskSpec or its dict; default text: TextData)."""
    if source == "synthetic":
        return SyntheticTask(vocab=vocab, seed=seed)
    spec = task if isinstance(task, TaskSpec) else TaskSpec.from_dict(task)
    return make_task_source(source, spec, vocab=vocab, seed=seed, tokenizer_dir=tokenizer_dir,
                            seq=seq)
