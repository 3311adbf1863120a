"""The task types (`--task NAME`) as a registry: one module each (text, completion,
classification, multiple_choice, generation), each implementing
zoexec.data.tasktypes.base.TaskType, registered in TASK_TYPES here. The run
configuration (zoexec.data.section: `--task`'s choices and help, which options apply
to which type, what run.json records), `--save-best`'s metrics and the builder read
the registry; zoexec.data.sources dispatches on it.

Adding a task type: a module here with its class (docs/code.md) and its line below.
Torch-free: every module here is (zoexec.data.tasktypes.base says how)."""

from __future__ import annotations

from zoexec.data.tasktypes.base import TaskType
from zoexec.data.tasktypes.classification import ClassificationTask
from zoexec.data.tasktypes.completion import CompletionTask
from zoexec.data.tasktypes.generation import GenerationTask
from zoexec.data.tasktypes.multiple_choice import MultipleChoiceTask
from zoexec.data.tasktypes.text import TextTask

__all__ = ["METRICS", "TASK_TYPES", "TaskType", "task_help"]

TASK_TYPES: dict[str, TaskType] = {t.name: t for t in (
    TextTask(), CompletionTask(), ClassificationTask(), MultipleChoiceTask(), GenerationTask(),
)}
METRICS = tuple(dict.fromkeys(m for t in TASK_TYPES.values() for m in t.metrics))


def task_help() -> str:
    """--task's help: each type's name and words, in the registry's order."""
    parts = [f"{t.name} ({t.help})" for t in TASK_TYPES.values()]
    return ", ".join(parts[:-1]) + " or " + parts[-1]
