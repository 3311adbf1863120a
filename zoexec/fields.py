"""How a run option is declared: `option(...)` makes a dataclass field carry its help,
other names, check, environment default and what a resume does with it; FieldError
names a field and a bad value; Section is the base of the run configuration's sections
(zoexec.config, zoexec.data.section); and the parsers of option texts (durations,
sizes). Torch-free, and it imports nothing of zoexec: every layer
may declare options."""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable
from dataclasses import Field, field, fields
from typing import Any, ClassVar, Literal

from zoplan.errors import ZoError


class FieldError(ValueError):
    """A field's value fails its check: "lr must be a finite number >= 0, got -1"."""

    def __init__(self, name: str, value: Any, must: str) -> None:
        super().__init__(f"{name} must be {must}, got {value!r}")
        self.name, self.value, self.must = name, value, must


# ---- the declaration of an option ----------------------------------------------------------
Kept = Literal["setting", "task", "default", "run"]
KEPT_WORDS: dict[str, str] = {   # what a resume does with an option (`kept`), in words
    "setting": "run.json records it; a resume keeps it and refuses another value",
    "task": "run.json records it in the task (when the task type reads it); a resume "
            "keeps it and refuses another value",
    "default": "run.json records it; a resume keeps it unless it is given again",
    "run": "run.json records it; a resume keeps it unless it is given again, and says so "
           "in one line when the value given differs (a run written before it was recorded: "
           "the command line's)"}


def option(default: Any, help: str, *, aliases: tuple[str, ...] = (), flag: str | None = None,
           check: Callable[[Any], str | None] | None = None, env: str | None = None,
           shown: str | None = None, metavar: str | None = None,
           parse: Callable[[str], Any] | None = None, hidden_aliases: tuple[str, ...] = (),
           choices: tuple[str, ...] = (), kept: Kept | None = None,
           tasks: tuple[str, ...] = ()) -> Any:
    """A field that is a command-line option. `flag`: its name when not --field-name;
    `aliases`: other names shown in --help; `hidden_aliases`: other names accepted (old
    spellings); `check(value)` -> what the value must be when it is wrong (None: fine;
    not called on None); `env`: a variable whose value is the default when set;
    `shown`: the default as --help shows it (else the default itself); `parse`: the
    command line's text to the field's value; `choices`: its fixed set when that is
    data (a registry's names) rather than a Literal type; `kept`: what a resume does
    with it (KEPT_WORDS; None: nothing, the resume's own value or the default); `tasks`:
    a task option's task types (zoexec.data.section.read_by), besides those whose own
    list names it."""
    meta = {"help": help, "aliases": tuple(aliases), "flag": flag, "check": check, "env": env,
            "shown": shown, "metavar": metavar, "parse": parse,
            "hidden_aliases": tuple(hidden_aliases), "choices": tuple(choices), "kept": kept,
            "tasks": tuple(tasks)}
    return field(default=default, metadata=meta)


def at_least(low: float, unit: str = "") -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f">= {low}{unit}"


def within(low: int, high: int) -> Callable[[Any], str | None]:
    return lambda v: None if low <= v <= high else f"in {low}..{high}"


def finite_at_least(low: float) -> Callable[[Any], str | None]:
    return lambda v: None if math.isfinite(v) and v >= low else f"a finite number >= {low}"


def positive_finite(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "a finite number > 0"


def check_fields(obj: object) -> None:
    """Each option field's value: its fixed set, its check."""
    hints = typing.get_type_hints(type(obj))
    for f in option_fields(type(obj)):
        check_value(f, hints[f.name], getattr(obj, f.name))


def check_value(f: Field[Any], hint: Any, value: Any) -> None:
    """FieldError unless `value` is in the field's fixed set (a Literal type, or its
    `choices`) and passes its check (None passes: "not set")."""
    if value is None:
        return
    choices = choices_of(f, hint)
    if choices and value not in choices:
        raise FieldError(f.name, value, f"one of {', '.join(map(str, choices))}")
    check = f.metadata["check"]
    must = check(value) if check is not None else None
    if must:
        raise FieldError(f.name, value, must)


def choices_of(f: Field[Any], hint: Any) -> tuple[Any, ...]:
    """A field's fixed set: its `choices`, else its Literal type's values; () for none."""
    return f.metadata["choices"] or literal_choices(hint)


def literal_choices(hint: Any) -> tuple[Any, ...]:
    """The values of a Literal[...] type (inside Optional too); () for other types."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    for arg in typing.get_args(hint):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return ()


class Section:
    """A group of options: its panel in --help; its fields are checked on creation."""

    PANEL: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h)")


def parse_every(text: str) -> tuple[int | None, float | None]:
    """--save-every: (N, None) for N steps ("500"), (None, seconds) for a duration ("30m",
    "900s", "2h"); ValueError for anything else."""
    text = text.strip().lower()
    if text.isdigit() and int(text) >= 1:
        return int(text), None
    match = _DURATION.fullmatch(text)
    if match and float(match[1]) > 0:
        return None, float(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]
    raise ValueError(f"not a number of steps or a duration: {text!r}")


def _every(text: str) -> str | None:
    try:
        parse_every(text)
    except ValueError:
        return "N steps (500) or a duration (30m, 900s, 2h)"
    return None


_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]B)?", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """--max-shard-size: bytes ("5GB", "500MB", "1.5GB": decimal units as HF's; a plain
    integer: bytes). ZoError when it is not a size > 0."""
    match = _SIZE.fullmatch(str(text).strip())
    size = 0
    if match:
        size = int(float(match[1]) * (_SIZE_UNITS[match[2].upper()] if match[2] else 1))
    if size < 1:
        raise ZoError(f"--max-shard-size {text!r}: give a size such as 5GB, 500MB or a number "
                      f"of bytes")
    return size


def _size(text: str) -> str | None:
    try:
        parse_size(text)
    except ZoError:
        return "a size such as 5GB, 500MB or a number of bytes"
    return None


def option_fields(section: type) -> list[Field[Any]]:
    """The fields of `section` that are options."""
    return [f for f in fields(section) if "help" in f.metadata]


def flag_of(f: Field[Any]) -> str:
    """A field's option name: --field-name unless the field names another."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")
