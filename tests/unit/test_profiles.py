"""Shipped hardware profiles load and carry sources; validation errors are one clear line."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile, shipped_profiles
from zoplan.io import dumps_canonical, load_json
from zoplan.pricing.stragglers import DEFAULT_NODE_SPREAD, node_spread
from zoplan.search import resolve_request

EXPECTED = {"dgx-a100-80gb", "dgx-h100", "hgx-h200", "8x-rtx4090", "8x-a100-pcie-nvlink-pairs",
            "rtx4090-workstation", "gh200", "cpu"}


def base() -> dict:
    return load_json(shipped_profiles()["dgx-a100-80gb"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_profile_loads_with_sources(name):
    profile = load_profile(name)
    assert profile.name == name
    for path, note in profile.sources.items():
        assert note.startswith(("[S]", "[M]", "[D]")), f"{name}: {path} note {note!r}"
    assert HardwareProfile.from_dict(profile.to_dict()) == profile
    assert len(profile.fabric_groups) >= 1


SOURCES_DOC = Path(__file__).resolve().parents[2] / "docs" / "sources.md"
OUTSIDE = ("hardware.md", "simulators.md", "reference/")   # notes that are not in the repository


def source_keys() -> set[str]:
    """The keys docs/sources.md defines: the first column of its table, in backticks."""
    return {m.group(1) for m in re.finditer(r"^\| `([a-z0-9-]+)` \|", SOURCES_DOC.read_text(), re.M)}


def note_problems(profile, keys: set[str]) -> list[str]:
    """Every figure of a GPU profile names the public sources it rests on, by keys of
    docs/sources.md, and no note outside this repository."""
    bad = []
    for path, note in profile.sources.items():
        named = re.search(r"\(docs/sources\.md: ([a-z0-9, -]+)\)\s*$", note)
        if any(o in note for o in OUTSIDE):
            bad.append(f"{path}: cites a note outside the repository")
        elif named is None:
            bad.append(f"{path}: names no source of docs/sources.md")
        else:
            unknown = {k.strip() for k in named.group(1).split(",")} - keys
            if unknown:
                bad.append(f"{path}: unknown source(s) {sorted(unknown)}")
    return bad


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if n != "cpu"))
def test_every_gpu_figure_names_a_public_source(name):
    assert note_problems(load_profile(name), source_keys()) == []


def test_the_source_rule_sees_a_missing_or_unknown_source():
    keys = source_keys()
    assert {"nvbw-11", "mamf", "assumed", "zo2", "mezo", "distzo2"} <= keys
    data = copy.deepcopy(base())
    data["sources"]["pcie.h2d_gbps"] = "[M] 25 GB/s (hardware.md)"
    data["sources"]["pcie.d2h_gbps"] = "[M] 25 GB/s"
    data["sources"]["compute.peak_tflops"] = "[M] 271 (docs/sources.md: nowhere)"
    problems = note_problems(HardwareProfile.from_dict(data), keys)
    assert [p.split(":")[0] for p in problems] == ["pcie.h2d_gbps", "pcie.d2h_gbps",
                                                  "compute.peak_tflops"]


def test_all_expected_profiles_are_shipped():
    assert EXPECTED <= set(shipped_profiles())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_profile_describes_a_node_not_a_cluster(name):
    """No shipped profile caps the nodes (the count comes from --gpus); every one
    states its node spread as derived; an older profile's max_nodes is ignored."""
    profile = load_profile(name)
    data = json.loads(shipped_profiles()[name].read_text())
    assert "max_nodes" not in data
    assert node_spread(profile) == data["compute"]["node_spread"] == 0.02
    assert profile.sources["compute.node_spread"].startswith("[D]")
    assert HardwareProfile.from_dict({**data, "max_nodes": 1}) == profile
    resolve_request(model="opt-1.3b", gpus=65536 * profile.gpus_per_node // 8, profile=name,
                    batch=16, seq=64)


def test_the_node_spread_defaults_when_a_profile_has_none():
    data = json.loads(shipped_profiles()["dgx-a100-80gb"].read_text())
    del data["compute"]["node_spread"], data["sources"]["compute.node_spread"]
    assert node_spread(HardwareProfile.from_dict(data)) == DEFAULT_NODE_SPREAD


def test_profile_specifics():
    assert load_profile("8x-rtx4090").figures().fabric.kind == "host"
    assert load_profile("8x-rtx4090").figures().pcie.switch_groups
    pairs = load_profile("8x-a100-pcie-nvlink-pairs")
    assert pairs.figures().fabric.kind == "bridge" and pairs.max_slices(8) == 2
    assert load_profile("rtx4090-workstation").gpus_per_node == 1
    gh = load_profile("gh200")
    assert gh.gpus_per_node == 1 and 345 <= gh.figures().pcie.h2d_gbps <= 420
    cpu = load_profile("cpu")
    assert cpu.is_cpu and cpu.figures().device.concurrent_engines is False
    assert cpu.figures().fabric.kind == "shm"


def _mutate(fn) -> dict:
    data = copy.deepcopy(base())
    fn(data)
    return data


CASES = [
    ("negative bandwidth", lambda d: d["pcie"].update(h2d_gbps=-3), "pcie.h2d_gbps"),
    ("zero bandwidth", lambda d: d["fabric"].update(p2p_gbps=0), "fabric.p2p_gbps"),
    ("not a number", lambda d: d["compute"].update(peak_tflops="fast"), "compute.peak_tflops"),
    ("missing section", lambda d: d.pop("collective"), "collective"),
    ("missing field", lambda d: d["host"].pop("cores"), "host.cores"),
    ("unknown key", lambda d: d.update(gpu_count=8), "gpu_count"),
    ("group rank out of range", lambda d: d["pcie"].update(switch_groups=[[0, 9]]), "pcie.switch_groups"),
    ("group rank twice", lambda d: d["fabric"].update(groups=[[0, 1], [1, 2]]), "fabric.groups"),
    ("group not a list", lambda d: d["fabric"].update(groups=[0, 1]), "fabric.groups"),
    ("missing source note", lambda d: d["sources"].pop("pcie.h2d_gbps"), "pcie.h2d_gbps"),
    ("schema version", lambda d: d.update(schema_version=2), "schema_version"),
    ("table order", lambda d: d["collective"].update(allgather_busbw=[[2, 1], [1, 1]]),
     "collective.allgather_busbw"),
    ("device kind", lambda d: d["device"].update(kind="tpu"), "device.kind"),
    ("fabric kind", lambda d: d["fabric"].update(kind="infiniband"), "fabric.kind"),
    # the GPU cost model's figures: required on cuda profiles, checked, sourced, and the
    # CPU model's figures refused there (they would be ignored)
    ("gpu figure missing", lambda d: d["device"].pop("hbm_gbps"), "device.hbm_gbps"),
    ("gpu rate missing", lambda d: d["compute"].pop("fp32_tflops"), "compute.fp32_tflops"),
    ("gpu rate not a number", lambda d: d["compute"].update(tf32_tflops="x"),
     "compute.tf32_tflops"),
    ("negative duplex", lambda d: d["pcie"].update(h2d_duplex_gbps=-1), "pcie.h2d_duplex_gbps"),
    ("half of a pair", lambda d: d["pcie"].pop("uplink_d2h_duplex_gbps"),
     "pcie.uplink_d2h_duplex_gbps"),
    ("cpu figure on a gpu", lambda d: d["compute"].update(elem_ns=0.5), "compute.elem_ns"),
    ("old duplex figure", lambda d: d["pcie"].update(duplex_gbps=25), "pcie.duplex_gbps"),
    ("gpu figure unsourced", lambda d: d["sources"].pop("compute.z_launch_us"),
     "compute.z_launch_us"),
]


@pytest.mark.parametrize("label,mutate,field", CASES, ids=[c[0] for c in CASES])
def test_validation_error_names_the_field(label, mutate, field):
    with pytest.raises(ZoError) as info:
        HardwareProfile.from_dict(_mutate(mutate), origin="profile x.json")
    message = str(info.value)
    assert field in message, message
    assert "\n" not in message and message.startswith("profile x.json: ")


def test_not_json_is_one_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{ not json")
    with pytest.raises(ZoError) as info:
        load_profile(path)
    assert "not valid JSON" in str(info.value) and "\n" not in str(info.value)


def test_unknown_profile_name_lists_shipped():
    with pytest.raises(ZoError, match="dgx-h100"):
        load_profile("no-such-machine")


def test_profile_path_round_trip(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(base()))
    assert load_profile(path) == load_profile("dgx-a100-80gb")


def test_cpu_profiles_need_none_of_the_gpu_figures():
    """The shipped CPU profile has no GPU figure and loads; a GPU figure on it is
    refused in one line naming it."""
    data = load_json(shipped_profiles()["cpu"])
    assert not {"tf32_tflops", "fp32_tflops", "z_launch_us"} & set(data["compute"])
    assert "hbm_gbps" not in data["device"]
    HardwareProfile.from_dict(copy.deepcopy(data))
    data["compute"]["tf32_tflops"] = 1.0
    with pytest.raises(ZoError) as info:
        HardwareProfile.from_dict(data, origin="profile c.json")
    assert "compute.tf32_tflops is a figure of cuda profiles" in str(info.value)
    assert "\n" not in str(info.value)


def test_gpu_profiles_carry_the_gpu_cost_model():
    """Every shipped GPU profile prices fp32 below TF32 below 16 bit, and H2D under
    duplex below H2D alone (the A100's measured 11-13 vs 25-26 GB/s)."""
    for name in sorted(EXPECTED - {"cpu"}):
        p = load_profile(name)
        c, pcie = p.figures().compute, p.figures().pcie
        assert c.fp32_tflops is not None and c.tf32_tflops is not None, name
        assert c.fp32_tflops <= c.tf32_tflops < c.peak_tflops, name
        assert pcie.h2d_duplex_gbps is not None and pcie.h2d_duplex_gbps <= pcie.h2d_gbps, name
        assert c.z_ns_per_elem is not None and c.z_launch_us is not None, name
        assert 0 < c.z_ns_per_elem < 0.01 and c.z_launch_us > 0, name
    a100 = load_profile("dgx-a100-80gb").figures().pcie
    assert a100.h2d_duplex_gbps is not None and 11 <= a100.h2d_duplex_gbps <= 13
    assert a100.d2h_duplex_gbps == 24


def test_a_profile_written_back_is_the_file_it_was_read_from():
    """Loading then writing a shipped profile (what `zoplan profile` and `zoplan
    calibrate --fit` write: HardwareProfile.to_json) gives the file's own JSON, byte for
    byte in the canonical form, with its ints kept ints; and writing it again, the same
    bytes: the typed sections lose, add and reorder nothing."""
    for name, path in shipped_profiles().items():
        text = load_profile(path).to_json()
        assert text == dumps_canonical(load_json(path)), name
        assert HardwareProfile.from_dict(json.loads(text)).to_json() == text, name


def test_docs_profiles_table_names_every_figure_with_its_unit():
    """docs/planner.md's table of the profile's figures: one row per field of the typed sections, in their
    order, with the unit of its plausible range (zoplan.hwcheck) and the device kinds
    that have it; a field added without its row, or a row of no field, fails."""
    from dataclasses import fields

    from zoplan.hwcheck import _OPTIONAL_BY_KIND, _REQUIRED, _REQUIRED_BY_KIND, _range_of
    from zoplan.hwsections import SECTION_TYPES

    words = {"device.kind": "cuda, cpu", "device.model": "text",
             "device.concurrent_engines": "true/false", "pcie.pinned": "true/false",
             "pcie.switch_groups": "lists of local ranks",
             "fabric.kind": "nvswitch, bridge, host, shm", "fabric.groups": "lists of local ranks",
             "collective.allgather_busbw": "[bytes, GB/s] pairs"}
    expected = []
    for section, kind in SECTION_TYPES.items():
        for f in fields(kind):
            path = f"{section}.{f.name}"
            unit = words.get(path) or _range_of(path)[2]
            if f.name in _REQUIRED[section] or path in ("device.kind", "fabric.kind",
                                                        "collective.allgather_busbw"):
                who = "all"
            else:
                who = "; ".join([f"{k} (required)" for k in ("cuda", "cpu")
                                 if path in _REQUIRED_BY_KIND[k]]
                                + [k for k in ("cuda", "cpu") if path in _OPTIONAL_BY_KIND[k]])
                who = who or "all (optional)"
            expected.append(f"| `{path}` | {unit} | {who} |")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    section = doc.split("## Hardware profiles: the figures, typed", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [r[:len(e)] for r, e in zip(rows, expected)] == expected and len(rows) == len(expected)


def test_every_typed_figure_is_checked_on_load():
    """The typed sections and the validator name the same figures: each field is a
    required figure, a figure of a device kind (zoplan.hwcheck checks its range) or one
    of the few that are not numbers (checked by kind: _check_kinds, groups, the table),
    and each figure the validator names is a field."""
    from dataclasses import fields

    from zoplan.hwcheck import _OPTIONAL_BY_KIND, _REQUIRED, _REQUIRED_BY_KIND
    from zoplan.hwsections import SECTION_TYPES

    not_numbers = {"device.kind", "device.model", "device.concurrent_engines", "pcie.pinned",
                   "pcie.switch_groups", "fabric.kind", "fabric.groups",
                   "collective.allgather_busbw"}
    checked = ({f"{s}.{k}" for s, keys in _REQUIRED.items() for k in keys}
               | {p for paths in (*_REQUIRED_BY_KIND.values(), *_OPTIONAL_BY_KIND.values())
                  for p in paths})
    typed = {f"{s}.{f.name}" for s, kind in SECTION_TYPES.items() for f in fields(kind)}
    assert typed - not_numbers == checked
