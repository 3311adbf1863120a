"""Where each figure of a hardware profile comes from: measured (by which pass or
command), public (a datasheet or a public measurement, by its sources) or assumed.

A profile may say so itself, in an optional top-level `origins` map (dotted figure path
-> {"kind": "measured" | "public" | "assumed", "by": what measured it, its sources, or
the rule it was assumed by}; `zoplan spec` writes one). Where it does not (every profile
written before this map existed), the origin is read from the figure's source note
(docs/sources.md's tags): a note that says "assumed", or a "[D]" note that names no
public source, is assumed; an "[M]" note of `zoplan profile`, `zoplan calibrate` or this
project's GPU check is measured by it; any other tagged note is public, by the sources it
names. A figure without a note of its own takes its section's.

`check_origins` validates the map on load (zoplan.hardware.HardwareProfile.from_dict);
zoplan.search.sensitivity moves the assumed figures across their plausible ranges
(docs/planner.md, "Measured, public, assumed").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from zoplan.errors import ZoError

ORIGIN_KINDS = ("measured", "public", "assumed")
ORIGINS_KEY = "origins"
SECTIONS = ("device", "host", "pcie", "fabric", "collective", "network", "compute")
TABLE_FIGURES = ("collective.allgather_busbw",)   # a figure that is a table of numbers
_SOURCES = re.compile(r"\(docs" + r"/sources\.md: ([^)]*)\)")   # split: a path the docs test would read
_MEASURED_BY = (("zoplan profile", "zoplan profile"), ("zoplan calibrate", "zoplan calibrate --fit"),
                ("gpu_check", "scripts/gpu_check.sh"), ("this project's", "scripts/gpu_check.sh"))


@dataclass(frozen=True, kw_only=True)
class Origin:
    """One figure's origin: its kind and what it rests on (a command, sources, a rule)."""

    kind: str
    by: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "by": self.by}


def figure_paths(sections: dict[str, dict[str, Any]]) -> list[str]:
    """Every numeric figure of a profile's sections (dotted paths; the all-gather table
    is one figure), in a fixed order."""
    paths = []
    for section in SECTIONS:
        for key, value in sorted((sections.get(section) or {}).items()):
            path = f"{section}.{key}"
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if numeric or path in TABLE_FIGURES:
                paths.append(path)
    return paths


def origin_from_note(note: str | None) -> Origin:
    """A figure's origin read from its source note (module docstring)."""
    if not note:
        return Origin(kind="assumed", by="no source note")
    text = note.strip()
    keys = _SOURCES.search(text)
    names = [k.strip() for k in keys.group(1).split(",")] if keys else []
    if "assumed" in text.lower() or "assumed" in names:
        return Origin(kind="assumed", by=_short(text))
    if text.startswith("[M]"):
        for word, by in _MEASURED_BY:
            if word in text:
                return Origin(kind="measured", by=by)
    if text.startswith(("[S]", "[M]")) or (text.startswith("[D]") and names):
        return Origin(kind="public", by=", ".join(names) or _short(text))
    return Origin(kind="assumed", by=_short(text))


def _short(text: str, limit: int = 100) -> str:
    body = _SOURCES.sub("", text).strip()
    return body if len(body) <= limit else body[: limit - 3].rstrip() + "..."


def figure_origins(sections: dict[str, dict[str, Any]], sources: dict[str, Any],
                   explicit: dict[str, Any] | None = None) -> dict[str, Origin]:
    """Every figure's origin: the profile's own `origins` entry, else its note's."""
    explicit = explicit or {}
    out = {}
    for path in figure_paths(sections):
        given = explicit.get(path)
        if isinstance(given, dict):
            out[path] = Origin(kind=given["kind"], by=given["by"])
            continue
        note = sources.get(path, sources.get(path.split(".")[0]))
        out[path] = origin_from_note(note if isinstance(note, str) else None)
    return out


def check_origins(data: Any, sections: dict[str, dict[str, Any]], origin: str) -> None:
    """A profile's `origins` map, where it has one: every entry names a figure the
    profile has, a kind of ORIGIN_KINDS and a non-empty `by` (a ZoError otherwise)."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise ZoError(f"{origin}: {ORIGINS_KEY} must map figures to {{kind, by}}")
    known = set(figure_paths(sections))
    for path, entry in data.items():
        if path not in known:
            raise ZoError(f"{origin}: {ORIGINS_KEY} names {path!r}, not a figure of the profile")
        if not isinstance(entry, dict) or set(entry) != {"kind", "by"}:
            raise ZoError(f"{origin}: {ORIGINS_KEY}.{path} must be {{\"kind\", \"by\"}}, "
                          f"got {entry!r}")
        if entry["kind"] not in ORIGIN_KINDS:
            raise ZoError(f"{origin}: {ORIGINS_KEY}.{path}.kind must be one of "
                          f"{', '.join(ORIGIN_KINDS)}, got {entry['kind']!r}")
        if not isinstance(entry["by"], str) or not entry["by"].strip():
            raise ZoError(f"{origin}: {ORIGINS_KEY}.{path}.by must say what it rests on")


def counts(origins: dict[str, Origin]) -> dict[str, int]:
    """How many figures of each kind."""
    return {kind: sum(1 for o in origins.values() if o.kind == kind) for kind in ORIGIN_KINDS}
