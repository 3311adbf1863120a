"""A task's data as a run reads it, each through its task type (zoexec.data.tasktypes):
the training source, the evaluation set, and the check of a data file before any rank
starts; "synthetic" is the built-in task (zoexec.data.text.SyntheticTask)."""

from __future__ import annotations

from typing import Any

from zoexec.data.section import TaskOptions
from zoexec.data.tasks import EvalSet
from zoexec.data.text import SyntheticTask


def make_task_source(path: str, task: TaskOptions, *, vocab: int, seed: int = 0,
                     tokenizer_dir: str | None = None, seq: int | None = None) -> Any:
    """The training source of `task` over the file or folder `path` (`seq`: the rows'
    length, which demonstrations in training are fitted to)."""
    return task.type.source(str(path), task, vocab=vocab, seed=seed,
                            tokenizer_dir=tokenizer_dir, seq=seq)


def make_eval_set(path: str, task: TaskOptions, *, vocab: int, seq: int,
                  tokenizer_dir: str | None = None, samples: int | None = None,
                  train_path: str | None = None) -> EvalSet:
    """The evaluation rows of `task` over `path`; `samples`: that many of them, drawn
    with a fixed seed (zoexec.data.choices.subset). With demonstrations, they are drawn
    from task.demonstrations_data, else `train_path`, else `path`."""
    return task.type.eval_set(str(path), task, vocab=vocab, seq=seq, tokenizer_dir=tokenizer_dir,
                              samples=samples, train_path=train_path)


def check_task_data(path: str, task: TaskOptions, *, vocab: int, batch: int, seq: int,
                    tokenizer_dir: str | None = None, steps: int | None = None) -> None:
    """What a rank would refuse in a task's data, found before any rank starts: the rows
    the first `steps` batches use (None: every row; text: every row) read and
    tokenised, each fitting `seq` (text: enough tokens for a batch)."""
    task.type.check_data(str(path), task, vocab=vocab, batch=batch, seq=seq,
                         tokenizer_dir=tokenizer_dir, steps=steps)


def make_source(source: str, *, vocab: int, seed: int = 0, tokenizer_dir: str | None = None,
                task: TaskOptions | None = None, seq: int | None = None) -> Any:
    """"synthetic" -> SyntheticTask; a file or folder -> the source of `task` (default:
    text)."""
    if source == "synthetic":
        return SyntheticTask(vocab=vocab, seed=seed)
    return make_task_source(source, task or TaskOptions(), vocab=vocab, seed=seed,
                            tokenizer_dir=tokenizer_dir, seq=seq)
