"""The architecture's rule, checked on every module's imports (those inside functions
included):
- zoplan, the planner, never imports torch (or anything that needs it) or zoexec; the
  one exception is the `zoplan profile` command, which calls zoexec.profiler;
- its imports are at the top of each module (torch-free by construction, not by
  function-local imports);
- zoexec, the executor, imports of zoplan only the contracts both halves share, and
  those contracts import only each other;
- zoexec's packages stand in layers (EXECUTOR_LAYERS), and so do zoplan's
  (PLANNER_LAYERS): a module imports only from its own layer or lower ones;
- no module of zoplan or zoexec reaches itself through its imports (no import circle).
Imports under `if TYPE_CHECKING:` name types for the type checker and never run: they
count for the planner's rule (no torch, no executor) and for circles (two modules that
name each other's types are one room, whatever runs first), not for the layers.
"""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDS_TORCH = ("torch", "transformers", "safetensors", "numpy", "psutil", "zoexec")
CONTRACTS = {"zoplan", "zoplan.errors", "zoplan.io", "zoplan.models", "zoplan.workload",
             "zoplan.layout", "zoplan.plan", "zoplan.trace", "zoplan.execrules", "zoplan.memory",
             "zoplan.handplan", "zoplan.lengths", "zoplan.lora", "zoplan.prefix",
             "zoplan.usage", "zoplan.estimators", "zoplan.configfile", "zoplan.names",
             "zoplan.hubcache", "zoplan.modeldir", "zoplan.catalogue", "zoplan.hostmemory"}
EXCEPTIONS = {("zoplan.cli", "zoexec.profiler")}   # `zoplan profile` measures with torch
# The executor's layers, lowest first: the maths every layer shares; data and the model
# families; the run configuration and the oracle; the process runtime; the node's block
# store; the torch profiler; the baselines (MeZO, ZO2); one training step; the run on disk; starting the ranks; the
# face. The longest prefix of a module's name decides its layer.
EXECUTOR_LAYERS = (
    ("zoexec.maths", "zoexec.fields"),   # fields: how an option is declared (any layer may)
    ("zoexec.data",),
    ("zoexec.model",),
    ("zoexec.config", "zoexec.planned", "zoexec.reference"),
    ("zoexec.runtime",),
    ("zoexec.store",),
    ("zoexec.profiler",),
    ("zoexec.baselines",),   # MeZO and ZO2 as their code runs (on the lanes, the store's loading)
    ("zoexec.train",),
    ("zoexec.run",),
    ("zoexec.launch",),
    ("zoexec.options", "zoexec.cli", "zoexec"),
)
# The planner's layers, lowest first (docs/code.md): its top-level modules (the
# contracts, the profile and its validator, the request's declaration: the facts every
# layer reads); the prices of a profile's figures; the step's task graph and
# simulation; the search and the plan it writes; measuring a machine and calibrating
# against a trace; the rich views; the face. The longest prefix decides.
PLANNER_LAYERS = (
    ("zoplan",),
    ("zoplan.pricing",),
    ("zoplan.sim",),
    ("zoplan.search",),
    ("zoplan.profiling", "zoplan.calibrate"),
    ("zoplan.views",),
    ("zoplan.cli",),
)
# Within a layer: pricing reads a profile through zoplan.hardware, never the validator.
PLANNER_FORBIDDEN = (("zoplan.pricing", "zoplan.hwcheck"),)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache
def _statements(source: str) -> tuple[tuple[str, tuple[str, ...], int, bool, bool], ...]:
    """(module, names, line, inside a function, under `if TYPE_CHECKING:`) of every
    import statement of a source: module "" for `import a, b` (names a, b), else the
    `from` module (relative ones left out). One walk of the tree, and one per source
    text: every rule reads the same modules again, and a probe's new text is read anew."""
    out: list[tuple[str, tuple[str, ...], int, bool, bool]] = []

    def visit(node: ast.AST, inside: bool, type_only: bool) -> None:
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(node, ast.Import):
            out.append(("", tuple(a.name for a in node.names), node.lineno, inside, type_only))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, tuple(a.name for a in node.names), node.lineno, inside, type_only))
        # `if TYPE_CHECKING:` (or `if typing.TYPE_CHECKING:`): its body names types only
        guarded = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.iter_child_nodes(node):
            visit(child, inside, type_only or (guarded and child in node.body))

    visit(ast.parse(source), False, False)
    return tuple(out)


def imports(path: Path, *, type_only: bool = True) -> list[tuple[str, int, bool]]:
    """(module imported, line, inside a function) of every import statement (those
    under `if TYPE_CHECKING:` too unless not `type_only`); `from a import b` counts as
    a.b where a.b is a module of the project."""
    out = []
    for module, names, line, inside, guarded in _statements(path.read_text()):
        if guarded and not type_only:
            continue
        if not module:
            out += [(name, line, inside) for name in names]
            continue
        for alias in names:
            full = f"{module}.{alias}"
            out.append((full if is_module(full) else module, line, inside))
    return out


def under(name: str, roots) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def planner_violations() -> list[str]:
    bad = []
    for mod, path in modules("zoplan").items():
        for name, line, inside in imports(path):
            where = f"{path.relative_to(ROOT)}:{line} imports {name}"
            if (mod, name) in EXCEPTIONS:
                continue
            if under(name, NEEDS_TORCH):
                bad.append(where)
            elif inside:
                bad.append(where + " inside a function")
    return bad


def executor_violations() -> list[str]:
    bad = []
    contracts = [p for m, p in modules("zoplan").items() if m in CONTRACTS]
    for path in list(modules("zoexec").values()) + contracts:
        for name, line, _ in imports(path):
            if under(name, ("zoplan",)) and name not in CONTRACTS:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}, not a contract")
    return bad


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = EXECUTOR_LAYERS) -> int:
    best, layer = -1, None
    for i, prefixes in enumerate(layers):
        for prefix in prefixes:
            if under(module, (prefix,)) and len(prefix) > best:
                best, layer = len(prefix), i
    assert layer is not None, f"{module} is in no layer of {layers}"
    return layer


def layer_violations(package: str = "zoexec",
                     layers: tuple[tuple[str, ...], ...] = EXECUTOR_LAYERS) -> list[str]:
    bad = []
    for mod, path in modules(package).items():
        for name, line, _ in imports(path, type_only=False):
            if under(name, (package,)) and layer_of(name, layers) > layer_of(mod, layers):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}, a higher layer")
    return bad


def planner_layer_violations() -> list[str]:
    bad = layer_violations("zoplan", PLANNER_LAYERS)
    for mod, path in modules("zoplan").items():
        for name, line, _ in imports(path, type_only=False):
            if any(under(mod, (a,)) and under(name, (b,)) for a, b in PLANNER_FORBIDDEN):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}, the validator")
    return bad


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (package __init__s included)."""
    mods = modules("zoplan") | modules("zoexec")
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for name, _, _ in imports(path):
            while name and name not in mods:      # `from a.b import C` names a.b
                name = name.rpartition(".")[0]
            if name and name != mod:
                graph[mod].add(name)
    return graph


def import_circles() -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    graph, index, low, stack, on, out = import_graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_planner_needs_no_torch_and_no_executor():
    assert planner_violations() == []


def test_the_executor_uses_only_the_contracts_of_the_planner():
    assert executor_violations() == []


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of zoplan/ and zoexec/ the rules read instead of the checkout: a probe
    module written into it breaks a rule without touching the source tree (tests in
    other processes read the real one meanwhile)."""
    for package in ("zoplan", "zoexec"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return tmp_path


@pytest.mark.parametrize("source,finds", [
    ("import torch\n", "imports torch"),
    ("from zoexec.train.engine import RunConfig\n", "imports zoexec.train.engine"),
    ("def f():\n    import json\n", "imports json inside a function"),
])
def test_the_rule_finds_what_breaks_it(tree, source, finds):
    """A planner module written to break the rule is found (the guard can fail)."""
    assert planner_violations() == []
    (tree / "zoplan" / "_rule_probe.py").write_text(source)
    assert any(finds in v for v in planner_violations())


def test_a_contract_that_reaches_into_the_planner_is_found(tree):
    (tree / "zoexec" / "_rule_probe.py").write_text("from zoplan.sim.graph import step_costs\n")
    assert any("imports zoplan.sim.graph" in v for v in executor_violations())


def test_the_executor_imports_only_its_own_layer_or_lower_ones():
    assert layer_violations() == []


def test_the_planner_imports_only_its_own_layer_or_lower_ones():
    assert planner_layer_violations() == []


PLANNER_PROBES = (   # (file, source): each breaks one step of PLANNER_LAYERS
    ("_probe_top.py", "from zoplan.pricing.compute import forward_flops\n"),   # contracts < pricing
    ("pricing/_probe_sim.py", "from zoplan.sim.graph import step_costs\n"),    # pricing < sim
    ("pricing/_probe_views.py", "from zoplan.views.common import fmt\n"),      # (pricing/devicemem.py's once)
    ("sim/_probe_search.py", "from zoplan.search.space import Request\n"),     # sim < search
    ("search/_probe_calibrate.py", "from zoplan.calibrate import calibrate\n"),   # < calibrate
    ("calibrate/_probe_views.py", "from zoplan.views.show import show_command\n"),  # < views
    ("views/_probe_cli.py", "def f():\n    from zoplan.cli import app\n"),    # views < cli
    ("pricing/_probe_hwcheck.py", "from zoplan.hwcheck import Z_MODEL\n"),    # (zo.py's once)
)


def test_each_planner_layer_broken_is_found(tree):
    """A planner module that imports a higher layer (inside a function too) is found:
    one probe per step of the layers, all in one copy of the tree."""
    assert planner_layer_violations() == []
    for where, source in PLANNER_PROBES:
        (tree / "zoplan" / where).write_text(source)
    found = planner_layer_violations()
    for where, source in PLANNER_PROBES:
        name = source.split("from ")[1].split(" import")[0]
        assert any(f"{where}:{source.count(chr(10))} imports {name}," in v
                   for v in found), (where, found)


def test_no_module_imports_itself_through_others():
    assert import_circles() == []


def test_a_layer_broken_inside_a_function_is_found(tree):
    assert layer_violations() == []
    (tree / "zoexec" / "maths" / "_rule_probe.py").write_text(
        "def f():\n    from zoexec.train.engine import Trainer\n")
    assert any("maths/_rule_probe.py:2 imports zoexec.train.engine" in v for v in layer_violations())


def test_a_type_only_import_breaks_no_layer_but_makes_a_circle(tree):
    """An import under `if TYPE_CHECKING:` never runs: no layer broken; but two modules
    naming each other's types are a circle; and the planner still may not name torch
    there."""
    probe = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {} import X\n"
    (tree / "zoexec" / "maths" / "_probe.py").write_text(probe.format("zoexec.train.engine"))
    (tree / "zoplan" / "_probe.py").write_text(probe.format("torch"))
    assert import_circles() == [] and layer_violations() == []
    assert any("_probe.py:3 imports torch" in v for v in planner_violations())
    (tree / "zoexec" / "data" / "_probe_one.py").write_text("from zoexec.data import _probe_two\n")
    (tree / "zoexec" / "data" / "_probe_two.py").write_text(probe.format("zoexec.data._probe_one"))
    assert ["zoexec.data._probe_one", "zoexec.data._probe_two"] in import_circles()


def test_an_import_circle_is_found(tree):
    """Two modules that import each other (one inside a function) are a circle."""
    assert import_circles() == []
    (tree / "zoexec" / "data" / "_probe_one.py").write_text("from zoexec.data import _probe_two\n")
    (tree / "zoexec" / "data" / "_probe_two.py").write_text(
        "def f():\n    from zoexec.data._probe_one import X\n")
    assert ["zoexec.data._probe_one", "zoexec.data._probe_two"] in import_circles()


def test_importing_the_planner_loads_neither_torch_nor_the_executor():
    code = ("import sys, zoplan.cli, zoplan.search, zoplan.calibrate, zoplan.profiling\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'zoexec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
