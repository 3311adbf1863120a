"""`--task generation`: a prompt (`--template`, else the `--prompt-column` as it is) and
free-text gold answers (`--answer-column`; SQuAD, DROP). Training: the first gold answer
as the prompt's completion; evaluation: greedy decoding of at most `--max-new-tokens`
tokens (stopping at `--stop-at`), scored by exact match and F1 (zoexec.data.generation),
and eval_loss on the first answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zoexec.data.tasktypes.base import Prompted, PromptType

if TYPE_CHECKING:
    from zoexec.data.rowfile import Examples
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import EvalSet, Tokens


class GenerationTask(PromptType):
    name = "generation"
    help = "free-text answers: exact match, F1"
    options = ("template", "prompt_column", "answer_column", "max_new_tokens", "stop_at")
    metrics = ("eval_loss", "eval_exact_match", "eval_f1")

    def examples(self, rows: Sequence[dict[str, Any]], task: TaskFields, tokens: Tokens,
                 path: str, *, first: int = 1) -> list[Any]:
        from zoexec.data.generation import generation_examples

        return generation_examples(rows, task, tokens, path, first=first)

    def train_rows(self, examples: Examples, task: TaskFields, *, pad: int, seed: int,
                   path: str) -> Any:
        return super().train_rows(examples.map(lambda ex, row: ex.example()), task, pad=pad,
                                  seed=seed, path=path)

    def evaluation(self, prompted: Prompted, task: TaskFields) -> EvalSet:
        """A row per example (its first answer: eval_loss) and the prompts to generate
        from, fitted to leave --max-new-tokens."""
        from zoexec.data.generation import decoding_of
        from zoexec.data.tasks import EvalSet

        prompts = prompted.fed(lambda ex: task.max_new_tokens)
        return EvalSet(rows=[ex.example() for ex in prompted.fed()], pad=prompted.tokens.pad,
                       decoding=decoding_of(prompts, task, prompted.tokens, seq=prompted.seq))
