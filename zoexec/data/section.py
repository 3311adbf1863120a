"""The task section of the run configuration: ONE declaration of every task setting
(TaskOptions: each field's name, type, default, check, help and what a resume does
with it), shared by `zoexec run`, `zoexec eval` and `zoexec lengths`, and read by the
task types (zoexec.data.tasktypes) as the task they run.

Which options a task type reads (`read_by`): the type's own list (TaskType.options,
.extras), and the fields that name it (`option(..., tasks=(NAME,))`: a new option of
an existing type is its field, its use and a test). An option set for a type that does
not read it is refused. What run.json records of
the task (`record`): its name, the options its type reads (the extras and the preset
only when set); a resume keeps that and refuses another (zoexec.run.folder). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from zoexec.data.presets import PRESET_NAMES
from zoexec.data.tasktypes import TASK_TYPES, TaskType, task_help
from zoexec.fields import Section, at_least, flag_of, option, option_fields
from zoplan.errors import ZoError

# the task options every type takes: the data, the preset, the held-out set
COMMON = ("data", "name", "task_preset", "eval_data", "eval_samples")


def _label_words(text: str) -> tuple[str, ...]:
    return tuple(word.strip() for word in text.split(","))


def _choices(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split("|"))


@dataclass(frozen=True, kw_only=True)
class TaskOptions(Section):
    PANEL: ClassVar[str] = "Data and task"

    data: str = option(
        "synthetic", "Training data: JSONL, JSON, CSV, Parquet or a save_to_disk folder, in "
        "the --task's columns", shown="the built-in synthetic task", metavar="FILE",
        kept="setting")
    name: str = option("text", task_help(), flag="--task", choices=tuple(TASK_TYPES), kept="task")
    task_preset: str | None = option(
        None, "One of MeZO's tasks: its --task, template, label words or candidates and columns "
        "(the HF dataset's) as defaults; options given win", choices=PRESET_NAMES, kept="task")
    text_column: str = option("text", "text task: the documents' column (or 'input_ids')",
                              kept="task")
    prompt_column: str = option("prompt", "completion task: the prompt's column", kept="task")
    completion_column: str = option("completion", "completion task: the completion's column",
                                    kept="task")
    no_eos: bool = option(False, "completion task: no EOS after the completion (the data ends "
                          "its completions itself)", kept="task", tasks=("completion",))
    label_column: str = option(
        "label", "classification, multiple-choice: the label's column (an index, a label "
        "word or candidate, a list of right candidates)", kept="task")
    template: str | None = option(
        None, "classification, multiple-choice, generation: the prompt, each {column} filled "
        "from the row, e.g. '{sentence} It was'", kept="task")
    label_words: tuple[str, ...] = option(
        (), "classification: the candidates, comma-separated, label 0 first, e.g. "
        "'terrible,great' (each after a space; none when the template ends in whitespace)",
        parse=_label_words, kept="task")
    classification_loss: Literal["candidates", "vocabulary"] = option(
        "candidates", "classification: the training loss, 'candidates' (MeZO's: cross-entropy "
        "over the label words' scores at the answer position) or 'vocabulary' (the label "
        "word's LM loss over the whole vocabulary)", kept="task")
    choices: tuple[str, ...] = option(
        (), "multiple-choice: a template per candidate, '|'-separated, e.g. '{choice1}|{choice2}' "
        "(with --choices-column: one, {choice} being each item; default '{choice}')",
        parse=_choices, kept="task")
    choices_column: str | None = option(
        None, "multiple-choice: the column holding each row's candidates (a list of strings)",
        kept="task")
    choice_score: Literal["mean", "sum"] = option(
        "mean", "multiple-choice: a candidate's score in the loss, its log-likelihood per token "
        "('mean', MeZO's) or summed ('sum')", kept="task")
    answer_column: str = option(
        "answer", "generation: the gold answers' column (a string, a list of strings, or "
        "SQuAD's {'text': [...]})", kept="task")
    max_new_tokens: int = option(
        32, "generation: evaluation generates at most this many tokens (greedy)",
        check=at_least(1), kept="task")
    stop_at: Literal["eos", "newline"] = option(
        "eos", "generation: generation stops at the EOS, or at a newline too ('newline')",
        kept="task")
    demonstrations: int = option(
        0, "K training examples with their answers before each evaluated prompt (in-context "
        "baseline; 0: zero-shot)", check=at_least(0), metavar="K", kept="task")
    demonstrations_in_training: bool = option(
        False, "The demonstrations before each training prompt too", kept="task")
    demonstrations_seed: int = option(0, "The seed that picks the demonstrations", kept="task")
    demonstrations_data: str | None = option(
        None, "The file the demonstrations come from, never the evaluated example itself "
        "(zoexec run: default --data, the training file; zoexec eval: required with "
        "--demonstrations, as its --data is the evaluated file)", metavar="FILE", kept="task")
    eval_data: str | None = option(
        None, "Held-out data (the task's format): eval_loss (and eval_accuracy, eval_f1 for "
        "classification) after the last step", metavar="FILE", kept="run")
    eval_samples: int | None = option(
        None, "Evaluate this many examples of the held-out data (text: rows), drawn with a "
        "fixed seed (the same ones every time); default: all", check=at_least(1), kept="run")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_read()
        self.type.check(self)

    @property
    def type(self) -> TaskType:
        """The task type (zoexec.data.tasktypes)."""
        return TASK_TYPES[self.name]

    def _check_read(self) -> None:
        """ZoError for an option set (not its default) that this task type does not read."""
        reads = {*COMMON, *read_by(self.type), *self.type.extras}
        for f in option_fields(TaskOptions):
            value = getattr(self, f.name)
            if f.name in reads or value == f.default:
                continue
            readers = [t.name for t in TASK_TYPES.values() if f.name in (*read_by(t), *t.extras)]
            shown = ",".join(value) if isinstance(value, tuple) else value
            raise ZoError(f"{flag_of(f)} {shown} is one of the options of --task "
                          f"{', '.join(readers)}, not of --task {self.name}")

    # ---- what run.json records -----------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The task as run.json records it: its name, the options its type reads, the
        extras and the preset when set (tuples as lists)."""
        kind = self.type
        names = [*read_by(kind), *(n for n in ("task_preset", *kind.extras)
                                  if getattr(self, n) != _DEFAULTS[n])]
        out: dict[str, Any] = {"name": self.name}
        for key in names:
            value = getattr(self, key)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def record_fields(record: dict[str, Any] | None) -> dict[str, Any]:
        """The option fields of a task record (run.json's; an older run's read as it ran:
        a classification run from before the candidate loss trained on the vocabulary)."""
        if not record:
            return {}
        out = dict(record)
        if out.get("name") == "classification":
            out.setdefault("classification_loss", "vocabulary")
        return {k: tuple(v) if k in _TUPLES else v for k, v in out.items()}

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> TaskOptions:
        """The task of a record (run.json's `task`)."""
        return cls(**cls.record_fields(record))


_DEFAULTS = {f.name: f.default for f in fields(TaskOptions)}
_TUPLES = {f.name for f in fields(TaskOptions) if isinstance(f.default, tuple)}


def read_by(kind: TaskType) -> tuple[str, ...]:
    """The task options `kind` reads and run.json records: its own list, then the
    fields that name it."""
    named = (f.name for f in option_fields(TaskOptions) if kind.name in f.metadata["tasks"])
    return (*kind.options, *named)


def task_options() -> tuple[str, ...]:
    """The task's own options: those run.json records in its task (not the data)."""
    return tuple(f.name for f in option_fields(TaskOptions) if f.metadata["kept"] == "task")

