"""Rooms of a livable size: no module of zoplan or zoexec over MAX_MODULE lines, no
class over MAX_CLASS lines (from its `class` line to its last, decorators aside)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("zoplan", "zoexec")
MAX_MODULE = 600
MAX_CLASS = 300


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def oversized_modules(paths: list[Path], limit: int = MAX_MODULE) -> list[str]:
    out = []
    for path in paths:
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append(f"{_name(path)}: {lines} lines (> {limit})")
    return out


def oversized_classes(paths: list[Path], limit: int = MAX_CLASS) -> list[str]:
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    out.append(f"{_name(path)}:{node.lineno} class {node.name}: "
                               f"{size} lines (> {limit})")
    return out


def test_the_walk_finds_both_packages():
    names = {p.relative_to(ROOT).parts[0] for p in sources()}
    assert names == set(PACKAGES)


def test_no_module_over_the_limit():
    assert oversized_modules(sources()) == []


def test_no_class_over_the_limit():
    assert oversized_classes(sources()) == []


def test_the_checks_catch_a_big_module_and_a_big_class(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_CLASS)))
    small = tmp_path / "small.py"
    small.write_text("class Small:\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_CLASS - 1)))
    assert oversized_classes([big, small]) == [f"{big}:1 class Big: {MAX_CLASS + 1} lines "
                                               f"(> {MAX_CLASS})"]
    assert oversized_modules([big, small]) == []
    assert oversized_modules([big, small], limit=MAX_CLASS) == [
        f"{big}: {MAX_CLASS + 1} lines (> {MAX_CLASS})"]
