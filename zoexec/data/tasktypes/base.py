"""What a task type is: the TaskType protocol every `--task NAME` implements, and
PromptType, the common flow of the task types whose examples are prompts with answers.

A task type says, as data, its name and its words in `--task`'s help, the task options
it reads (`options`: run.json records them; `extras`: those recorded only when set),
and what its evaluation reports (`metrics`: --save-best's names); as code, the checks
of its options together, its training source, its evaluation set and the check of a
data file before any rank starts. The run configuration reads the data parts (the
CLI's `--task` choices and help, which options apply to which type, what run.json
records, the metrics table), so a task type's module is imported by a torch-free
module (zoexec.data.section): it imports the torch-using helpers (zoexec.data.tasks,
.choices, .multichoice, .generation, .demos, .text) inside the methods that need them,
never at its top (tests/unit/test_torch_free.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from zoexec.data.records import open_rows
from zoexec.data.rowfile import Examples, row_byte_limit, text_budget
from zoplan.errors import ZoError

if TYPE_CHECKING:   # type names only: these modules import torch (or this one)
    from zoexec.data.demos import Demonstrations
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import EvalSet, Tokens

# the options of in-context demonstrations, read by every prompt type
DEMONSTRATIONS = ("demonstrations", "demonstrations_in_training", "demonstrations_seed",
                  "demonstrations_data")


class TaskType(Protocol):
    """A task type (`--task NAME`): registered in zoexec.data.tasktypes.TASK_TYPES."""

    @property
    def name(self) -> str:
        """--task NAME."""

    @property
    def help(self) -> str:
        """What --task's help says of it, after its name."""

    @property
    def options(self) -> tuple[str, ...]:
        """The task options it reads (run.json records them)."""

    @property
    def extras(self) -> tuple[str, ...]:
        """Options it reads that run.json records only when set."""

    @property
    def metrics(self) -> tuple[str, ...]:
        """What its evaluation can report (eval_loss first)."""

    @property
    def packed(self) -> bool:
        """Rows are documents packed to the plan's seq: no row lengths to measure."""

    def check(self, task: TaskFields) -> None:
        """ZoError for options that do not go together (each field checks itself)."""

    def reports(self, task: TaskFields) -> tuple[str, ...]:
        """The metrics an evaluation of `task` reports (a subset of `metrics`)."""

    def source(self, path: str, task: TaskFields, *, vocab: int, seed: int,
               tokenizer_dir: str | None, seq: int | None) -> Any:
        """The training source over the file or folder `path`: batch(step, rows, seq)."""

    def eval_set(self, path: str, task: TaskFields, *, vocab: int, seq: int,
                 tokenizer_dir: str | None, samples: int | None,
                 train_path: str | None) -> EvalSet:
        """The evaluation rows over `path` (`samples` of them; demonstrations drawn from
        task.demonstrations_data, else `train_path`, else `path`)."""

    def check_data(self, path: str, task: TaskFields, *, vocab: int, batch: int, seq: int,
                   tokenizer_dir: str | None, steps: int | None = None) -> None:
        """ZoError for what a rank would refuse in `path`, before any rank starts (in the
        rows the first `steps` batches use, where the type can tell; None: all)."""


def target_length(example: Any) -> int:
    """The tokens a row needs after its prompt: the longest candidate, or the target."""
    if hasattr(example, "candidates"):
        return max(len(c) for c in example.candidates)
    return len(example.target)


@dataclass(kw_only=True)
class Prompted:
    """The evaluated examples of a prompt type with what feeding them needs: the rows they
    were made from, the demonstrations (None: zero-shot), the rows' length, the tokenizer."""

    examples: list[Any]
    rows: list[dict[str, Any]]
    demos: Demonstrations | None
    seq: int
    tokens: Tokens

    def fed(self, reserve: Callable[[Any], int] = target_length) -> list[Any]:
        """The examples with the demonstrations before each prompt, fitted to seq minus
        `reserve(example)` tokens."""
        from zoexec.data.demos import with_demonstrations

        return with_demonstrations(self.examples, self.rows, self.demos, seq=self.seq,
                                   reserve=reserve)


class PromptType:
    """A task type whose rows are prompts with answers (all but text): rows read with
    zoexec.data.records, tokenised with the model's tokenizer, demonstrations before
    the prompts (zoexec.data.demos). A subclass gives `examples` (its examples of the
    rows) and, where they differ from one example per row, `train_rows` and
    `evaluation`."""

    name: str
    help: str
    options: tuple[str, ...]
    metrics: tuple[str, ...]
    extras: tuple[str, ...] = DEMONSTRATIONS
    packed = False

    def check(self, task: TaskFields) -> None:
        if task.demonstrations_in_training and not task.demonstrations:
            raise ZoError("--demonstrations-in-training needs --demonstrations K (K >= 1)")

    def reports(self, task: TaskFields) -> tuple[str, ...]:
        return self.metrics

    def examples(self, rows: Sequence[dict[str, Any]], task: TaskFields, tokens: Tokens,
                 path: str, *, first: int = 1) -> list[Any]:
        """The examples of `rows` (the first is row number `first` of the file)."""
        raise NotImplementedError

    def train_rows(self, examples: Examples, task: TaskFields, *, pad: int, seed: int,
                   path: str) -> Any:
        """The training source of `examples`: one a row, a fresh order each epoch."""
        from zoexec.data.tasks import ExampleRows

        return ExampleRows(examples, pad=pad, seed=seed, path=path)

    def evaluation(self, prompted: Prompted, task: TaskFields) -> EvalSet:
        """The evaluation set of the examples: one row each, eval_loss on its target."""
        from zoexec.data.tasks import EvalSet

        return EvalSet(rows=prompted.fed(), pad=prompted.tokens.pad)

    # ---- the flow every prompt type shares ----------------------------------------------
    def lazy_examples(self, rows: Sequence[dict[str, Any]], task: TaskFields, tokens: Tokens,
                      path: str) -> Examples:
        """The examples of `rows`, each made (tokenised) when it is used."""
        def make(row: dict[str, Any], number: int) -> Any:
            return self.examples([row], task, tokens, path, first=number)[0]

        return Examples(rows, make)

    def source(self, path: str, task: TaskFields, *, vocab: int, seed: int = 0,
               tokenizer_dir: str | None = None, seq: int | None = None) -> Any:
        from zoexec.data.demos import demonstrated

        rows = open_rows(path, max_row_bytes=row_byte_limit(seq))
        tokens = _tokens(tokenizer_dir, vocab=vocab, where=path, seq=seq)
        examples = self.lazy_examples(rows, task, tokens, path)
        examples[0]   # the first row made now: a column or label word it lacks fails here
        if task.demonstrations_in_training:
            pool = task.demonstrations_data or path
            demos = self._demonstrations(task, tokens, pool, seq=seq,
                                         rows=rows if task.demonstrations_data is None else None)
            examples = examples.map(lambda ex, row: demonstrated(ex, row, demos, seq=seq,
                                                                 reserve=target_length))
        return self.train_rows(examples, task, pad=tokens.pad, seed=seed, path=path)

    def eval_set(self, path: str, task: TaskFields, *, vocab: int, seq: int,
                 tokenizer_dir: str | None = None, samples: int | None = None,
                 train_path: str | None = None) -> EvalSet:
        from zoexec.data.tasks import some_list

        rows = open_rows(path, max_row_bytes=row_byte_limit(seq))
        tokens = _tokens(tokenizer_dir, vocab=vocab, where=path, seq=seq)
        examples = self.lazy_examples(rows, task, tokens, path)
        demos = None
        if task.demonstrations:
            pool = task.demonstrations_data or train_path or path
            demos = self._demonstrations(task, tokens, pool, seq=seq)
        return self.evaluation(Prompted(examples=some_list(examples, samples),
                                        rows=some_list(rows, samples), demos=demos, seq=seq,
                                        tokens=tokens), task)

    def check_data(self, path: str, task: TaskFields, *, vocab: int, batch: int, seq: int,
                   tokenizer_dir: str | None = None, steps: int | None = None) -> None:
        """The rows the first `steps` batches use (None: every row) read, tokenised and
        fitted to `seq`."""
        source = self.source(path, task, vocab=vocab, tokenizer_dir=tokenizer_dir, seq=seq)
        used = None if steps is None else source.order.used(steps, batch, len(source.examples))
        source.check(seq, used)

    def _demonstrations(self, task: TaskFields, tokens: Tokens, pool: str, *, seq: int | None,
                        rows: Sequence[dict[str, Any]] | None = None) -> Demonstrations:
        """The demonstrations of `task` drawn from the file `pool` (`rows`: its rows,
        opened already)."""
        from zoexec.data.demos import demonstrations_from

        rows = open_rows(pool, max_row_bytes=row_byte_limit(seq)) if rows is None else rows
        return demonstrations_from(self.lazy_examples(rows, task, tokens, pool), rows, spec=task,
                                   tokens=tokens, where=pool)


def _tokens(tokenizer_dir: str | None, *, vocab: int, where: str, seq: int | None) -> Tokens:
    from zoexec.data.tasks import Tokens
    from zoexec.data.text import load_tokenizer

    return Tokens(load_tokenizer(tokenizer_dir, where=where), vocab=vocab, where=where,
                  budget=text_budget(seq))
