"""Every cost term lives in zoplan.pricing: the layer rule, checked on the source.

- No module of the planner outside the pricing package reads a profile figure that
  prices anything. Reading the profile's structure is allowed everywhere (the device
  kind, memory sizes, which ranks share a switch or a fabric: STRUCTURAL); the figures'
  own homes are allowed too: validation (zoplan.hwcheck), measurement and fitting
  (zoplan.profiling), refitting (zoplan.calibrate) and display (zoplan.views).
  A module that reads `profile.compute["z_ns_per_elem"]` (or aliases a section,
  `c = profile.compute`) to compute a time is a cost term outside its home.
- HardwareProfile is data and its validation: its public members are the data's
  fields and the structural facts derived from them, no prices.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zoplan.hardware import HardwareProfile

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"device", "host", "pcie", "fabric", "collective", "network", "compute"}
# Keys of the profile's structure (not prices): what kind of device, how much memory
# there is to fit in, which ranks share a switch uplink or a fast fabric.
STRUCTURAL = {"device": {"kind", "concurrent_engines", "memory_gib", "reserved_gib", "model"},
              "host": {"memory_gib"},
              "fabric": {"kind", "groups"},
              "pcie": {"switch_groups"}}
HOMES = ("zoplan/pricing/", "zoplan/hwcheck.py", "zoplan/profiling/", "zoplan/calibrate/",
         "zoplan/views/")
DATA_MEMBERS = {"name", "gpus_per_node", "device", "host", "pcie", "fabric", "collective",
                "network", "compute", "sources", "extra", "is_cpu", "device_word",
                "device_memory_bytes", "host_memory_bytes", "fabric_groups",
                "fabric_group_of", "max_slices", "sha256", "to_dict", "to_json", "from_dict",
                "origins", "assumed_figures"}   # where each figure comes from (zoplan.origins)


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def figure_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) of every use of a profile section that is not a read of a
    structural key: `x.compute["k"]`, `x.compute.get("k")`, `"k" in x.compute`, or the
    section itself passed on or aliased."""
    tree = ast.parse(source)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr in SECTIONS
                and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(id(node))
        key: str | None = None
        if isinstance(parent, ast.Subscript) and parent.value is node:
            key = _key(parent.slice)
        elif isinstance(parent, ast.Attribute) and parent.attr == "get":
            call = parents.get(id(parent))
            key = _key(call.args[0]) if isinstance(call, ast.Call) and call.args else None
        elif isinstance(parent, ast.Compare) and node in parent.comparators:
            key = _key(parent.left)
        if key not in STRUCTURAL.get(node.attr, set()):
            out.append((node.lineno, f"{node.attr}[{key!r}]" if key else node.attr))
    return out


def planner_modules() -> list[Path]:
    return [p for p in sorted((ROOT / "zoplan").rglob("*.py"))
            if not str(p.relative_to(ROOT)).startswith(HOMES)]


@pytest.mark.parametrize("path", planner_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_cost_term_outside_the_pricing_package(path):
    reads = figure_reads(path.read_text())
    assert not reads, (f"{path.relative_to(ROOT)} reads profile figures outside "
                       f"zoplan.pricing: {reads} (price them in zoplan/pricing/)")


def test_the_rule_sees_a_figure_read_and_an_alias():
    """The check itself: a cost computed from a figure, an alias of a section and a
    membership test are seen; structural reads are not."""
    bad = ("def t(p):\n    c = p.compute\n    return p.compute['z_ns_per_elem'] * 1e-9\n"
           "def u(p):\n    return p.pcie.get('h2d_gbps') if 'sockets' in p.host else 0\n")
    assert sorted(what for _, what in figure_reads(bad)) == [
        "compute", "compute['z_ns_per_elem']", "host['sockets']", "pcie['h2d_gbps']"]
    fine = ("def f(p):\n    return p.device['kind'], p.fabric.get('groups'), "
            "p.pcie.get('switch_groups'), p.device['memory_gib']\n")
    assert figure_reads(fine) == []


def test_the_hardware_profile_is_data_and_validation():
    members = {m for m in dir(HardwareProfile) if not m.startswith("_")}
    members |= set(HardwareProfile.__dataclass_fields__)
    assert members <= DATA_MEMBERS, f"HardwareProfile prices: {sorted(members - DATA_MEMBERS)}"
