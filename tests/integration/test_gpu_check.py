"""scripts/gpu_check.py's dry run on the CPU (what CI can run of the GPU check): two
update modes (each a subprocess run; the third is the same path) are planned, run,
calibrated and summarised, with the figures the GPU run
reports; the first mode's plan with resident blocks computes the same losses, and the
update on the slice gives the whole block's bits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path):
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"),
                           "--device-kind", "cpu", "--model", "tiny-opt", "--profile", "cpu",
                           "--precision", "bf16", "--batch", "2", "--seq", "32", "--steps", "3",
                           "--modes", "master,plain",
                           "--results", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [m["update"] for m in summary["modes"]] == ["master", "plain"]
    for mode in summary["modes"]:
        assert mode["step_time_s"] > 0 and mode["predicted_step_time_s"] > 0
        assert mode["tokens_per_s"] > 0 and mode["predicted_gpu_mem_gib"] > 0
        assert mode["workload"]["update"] == mode["update"]
        assert 0 <= mode["first_update_lost_share"] <= 1
        assert (out / mode["update"] / "calibrate.log").read_text().count("step time:") == 1
    plain = summary["modes"][1]
    assert plain["first_update_lost_share"] > summary["modes"][0]["first_update_lost_share"]
    assert summary["z"]["draw_calls"] > 0 and summary["z"]["z_s_per_block"] > 0
    resident = summary["resident"]
    assert resident["same_losses"] and resident["resident_blocks"] == 2, resident
    assert (out / "resident" / "trace").is_dir()
    assert all(c["same_bits"] for c in summary["slice_update"]["slices"].values())
    text = (out / "summary.txt").read_text()
    assert "z per block" in text and text.count("tokens/s") == 2
    assert "losses the same bits" in text and text.count("the whole block's bits") == 2
