"""The CPU paths of scripts/gpu_check.sh's stages that its dry run (test_gpu_check.py)
does not start as children: run-resident, baselines, shared-gpu, staging and slices,
each called here as the stage's child calls it (scripts/gpu_stages.py STAGES[name] with
the child's arguments), its result what the child would write to result.json. What a
child adds, its start-up from the image's python with the carried wheels, its ceiling
and its kill, the dry run shows on the stages it starts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """Each stage's result, run in this process (one module fixture: one forkserver)."""
    sys.path.insert(0, str(REPO / "scripts"))
    patch = pytest.MonkeyPatch()
    patch.setenv("COLUMNS", "120")   # what the in-process CLI sets (scripts/gpu_cli.py)
    try:
        import gpu_stages

        work = tmp_path_factory.mktemp("gpu_stages")
        results = {}
        for name in ("run-resident", "baselines", "shared-gpu", "staging", "slices"):
            folder = work / name
            folder.mkdir()
            args = argparse.Namespace(stage=name, work=work, folder=folder, device_kind="cpu",
                                      steps=3, gpu_kind="h100", hang=False)
            results[name] = {"ok": True, **gpu_stages.STAGES[name](args)}
            # as the child writes it (baselines reads run-resident's)
            (folder / "result.json").write_text(json.dumps(results[name], default=str))
        return results
    finally:
        patch.undo()
        sys.path.remove(str(REPO / "scripts"))


def test_run_resident_runs_its_plan_and_compares_with_the_prediction(stages):
    run = stages["run-resident"]
    assert run["ok"] and run["plans"] == "made now (cpu)"
    assert run["measured_step_s"] > 0 and run["predicted_step_s"] > 0 and len(run["losses"]) == 3
    assert {"forward", "update"} <= set(run["kinds"])


def test_baselines_time_mezo_and_zo2_beside_zoexec(stages):
    base = stages["baselines"]
    assert base["ok"] and base["mezo_step_s"] > 0 and base["zo2_step_s"] > 0
    # the ratio to the run stage that ran before it here (run-offload: the dry run's)
    assert base["zoexec_resident_over_mezo_measured"] > 0
    assert "zoexec_offload_over_zo2_measured" not in base


def test_shared_gpu_two_ranks_give_one_ranks_bits(stages):
    shared = stages["shared-gpu"]
    assert shared["ok"] and shared["pertp2-slices2-update_same_bits"], shared   # its one CPU layout


def test_staging_and_slices_give_the_same_bytes(stages):
    assert stages["staging"]["ok"] and stages["staging"]["ring_bytes_equal"]
    slices = stages["slices"]
    assert slices["ok"] and slices["slices2_same_bits"] and slices["slices8_same_bits"]
