"""`zoplan optimize` through typer's CliRunner: success paths, and failure paths that
exit 2 with exactly one line of error, no traceback and no output file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.plan import Plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NODE4 = str(FIXTURES / "node4-nvswitch.json")
SMALL = ["--model", "tiny-opt", "--gpus", "4", "--batch", "8", "--seq", "64"]


def invoke(*args):
    return CliRunner().invoke(app, ["optimize", *args])


def test_optimize_writes_the_plan_and_shows_the_tables(tmp_path):
    out = tmp_path / "plan.json"
    result = invoke(*SMALL, "--profile", NODE4, "-o", str(out))
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    assert plan.layout.world_size == 4
    assert "winner" in result.output and "ZO2" in result.output and "unsliced" in result.output
    assert plan.data["candidates"][0]["label"] in result.output


def test_default_profile_is_named(tmp_path):
    result = invoke("--model", "opt-1.3b", "--gpus", "2", "-o", str(tmp_path / "p.json"))
    assert result.exit_code == 0, result.output
    assert "dgx-a100-80gb (default profile)" in result.output


def test_json_prints_the_plan_and_quiet_prints_nothing(tmp_path):
    out = tmp_path / "plan.json"
    result = invoke(*SMALL, "--profile", NODE4, "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(out.read_text())
    result = invoke(*SMALL, "--profile", NODE4, "-o", str(out), "-q")
    assert result.exit_code == 0 and result.output == ""


def test_fixed_axes_plan_that_layout(tmp_path):
    out = tmp_path / "plan.json"
    result = invoke(*SMALL, "--profile", NODE4, "-o", str(out), "--pertp", "2", "--slices", "2",
                    "--prefetch", "1", "-q")
    assert result.exit_code == 0, result.output
    layout = Plan.load(out).data["layout"]
    assert {k: layout[k] for k in ("pertp", "nodes", "slices", "prefetch")} == {
        "pertp": 2, "nodes": 1, "slices": 2, "prefetch": 1}
    # tiny-opt's blocks are host-bound (the host lane): 2 GPUs run it as fast as 4
    assert layout["ddp"] in (1, 2)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _negative_bandwidth(tmp_path: Path) -> str:
    data = json.loads(Path(NODE4).read_text())
    data["pcie"]["h2d_gbps"] = -5
    return _write(tmp_path, "negative.json", json.dumps(data))


@pytest.mark.parametrize("case,message", [
    ("unknown-model", "unknown model 'opt-9000'"),
    ("not-divisible", "gpus (6) is not a multiple of the 4 GPUs of a node"),
    ("malformed", "is not valid JSON"),
    ("negative", "pcie.h2d_gbps must be > 0, got -5"),
    ("missing", "unknown profile"),
])
def test_failures_exit_2_with_one_line_and_no_file(tmp_path, case, message):
    profile = {"malformed": lambda: _write(tmp_path, "bad.json", "{not json"),
               "negative": lambda: _negative_bandwidth(tmp_path),
               "missing": lambda: str(tmp_path / "nope.json")}.get(case, lambda: NODE4)()
    model = "opt-9000" if case == "unknown-model" else "tiny-opt"
    gpus = "6" if case == "not-divisible" else "4"
    out = tmp_path / "plan.json"
    result = invoke("--model", model, "--gpus", gpus, "--profile", profile, "--seq", "64",
                    "-o", str(out))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert message in lines[0] and lines[0].startswith("error:")
    assert "Traceback" not in result.output
    assert not out.exists() and list(tmp_path.glob(".plan.json*")) == []


def test_output_that_is_not_a_regular_file_is_refused(tmp_path):
    result = invoke(*SMALL, "--profile", NODE4, "-o", str(tmp_path))
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_console_entry_point_exits_2_with_one_line(tmp_path):
    out = tmp_path / "plan.json"
    run = subprocess.run([sys.executable, "-m", "zoplan.cli", "optimize", "--model", "opt-9000",
                          "--gpus", "1", "-o", str(out)], capture_output=True, text=True)
    assert run.returncode == 2, run
    assert run.stderr.strip().count("\n") == 0 and "unknown model 'opt-9000'" in run.stderr
    assert run.stdout == "" and not out.exists()


@pytest.mark.parametrize("gpus", ["1", "2", "3"])
def test_every_gpu_count_of_a_node_plans_and_reports(tmp_path, gpus):
    # 1 and 3 GPUs admit no PertP pairs: the search leaves pertp 2 out instead of
    # naming a layout of "ddp 0" among the pruned ones
    out = tmp_path / "plan.json"
    result = invoke("--model", "tiny-opt", "--gpus", gpus, "--batch", "6", "--seq", "64",
                    "--profile", NODE4, "-o", str(out))
    assert result.exit_code == 0, result.output
    plan = Plan.load(out)
    assert plan.layout.world_size <= int(gpus)
    fewer = f"uses {plan.layout.world_size} of the {gpus} GPUs given"
    assert (fewer in " ".join(result.output.split())) == (plan.layout.world_size < int(gpus))
    assert all(p["layout"]["ddp"] >= 1 for p in plan.data["pruned"])
