"""Docs the code keeps true: docs/options.md's reference part is what the option fields
make (scripts/options_doc.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_options_md_is_made_from_the_fields():
    options_doc = _script("options_doc")
    found = options_doc.problem(options_doc.DOC.read_text())
    assert found is None, found


def test_a_stale_options_md_is_found():
    """The guard can fail: an option's line gone, or its help edited by hand."""
    options_doc = _script("options_doc")
    text = options_doc.DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--save-best"))
    assert "--save-best" in options_doc.problem(text.replace(row + "\n", ""))
    assert options_doc.problem(text.replace("Snapshots kept (the newest)", "Snapshots kept"))
    assert options_doc.problem(text.replace("Rows per forward pass", "Rows a pass")) is not None
