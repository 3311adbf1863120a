"""How the pricing package reads a profile's figures: `profile.figures()` (the typed
sections of zoplan.hwsections; only zoplan.pricing may read them, zoplan.hardware
refuses any other module of the planner), and the two ways a figure that may be absent
is read: `given` for one the profile's device kind always has (zoplan.hwcheck), `or_`
for an optional one with the value its absence means."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def given(value: T | None, path: str) -> T:
    """A figure every validated profile of this device kind has (zoplan.hwcheck's
    _REQUIRED_BY_KIND, or a group of figures given together): None is a programmer's
    error, a price asked of the wrong kind of profile."""
    assert value is not None, f"{path} is priced for a profile that has no such figure"
    return value


def or_(value: T | None, default: T) -> T:
    """An optional figure, `default` where the profile has none."""
    return default if value is None else value
