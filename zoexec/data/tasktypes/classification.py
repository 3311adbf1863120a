"""`--task classification`: MeZO's prompt style. `--template` (e.g. "{sentence} It
was": each {name} is a column) makes the prompt, and `--label-words` (e.g.
"terrible,great": label 0, 1, ...; a label is an index or one of the words) the
candidates, each scored as " " + word after the prompt (a leading space, as MeZO's
templates; none when the template ends in whitespace). Training loss
(`--classification-loss`): "candidates" (the default, MeZO's: the cross-entropy of the
correct candidate among the candidates' scores at the answer position) or
"vocabulary" (the LM loss of the correct label word's tokens over the whole
vocabulary: a completion row); rows and scores: zoexec.data.choices. Evaluation: every
candidate scored by its log-likelihood after the prompt (single tokens: all from one
forward of the example; longer ones: the mean per token, a row each); accuracy = the
argmax is the label; F1 of label 1 with two labels; eval_loss = the training loss on
the data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zoexec.data.tasktypes.base import Prompted, PromptType
from zoexec.data.templates import template_fields
from zoplan.errors import ZoError

if TYPE_CHECKING:
    from zoexec.data.rowfile import Examples
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import EvalSet, Tokens


class ClassificationTask(PromptType):
    name = "classification"
    help = "label words after a template"
    options = ("template", "label_words", "label_column", "classification_loss")
    metrics = ("eval_loss", "eval_accuracy", "eval_f1")

    def check(self, task: TaskFields) -> None:
        super().check(task)
        if not task.template:
            raise ZoError("--task classification needs --template, e.g. \"{sentence} It was\" "
                          "(each {name} is a column of the data)")
        if not template_fields(task.template):
            raise ZoError(f"--template {task.template!r} names no column: put the text's "
                          f"column in braces, e.g. \"{{sentence}} It was\"")
        words = task.label_words
        if len(words) < 2:
            raise ZoError("--task classification needs --label-words with two or more words, "
                          "comma-separated (label 0 first), e.g. \"terrible,great\"")
        if any(not w.strip() for w in words):
            raise ZoError(f"--label-words {','.join(words)!r}: a label word is empty")
        if len(set(words)) != len(words):
            raise ZoError(f"--label-words {','.join(words)!r}: a word appears twice")

    def reports(self, task: TaskFields) -> tuple[str, ...]:
        """eval_f1 (of label 1) with two label words only."""
        return self.metrics if len(task.label_words) == 2 else self.metrics[:2]

    def examples(self, rows: Sequence[dict[str, Any]], task: TaskFields, tokens: Tokens,
                 path: str, *, first: int = 1) -> list[Any]:
        from zoexec.data.tasks import classification_examples

        return classification_examples(rows, task, tokens, path, first=first)

    def train_rows(self, examples: Examples, task: TaskFields, *, pad: int, seed: int,
                   path: str) -> Any:
        from zoexec.data.choices import ChoiceRows
        from zoexec.data.tasks import TAG_ROWS

        return ChoiceRows(examples, loss=task.classification_loss, pad=pad, seed=seed,
                          tag=TAG_ROWS, path=path)

    def evaluation(self, prompted: Prompted, task: TaskFields) -> EvalSet:
        from zoexec.data.tasks import classification_eval_set

        return classification_eval_set(prompted.fed(), task, pad=prompted.tokens.pad)
