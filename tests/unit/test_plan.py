"""plan.json from a search: every key filled, round-trips byte for byte, matches the
golden file, and is the same bytes for the same inputs (whatever the hash seed).

Regenerate the golden file after an intended change with
    ZOPLAN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_plan.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoplan.plan import Plan
from zoplan.search import build_plan, resolve_request, search
from zoplan.trace import Span

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tiny-opt-node4.plan.json"
PROFILE = FIXTURES / "node4-nvswitch.json"
ARGS = {"model": "tiny-opt", "gpus": 4, "batch": 8, "seq": 64}


def small_plan() -> Plan:
    return build_plan(search(resolve_request(profile=str(PROFILE), **ARGS)))


@pytest.fixture(scope="module")
def plan() -> Plan:
    return small_plan()


def test_plan_has_every_key_of_the_contract(plan):
    d = plan.data
    p = d["predicted"]
    for key in ("step_time_s", "tokens_per_s", "gpu_mem_bytes", "host_mem_bytes", "bottleneck",
                "lower_bound_s", "utilisation", "spans"):
        assert key in p, key
    assert p["lower_bound_s"] <= p["step_time_s"] <= p["serial_upper_bound_s"]
    assert all(0 <= u <= 1 + 1e-9 for u in p["utilisation"].values())
    assert d["model"]["spec"]["hf_config"]["model_type"] == "opt"
    assert d["baselines"]["zo2"]["step_time_s"] > 0 and d["baselines"]["zo2"]["layout"]
    assert d["baselines"]["unsliced"]["layout"]["slices"] == 1
    assert d["candidates"][0]["layout"] == d["layout"]
    assert [c["step_time_s"] for c in d["candidates"]] == sorted(c["step_time_s"] for c in d["candidates"])
    assert all("reason" in x and "layout" in x for x in d["pruned"])
    spans = plan.spans()
    assert {s.rank for s in spans} == set(range(4)) and all(isinstance(s, Span) for s in spans)
    # issue 15: placement, the best all-offloaded plan, what DDP buys, scaling, the rank rule
    assert len(plan.resident_blocks) == p["resident_blocks"]
    assert {b["placement"] for b in d["blocks"]} <= {"host", "resident"}
    assert d["baselines"]["offloaded"]["resident_blocks"] == 0
    assert p["memory"]["gpu_headroom_bytes"] == p["memory"]["gpu_usable_bytes"] - p["gpu_mem_bytes"]
    assert d["notes"]["ddp"].startswith("ZO-DDP raises the batch per perturbation")
    assert d["scaling"]["nodes"] == 1 and d["scaling"]["efficiency"] == 1.0
    assert d["ranks"] == {"rule": "layout", "exceptions": []}
    assert plan.ranks == plan.layout.rank_table()
    assert d["search"]["used_gpus"] <= d["search"]["gpus"] == 4


def test_plan_round_trips_byte_for_byte(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again.to_json() == plan.to_json() == path.read_text()
    assert again.layout == plan.layout and again.workload == plan.workload


def test_plan_matches_the_golden_file(plan):
    if os.environ.get("ZOPLAN_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(plan.to_json())
    assert plan.to_json() == GOLDEN.read_text(), \
        "plan changed: if intended, regenerate with ZOPLAN_UPDATE_GOLDEN=1"


def test_same_inputs_same_bytes_whatever_the_hash_seed(plan, tmp_path):
    assert small_plan().to_json() == plan.to_json()
    output = tmp_path / "plan.json"
    code = ("import sys; from zoplan.search import optimize\n"
            f"plan = optimize(model='tiny-opt', gpus=4, profile={str(PROFILE)!r}, batch=8, "
            f"seq=64, output={str(output)!r})\n"
            "sys.stdout.write(plan.to_json())\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout == plan.to_json()


def test_the_schema_reads_the_versions_the_constant_names():
    from typing import get_args

    from zoplan import plan
    annotation = plan.PlanSchema.model_fields["schema_version"].annotation
    assert get_args(annotation) == plan.READABLE_VERSIONS
