"""Non-finite inputs and settings that do nothing, named for what they are, before
anything is written (issue 41): a NaN weight in the model folder (run and eval name
the tensor and its file), a first step whose loss is not finite (undone whole: no
run.json left, the same command can run again), --eps so small that theta + eps z
rounds back to theta (refused before the first step)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import make_model_dir  # noqa: E402

NAN_TENSOR = "model.decoder.layers.1.fc1.weight"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("nonfinite")
    plan = where / "plan.json"
    hand_plan(model="tiny-opt", layout=Layout(),
              workload=Workload(batch=1, seq=8, param_dtype="fp32", compute_dtype="fp32")).save(plan)
    good = make_model_dir(where / "model", seed=3)
    nan = make_model_dir(where / "nan-model", seed=3)
    tensors = load_file(str(nan / "model.safetensors"))
    names = sorted(tensors)
    name = NAN_TENSOR if NAN_TENSOR in tensors else names[len(names) // 2]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[7] = float("nan")
    save_file(tensors, str(nan / "model.safetensors"), metadata={"format": "pt"})
    data = where / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [4 + (i * 7 + j) % 300 for j in range(20)]}) + "\n"
                            for i in range(8)))
    return {"where": where, "plan": plan, "good": good, "nan": nan, "nan_tensor": name, "data": data}


def _invoke(*args) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.exit_code, lines, f"exit {result.exit_code}: {result.stderr} {result.exception!r}"


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_nan_weight_is_named_with_its_file_and_nothing_is_written(world, command, tmp_path):
    """Before: run stopped at "step 0: the loss is not finite ... (no --out: nothing
    saved)" and left run.json; eval blamed the data ("no token to score")."""
    out = tmp_path / "out"
    if command == "run":
        code, lines, shown = _invoke("run", world["plan"], "--model-path", world["nan"], "--data",
                                     world["data"], "--steps", 2, "--out", out, "--threads", 1, "-q")
    else:
        code, lines, shown = _invoke("eval", world["nan"], "--data", world["data"], "--seq", 8,
                                     "--threads", 1)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: checkpoint "), shown
    assert f"tensor {world['nan_tensor']} holds 1 NaN value" in lines[0], shown
    assert "model.safetensors" in lines[0] and not out.exists(), shown


def test_a_non_finite_first_step_is_undone_whole(world, tmp_path):
    """--eps 1e30 overflows the perturbed weights: the first loss is not finite. The
    new run's folder goes (before: run.json and a log line stayed, so the same command
    was refused and every --resume failed the same way)."""
    out = tmp_path / "out"
    args = ("run", world["plan"], "--model-path", world["good"], "--data", world["data"],
            "--steps", 2, "--eps", 1e30, "--out", out, "--threads", 1, "-q")
    for _ in range(2):   # the same command twice: the same line, not "holds a run"
        code, lines, shown = _invoke(*args)
        assert code == 1 and len(lines) == 1, shown
        assert lines[0].startswith("error: step 1: the loss is not finite"), shown
        assert f"nothing trained: {out} is removed again" in lines[0] and not out.exists(), shown


@pytest.mark.parametrize("flag,starts,words", [
    ("--eps", "error: --eps 1e-30 vanishes in the model's fp32 weights", ("give --eps",)),
    ("--lr", "error: --lr 1e-30 vanishes in the model's weights",
     ("rounded to nearest in fp32", "give --lr"))])
def test_an_eps_or_lr_that_vanishes_in_the_weights_precision_is_refused(world, tmp_path, flag,
                                                                         starts, words):
    """Before: --eps 1e-30 (or --lr 1e-30) ran to the end, "done", rc 0, final/ the
    input weights."""
    out = tmp_path / "out"
    code, lines, shown = _invoke("run", world["plan"], "--model-path", world["good"], "--data",
                                 world["data"], "--steps", 2, flag, 1e-30, "--out", out,
                                 "--threads", 1, "-q")
    assert code == 2 and len(lines) == 1 and lines[0].startswith(starts), shown
    assert all(w in lines[0] for w in words) and not out.exists(), shown


def test_the_vanishing_rule_in_each_precision():
    from zoexec.launch.noop import vanishing_eps

    weights = torch.full((1000,), 0.02, dtype=torch.float64)   # half an ulp: 2^-30 in fp32
    assert vanishing_eps(1e-3, weights, torch.float32) is None
    assert vanishing_eps(1e-12, weights, torch.float32) is not None
    assert vanishing_eps(1e-6, weights, torch.float32) is None
    assert vanishing_eps(1e-6, weights, torch.bfloat16) is not None   # half an ulp: 2^-14
    assert vanishing_eps(1e-30, torch.zeros(10, dtype=torch.float64), torch.float32) is None


def test_an_infinite_weight_is_named_as_read():
    from zoexec.store.loading import check_finite
    from zoplan.errors import ZoError

    weights = torch.ones(4, 4)
    weights[1, 2] = float("inf")
    with pytest.raises(ZoError, match=r"checkpoint m/w.safetensors: tensor t holds 1 infinite "
                                      r"value \(of 16\)"):
        check_finite(weights, name="t", path=Path("m/w.safetensors"))
