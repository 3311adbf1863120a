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
from typing import Any

from zoexec.data.taskfields import TaskFields
from zoexec.data.tasktypes import TASK_TYPES, TaskType, task_help
from zoexec.fields import flag_of, option, option_fields
from zoplan.errors import ZoError

# the task options every type takes: the data, the preset, the held-out set
COMMON = ("data", "name", "task_preset", "eval_data", "eval_samples")


@dataclass(frozen=True, kw_only=True)
class TaskOptions(TaskFields):
    """The task of a run: TaskFields (zoexec.data.taskfields) with the task types'
    registry: `--task`'s choices and help, and each type's checks."""

    name: str = option("text", task_help(), flag="--task", choices=tuple(TASK_TYPES), kept="task")

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

