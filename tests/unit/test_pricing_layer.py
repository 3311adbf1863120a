"""Every cost term lives in zoplan.pricing: no other module of the planner can read a
profile's figures, whatever it spells.

- A HardwareProfile has no section attributes; its typed figures are `figures()`, which
  zoplan.hardware hands only to a caller in zoplan.pricing (FIGURE_READERS), and its JSON
  form (`to_dict()`, `to_json()`) only to the modules that write, edit or show the file
  (DATA_READERS). The check is on the calling frame's module, so any spelling from
  anywhere else (an attribute, getattr, vars, a copy, a lambda of its own) raises
  FigureReadError: the probes below run each spelling as a module of each other layer
  and see it fail.
- HardwareProfile is data and its validation: its public members are its structure,
  the gated readers and the facts derived from them, no prices.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zoplan.hardware import (
    DATA_READERS,
    FIGURE_READERS,
    FigureReadError,
    HardwareProfile,
    load_profile,
)

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"name", "gpus_per_node", "sources", "extra", "device_kind", "device_memory_gib",
          "reserved_gib", "concurrent_engines", "host_memory_gib", "fabric_kind",
          "switch_groups", "is_cpu", "device_word", "device_memory_bytes",
          "host_memory_bytes", "fabric_groups", "fabric_group_of", "max_slices", "sha256",
          "from_dict", "with_figures", "origins", "assumed_figures",
          "figures", "to_dict", "to_json"}   # the last three: gated (FIGURE/DATA_READERS)
# Spellings of a figure read (each a statement run with `profile` bound); every one is
# refused in a module of the planner outside the readers.
FIGURE_SPELLINGS = (
    "profile.figures().pcie.h2d_gbps",
    "getattr(profile, 'figures')().collective.latency_us",
    "vars(profile)['figures']().compute.peak_tflops",
    "profile.__dict__['figures']().device.hbm_gbps",
    "copy.deepcopy(profile).figures().host.mem_bw_gbps",
    "(lambda p: p.figures())(profile).network.gbps",
    "list(map(operator.methodcaller('figures'), [profile]))[0].fabric.p2p_gbps",
)
DATA_SPELLINGS = (
    "profile.to_dict()['collective']",
    "json.loads(profile.to_json())['pcie']['h2d_gbps']",
    "getattr(profile, 'to_' + 'dict')()['compute']",
    "profile.extra()['description']",
)
ABSENT_SPELLINGS = (   # no such attribute at all
    "getattr(profile, 'pcie')['h2d_gbps']",
    "profile.compute['peak_tflops']",
    "dataclasses.asdict(profile)",
)
NOT_PRICING = ("zoplan.sim.bounds", "zoplan.search.space", "zoplan.memory",
               "zoplan.hostmemory", "zoplan.cli", "zoplan.pricingx", "zoplan")
NOT_DATA = ("zoplan.sim.bounds", "zoplan.sim.costs", "zoplan.search.space",
            "zoplan.search.evaluate", "zoplan.memory", "zoplan.plan", "zoplan.cli",
            "zoplan.viewsx")


def run_as(module: str, statement: str, profile: HardwareProfile) -> object:
    """`statement` evaluated as code of `module` (its frames name that module)."""
    code = compile(f"import copy, dataclasses, json, operator\nresult = {statement}\n",
                   f"{module.replace('.', '/')}.py", "exec")
    scope: dict[str, object] = {"__name__": module, "profile": profile}
    exec(code, scope)
    return scope["result"]


@pytest.fixture(scope="module")
def a100():
    return load_profile("dgx-a100-80gb")


@pytest.mark.parametrize("module", NOT_PRICING)
def test_no_module_outside_pricing_reads_a_figure(a100, module):
    for statement in FIGURE_SPELLINGS:
        with pytest.raises(FigureReadError, match=module.replace(".", r"\.")):
            run_as(module, statement, a100)
    for statement in ABSENT_SPELLINGS:
        with pytest.raises((AttributeError, TypeError)):
            run_as(module, statement, a100)


@pytest.mark.parametrize("module", NOT_DATA)
def test_no_module_outside_the_file_s_homes_reads_its_json(a100, module):
    for statement in DATA_SPELLINGS:
        with pytest.raises(FigureReadError):
            run_as(module, statement, a100)


def test_the_readers_read(a100):
    """The same spellings work where they are allowed (the probes can pass): pricing
    reads the figures, the file's homes its JSON form, code outside the planner
    (tests, benchmarks) both."""
    for module in ("zoplan.pricing.copies", "zoplan.pricing", "tests.unit.x", "__main__"):
        for statement in FIGURE_SPELLINGS:
            assert run_as(module, statement, a100) is not None, (module, statement)
    for module in ("zoplan.calibrate.refit", "zoplan.views.profile", "zoplan.profiling",
                   "zoplan.search.sensitivity", "zoplan.pricing.memory"):
        for statement in DATA_SPELLINGS:
            assert run_as(module, statement, a100) is not None, (module, statement)
    assert FIGURE_READERS == ("zoplan.pricing",) and "zoplan.sim" not in DATA_READERS


# What reaches past the gate rather than through it: the gate's own state, the frames
# it reads, a closure's cells. No module of the planner but zoplan/hardware.py names them.
INTROSPECTION = {"_ALLOWED", "_getframe", "f_globals", "__closure__", "cell_contents",
                 "FIGURE_READERS", "DATA_READERS", "may_read"}


def source_breaches(path: Path, rel: str) -> list[str]:
    """A `.figures()` call outside zoplan.pricing, or a name of INTROSPECTION outside
    zoplan/hardware.py, in one module's source."""
    bad: list[str] = []
    text = path.read_text()
    if not any(word in text for word in (".figures(", *INTROSPECTION)):
        return bad   # most modules: nothing to parse for
    for node in ast.walk(ast.parse(text)):
        name = (node.attr if isinstance(node, ast.Attribute) else
                node.id if isinstance(node, ast.Name) else
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                else None)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "figures" and not rel.startswith("zoplan/pricing/")):
            bad.append(f"{rel}:{node.lineno} calls figures()")
        elif name in INTROSPECTION and rel != "zoplan/hardware.py":
            bad.append(f"{rel}:{node.lineno} names {name}")
    return bad


def test_only_pricing_calls_figures_in_the_source(tmp_path):
    """The same rule read on the source, for a clear line before anything runs, and the
    ways around the gate that no spelling of a read needs (the gate's cache, frames,
    closure cells); a probe of each is found."""
    bad = [b for path in sorted((ROOT / "zoplan").rglob("*.py"))
           for b in source_breaches(path, str(path.relative_to(ROOT)))]
    assert bad == []
    probes = {"calls figures()": "x = profile.figures()\n",
              "names _ALLOWED": "import zoplan.hardware as h\nh._ALLOWED.clear()\n",
              "names __closure__": "c = profile.figures.__closure__\n",
              "names cell_contents": "c = getattr(cell, 'cell_contents')\n"}
    for what, source in probes.items():
        probe = tmp_path / "probe.py"
        probe.write_text(source)
        assert any(what in b for b in source_breaches(probe, "zoplan/sim/probe.py")), what


def test_the_hardware_profile_is_data_and_validation(a100):
    members = {m for m in dir(a100) if not m.startswith("_")}
    assert members <= PUBLIC, f"HardwareProfile prices: {sorted(members - PUBLIC)}"
    with pytest.raises(AttributeError):
        a100.name = "other"   # frozen
