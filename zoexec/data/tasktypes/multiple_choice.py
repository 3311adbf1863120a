"""`--task multiple-choice`: a prompt and candidate continuations, one of them right
(COPA, ReCoRD): the candidates are one template each (`--choices`) or the items of a
list column (`--choices-column`); training is the cross-entropy of the right candidate
among the candidates' scores (`--choice-score`); evaluation reports eval_accuracy
(summed log-likelihood) and eval_accuracy_norm (per token). The rows, the loss and the
metrics: zoexec.data.multichoice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zoexec.data.presets import preset
from zoexec.data.tasktypes.base import Prompted, PromptType
from zoplan.errors import ZoError

if TYPE_CHECKING:
    from zoexec.data.rowfile import Examples
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import EvalSet, Tokens


class MultipleChoiceTask(PromptType):
    name = "multiple-choice"
    help = "candidate continuations"
    options = ("template", "choices", "choices_column", "label_column", "choice_score")
    metrics = ("eval_loss", "eval_accuracy", "eval_accuracy_norm")

    def check(self, task: TaskFields) -> None:
        super().check(task)
        if not task.template or not (task.choices or task.choices_column):
            raise ZoError("--task multiple-choice needs --template (the prompt) and the "
                          "candidates: --choices \"{choice1}|{choice2}\" (a template each) or "
                          "--choices-column COLUMN (a list of candidates per row)")
        if task.choices_column and len(task.choices) > 1:
            raise ZoError(f"--choices-column {task.choices_column} takes one --choices template "
                          f"(each candidate is {{choice}}), got {len(task.choices)}")
        if len(task.choices) == 1 and not task.choices_column:
            raise ZoError(f"--choices {task.choices[0]!r}: give two or more templates, "
                          f"'|'-separated")

    def examples(self, rows: Sequence[dict[str, Any]], task: TaskFields, tokens: Tokens,
                 path: str, *, first: int = 1) -> list[Any]:
        from zoexec.data.multichoice import choice_examples

        return choice_examples(rows, task, tokens, path, preset(task.task_preset), first=first)

    def train_rows(self, examples: Examples, task: TaskFields, *, pad: int, seed: int,
                   path: str) -> Any:
        from zoexec.data.multichoice import MultipleChoiceRows
        from zoexec.data.tasks import TAG_ROWS

        return MultipleChoiceRows(examples, score=task.choice_score, pad=pad, seed=seed,
                                  tag=TAG_ROWS, path=path)

    def evaluation(self, prompted: Prompted, task: TaskFields) -> EvalSet:
        from zoexec.data.multichoice import choice_eval_parts
        from zoexec.data.tasks import EvalSet

        rows, scorer = choice_eval_parts(prompted.fed(), score=task.choice_score)
        return EvalSet(rows=rows, pad=prompted.tokens.pad, scorer=scorer)
