"""`--task completion`: one example per row: the prompt (`--prompt-column`) tokenised
with the tokenizer's special tokens, then the completion (`--completion-column`) without
them and an EOS (when the tokenizer has one); the loss counts the completion's tokens
and that EOS only (zoexec.data.tasks.completion_examples). Rows are padded to the
longest row of the batch (pad id: the tokenizer's pad, else EOS, else 0; never a
label). A row longer than the plan's seq loses tokens from the left of its prompt; a
completion that does not fit with one prompt token is refused. Evaluation: eval_loss
on the held-out completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zoexec.data.tasktypes.base import PromptType

if TYPE_CHECKING:
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import Tokens


class CompletionTask(PromptType):
    name = "completion"
    help = "loss on the completion only"
    options = ("prompt_column", "completion_column")
    metrics = ("eval_loss",)

    def examples(self, rows: Sequence[dict[str, Any]], task: TaskFields, tokens: Tokens,
                 path: str, *, first: int = 1) -> list[Any]:
        from zoexec.data.tasks import completion_examples

        return completion_examples(rows, task, tokens, path, first=first)
