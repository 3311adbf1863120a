"""Formatting and selections shared by zoplan's views."""

from __future__ import annotations

import re
from typing import Any

from zoplan.errors import ZoError
from zoplan.hardware import GIB
from zoplan.layout import Layout

MIB = 2**20


def fmt_time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1.0:
        return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def fmt_gib(num_bytes: float) -> str:
    if num_bytes < GIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / GIB:.1f} GiB"


def fmt_count(count: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if count >= div:
            return f"{count / div:.3g}{suffix}"
    return f"{count:.0f}"


def layout_label(layout: Any) -> str:
    """Label of a layout given as a dict (Layout.to_dict) or already as text."""
    if isinstance(layout, dict):
        try:
            return Layout(**layout).label()
        except (TypeError, ValueError):
            return str(layout)
    return str(layout)


def parse_selection(text: str | None, *, option: str, count: int, owner: str,
                    what: str) -> list[int] | None:
    """"0-3", "0,2,5" or "0-3,8" -> sorted indices; None when not given."""
    if text is None:
        return None
    values: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ZoError(f"{option} {text}: expected a range like 0-3 or a list like 0,2,5")
        lo, hi = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if hi < lo:
            raise ZoError(f"{option} {text}: range {lo}-{hi} runs backwards")
        if hi >= count:
            raise ZoError(f"{option} {text}: {owner} has {index_range(what, count)}")
        values.update(range(lo, hi + 1))
    return sorted(values)


def index_range(what: str, count: int) -> str:
    """("ranks", 4) -> "ranks 0-3"; ("ranks", 1) -> "rank 0"."""
    return f"{what} 0-{count - 1}" if count > 1 else f"{what.rstrip('s')} 0"
