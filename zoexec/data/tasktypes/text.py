"""`--task text`: packed language modelling (zoexec.data.text.TextData): documents
(column `--text-column`, or `input_ids`) tokenised, an EOS after each, joined and cut
into rows of the plan's seq; every token is predicted except the first token of each
document, so a document's tokens (and the EOS that ends it) never predict the next
document's. Attention still sees the earlier documents of a row, as in the HF Trainer's
packing. Evaluation: the held-out text cut into rows of seq (the last shorter),
eval_loss over them; the rows are made from the chunks as the evaluator reads them
(zoexec.data.text.EvalRows), never the whole stream at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import EvalSet


class TextTask:
    name = "text"
    help = "packed LM loss"
    options: tuple[str, ...] = ("text_column",)
    extras: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("eval_loss",)
    packed = True

    def check(self, task: TaskFields) -> None:
        pass

    def reports(self, task: TaskFields) -> tuple[str, ...]:
        return self.metrics

    def source(self, path: str, task: TaskFields, *, vocab: int, seed: int = 0,
               tokenizer_dir: str | None = None, seq: int | None = None) -> Any:
        from zoexec.data.text import TextData

        return TextData.from_path(path, vocab=vocab, seed=seed, tokenizer_dir=tokenizer_dir,
                                  column=task.text_column)

    def eval_set(self, path: str, task: TaskFields, *, vocab: int, seq: int,
                 tokenizer_dir: str | None = None, samples: int | None = None,
                 train_path: str | None = None) -> EvalSet:
        from zoexec.data.tasks import EvalSet, some

        data = self.source(path, task, vocab=vocab, tokenizer_dir=tokenizer_dir)
        return EvalSet(rows=some(data.eval_examples(seq), samples), pad=0)

    def check_data(self, path: str, task: TaskFields, *, vocab: int, batch: int, seq: int,
                   tokenizer_dir: str | None = None, steps: int | None = None) -> None:
        from zoexec.data.text import check_data

        check_data(str(path), vocab=vocab, batch=batch, seq=seq, tokenizer_dir=tokenizer_dir,
                   column=task.text_column, steps=steps)
