"""Plans on CPU profiles are byte-identical to their golden files: the shipped guess,
a profile of the one figure compute.zo_ns_per_param, and one with every figure a
`zoplan profile` run measures (the z model, attention, element-wise work, rank
scalings and jitter), full and LoRA, fp32 and stochastic rounding, OPT and Llama.

The golden files were written by the planner before the cost terms moved into
zoplan.pricing (issue 27): the move changed no CPU plan by a byte. A change to a CPU
cost term on purpose regenerates them with
    ZOPLAN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_cpu_golden_plans.py
and says which term changed and why in its commit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zoplan.search import build_plan, resolve_request, search

TESTS = Path(__file__).resolve().parents[1]
MEASURED = "tests/fixtures/cpu-measured4.json"
CASES = {
    "cpu-tiny-opt-2": dict(model="tiny-opt", gpus=2, profile="cpu", batch=8, seq=64),
    "cpu4-tiny-llama-4": dict(model="tiny-llama", gpus=4, profile="tests/fixtures/cpu4.json",
                              batch=8, seq=64),
    "measured-tiny-opt-4": dict(model="tiny-opt", gpus=4, profile=MEASURED, batch=8, seq=64),
    "measured-tiny-llama-2-sr": dict(model="tiny-llama", gpus=2, profile=MEASURED, batch=4,
                                     seq=64, precision="bf16", update="stochastic"),
    "measured-tiny-opt-2-lora": dict(model="tiny-opt", gpus=2, profile=MEASURED, batch=4,
                                     seq=64, tuning="lora"),
}


def plan_json(case: dict) -> str:
    args = dict(case)
    if args["profile"].startswith("tests/"):
        args["profile"] = str(TESTS.parent / args["profile"])
    return build_plan(search(resolve_request(**args))).to_json()


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_plan_matches_its_golden_file(name):
    golden = TESTS / "golden" / f"{name}.plan.json"
    text = plan_json(CASES[name])
    if os.environ.get("ZOPLAN_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), \
        f"the CPU plan {name} changed: if on purpose, regenerate with ZOPLAN_UPDATE_GOLDEN=1"
