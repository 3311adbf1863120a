"""How a run option is declared: `option(...)` makes a dataclass field carry its help,
other names, check and environment default; FieldError names a field and a bad value;
Section is the base of the run configuration's sections (zoexec.config); and the
parsers of option texts (durations, sizes, best-metric specs). Torch-free."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import field, fields
from typing import Any, ClassVar, Literal

from zoplan.errors import ZoError


class FieldError(ValueError):
    """A field's value fails its check: "lr must be a finite number >= 0, got -1"."""

    def __init__(self, name: str, value: Any, must: str) -> None:
        super().__init__(f"{name} must be {must}, got {value!r}")
        self.name, self.value, self.must = name, value, must


# ---- the declaration of an option ----------------------------------------------------------
def option(default: Any, help: str, *, aliases: tuple[str, ...] = (), flag: str | None = None,
           check=None, env: str | None = None, shown: str | None = None,
           metavar: str | None = None, parse=None, hidden_aliases: tuple[str, ...] = ()):
    """A field that is a command-line option. `flag`: its name when not --field-name;
    `aliases`: other names shown in --help; `hidden_aliases`: other names accepted (old
    spellings); `check(value)` -> what the value must be when it is wrong (None: fine;
    not called on None); `env`: a variable whose value is the default when set;
    `shown`: the default as --help shows it (else the default itself); `parse`: the
    command line's text to the field's value."""
    meta = {"help": help, "aliases": tuple(aliases), "flag": flag, "check": check, "env": env,
            "shown": shown, "metavar": metavar, "parse": parse,
            "hidden_aliases": tuple(hidden_aliases)}
    return field(default=default, metadata=meta)


def at_least(low: float, unit: str = ""):
    return lambda v: None if v >= low else f">= {low}{unit}"


def within(low: int, high: int):
    return lambda v: None if low <= v <= high else f"in {low}..{high}"


def finite_at_least(low: float):
    return lambda v: None if math.isfinite(v) and v >= low else f"a finite number >= {low}"


def positive_finite(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "a finite number > 0"


def check_fields(obj) -> None:
    """Each option field's value: its fixed set, its check."""
    hints = typing.get_type_hints(type(obj))
    for f in option_fields(type(obj)):
        check_value(f, hints[f.name], getattr(obj, f.name))


def check_value(f, hint, value) -> None:
    """FieldError unless `value` is in the field's fixed set (a Literal type) and passes
    its check (None passes: "not set")."""
    if value is None:
        return
    choices = literal_choices(hint)
    if choices and value not in choices:
        raise FieldError(f.name, value, f"one of {', '.join(map(str, choices))}")
    check = f.metadata["check"]
    must = check(value) if check is not None else None
    if must:
        raise FieldError(f.name, value, must)


def literal_choices(hint) -> tuple:
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


# ---- the sections ------------------------------------------------------------------------


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


def parse_size(text: str) -> int:
    """--max-shard-size in bytes (zoexec.model.export.parse_size: "5GB", "500MB")."""
    from zoexec.model.export import parse_size as parse

    return parse(text)


def _size(text: str) -> str | None:
    try:
        parse_size(text)
    except ZoError:
        return "a size such as 5GB, 500MB or a number of bytes"
    return None


BEST_METRICS = ("eval_loss", "eval_accuracy", "eval_f1", "eval_accuracy_norm", "eval_exact_match")


def parse_best(text: str) -> tuple[str, bool]:
    """--save-best "eval_accuracy:max" -> ("eval_accuracy", True); ValueError if bad."""
    name, colon, way = text.strip().partition(":")
    if name not in BEST_METRICS or (colon and way not in ("max", "min")):
        raise ValueError(f"not a metric[:max|min]: {text!r}")
    return name, (way == "max") if way else name != "eval_loss"


def _best(text: str) -> str | None:
    try:
        parse_best(text)
    except ValueError:
        return f"one of {', '.join(BEST_METRICS)}, then :max or :min (e.g. eval_accuracy:max)"
    return None


def option_fields(section: type) -> list:
    """The fields of `section` that are options."""
    return [f for f in fields(section) if "help" in f.metadata]
