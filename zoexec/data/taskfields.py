"""The task settings as data: TaskFields, every task option's field (name, type,
default, check, help, what a resume does with it). A leaf of zoexec.data: the task
types (zoexec.data.tasktypes) and the helpers they call type a task as it, and
zoexec.data.section's TaskOptions, which knows the task types' registry, extends it with
`--task`'s choices and help and the checks a task type makes. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from zoexec.data.presets import PRESET_NAMES
from zoexec.fields import Section, at_least, option


def _label_words(text: str) -> tuple[str, ...]:
    return tuple(word.strip() for word in text.split(","))


def _choices(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split("|"))


@dataclass(frozen=True, kw_only=True)
class TaskFields(Section):
    PANEL: ClassVar[str] = "Data and task"

    data: str = option(
        "synthetic", "Training data: JSONL, JSON, CSV, Parquet or a save_to_disk folder, in "
        "the --task's columns", shown="the built-in synthetic task", metavar="FILE",
        kept="setting")
    # the task type; zoexec.data.section.TaskOptions gives it the registry's choices and help
    name: str = option("text", "The task type", flag="--task", kept="task")
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
