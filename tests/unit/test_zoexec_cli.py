"""`zoexec run` from the command line: bad input is one red line, exit code 2, no output
written (a good plan's run is in tests/integration/test_zoexec_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.options import build_config
from zoplan.execrules import STEADY_RUN_S, TRACE_RUN_S
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

WORKLOAD = Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32")
runner = CliRunner()


def _plan(tmp_path, layout=Layout(), *, device_kind="cpu", **predicted) -> str:
    plan = hand_plan(model="tiny-opt", layout=layout, workload=WORKLOAD, device_kind=device_kind)
    plan.data["predicted"].update(predicted)
    path = tmp_path / "plan.json"
    plan.save(path)
    return str(path)


def _fails(args, tmp_path, *, match: str) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", *args, "--out", str(out)])
    text = result.output.strip()
    assert result.exit_code == 2, text
    assert text.startswith("error:") and "\n" not in text and "Traceback" not in text, text
    assert match in text, text
    assert not out.exists()


def test_missing_plan(tmp_path):
    _fails([str(tmp_path / "nope.json")], tmp_path, match="does not exist")


@pytest.mark.parametrize("content,match", [("{not json", "not valid JSON"),
                                           ('{"schema_version": 1}', "missing key"),
                                           ('[1, 2]', "not a JSON object")])
def test_malformed_plan(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    _fails([str(path)], tmp_path, match=match)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_plan_on_a_cpu_machine(tmp_path):
    _fails([_plan(tmp_path, device_kind="cuda")], tmp_path, match="CUDA GPU(s) per node")


def test_model_path_without_config(tmp_path):
    (tmp_path / "model").mkdir()
    _fails([_plan(tmp_path), "--model-path", str(tmp_path / "model")], tmp_path,
           match="has no config.json")


def test_model_path_and_init_together(tmp_path):
    _fails([_plan(tmp_path), "--model-path", str(tmp_path), "--init", "random"], tmp_path,
           match="not both")


def test_plan_needing_more_host_memory_than_there_is(tmp_path):
    _fails([_plan(tmp_path, host_mem_bytes=2**60)], tmp_path, match="GiB of host memory")


def test_missing_data_file(tmp_path):
    _fails([_plan(tmp_path), "--data", str(tmp_path / "none.jsonl")], tmp_path,
           match="does not exist")


def test_world_size_mismatch_under_torchrun(tmp_path, monkeypatch):
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3",
                       "LOCAL_WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(key, value)
    _fails([_plan(tmp_path, Layout(pertp=2))], tmp_path, match="torchrun started 3 ranks")


def test_a_trace_without_steps_runs_25_seconds_of_predicted_steps(tmp_path):
    def steps(trace, step_s):
        path = Path(_plan(tmp_path, step_time_s=step_s))
        return build_config(plan=path, seed=0, lr=1e-6, eps=1e-3, weight_decay=0.0,
                            trace=str(tmp_path / "t") if trace else None,
                            quiet=True).optim.steps
    assert steps(False, 0.1) == 10       # untraced: 10 steps
    assert steps(True, 0.1) == 251       # 25 s of 0.1 s steps, + the step calibrate skips
    assert steps(True, 0.3) == 85        # ceil(25 / 0.3) + 1
    assert steps(True, 5.0) == 10        # never fewer than untraced
    assert TRACE_RUN_S >= STEADY_RUN_S   # a traced run is long enough for calibrate
