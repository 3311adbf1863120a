"""Templates: the text a task makes of a row, and how an answer joins a prompt.

A template is Python's format string over the row's columns ("{sentence} It was"; {{
and }} are literal braces). A task preset (zoexec.data.presets) may add derived fields
besides the columns (COPA's connector, ReCoRD's filled query); a template names either.

An answer (a label word, a candidate, a gold answer, a demonstration's answer) follows
its prompt after one space, as MeZO's templates write it (" great" after "It was"),
unless the prompt already ends in whitespace (RTE's "Yes or No?\\n" is followed by "Yes").
"""

from __future__ import annotations

import string
from typing import Any

from zoplan.errors import ZoError

DEMO_SEPARATOR = "\n\n"   # between demonstrations and before the prompt (MeZO's in-context format)


def not_a_label(value: object) -> str:
    """Why a true/false or float cell is not a label index, in words (a column of the
    data holding one float holds every value as a float)."""
    if isinstance(value, bool):
        return "true/false, not an index"
    return "a float, not an integer (a column with one float reads every value as a float)"


def template_fields(template: str, *, option: str = "--template") -> list[str]:
    """The {name} fields of a template ({{ and }} are literal braces)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ZoError(f"{option} {template!r}: {exc}") from None
    names = [name for _, name, _, _ in parsed if name is not None]
    if any(not name or not name.isidentifier() for name in names):
        raise ZoError(f"{option} {template!r}: every field is a column name in braces, "
                      f"e.g. {{sentence}}")
    return names


def joiner(prompt: str) -> str:
    """What goes between a prompt and its answer: a space, or nothing after whitespace."""
    return "" if not prompt or prompt[-1].isspace() else " "


def text_of(value: object, column: str, where: str) -> str:
    """A cell as text (a number becomes its text); a missing or nested cell is an error."""
    if value is None:
        raise ZoError(f"{where}: column {column!r} is empty")
    if isinstance(value, (list, dict)):
        raise ZoError(f"{where}: column {column!r} holds a {type(value).__name__}, not text")
    return str(value)


def texts_of(value: object, column: str, where: str) -> list[str]:
    """A cell holding several texts: a list of strings, a dict with one list of strings
    (SQuAD's answers {"text": [...], "answer_start": [...]}, DROP's {"spans": [...]}),
    or one string. Empty strings are dropped; none left is an error."""
    if isinstance(value, dict):
        value = value.get("text", value.get("spans"))
        if value is None:
            raise ZoError(f"{where}: column {column!r} holds a dict without a 'text' or "
                          f"'spans' list")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or any(isinstance(v, (list, dict)) for v in value):
        raise ZoError(f"{where}: column {column!r} holds {type(value).__name__}, not texts "
                      f"(a list of strings)")
    out = [str(v) for v in value if v is not None and str(v).strip()]
    if not out:
        raise ZoError(f"{where}: column {column!r} holds no text")
    return out


def fill(template: str, values: dict[str, Any], *, where: str, option: str = "--template") -> str:
    """`template` filled from `values` (every field must be there)."""
    try:
        return template.format(**values)
    except KeyError as exc:
        raise ZoError(f"{where}: {option} {template!r} names {exc.args[0]!r}, which is "
                      f"neither a column nor a field of the task") from None
