"""Tasks and evaluation end to end: `zoexec run` on the shipped classification example
with --eval-data reports eval_loss/eval_accuracy/eval_f1 in metrics.jsonl, the same on
one rank and on PertP 2; `zoexec eval` scores a saved model folder (the base and a
run's final/) as a plain transformers forward does; bad input is one error line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from make_model import make_model  # noqa: E402

TRAIN, TEST = ROOT / "examples/sentiment/train.jsonl", ROOT / "examples/sentiment/test.jsonl"
TASK = ["--task", "classification", "--template", "{sentence} It was",
        "--label-words", "terrible,great"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("m") / "micro", size="micro", seed=0)


def _plan(tmp: Path, model: Path, layout: Layout) -> Path:
    path = tmp / f"plan-{layout.label().replace(' ', '_')}.json"
    hand_plan(model=get_model(str(model)), layout=layout,
              workload=Workload(batch=16, seq=48, param_dtype="fp32", compute_dtype="fp32")).save(path)
    return path


def _evals(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_loss" in r]


def _hand_metrics(model: Path, data: Path) -> tuple[float, float]:
    """Accuracy and eval_loss (the candidate loss: the label word's cross-entropy among
    the two label words' logits) with a plain transformers forward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(model).eval()
    tok = AutoTokenizer.from_pretrained(model)
    words = [tok(" " + w, add_special_tokens=False)["input_ids"] for w in ("terrible", "great")]
    right, loss = 0, 0.0
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    with torch.no_grad():
        for row in rows:
            prompt = tok(row["sentence"] + " It was")["input_ids"]
            logp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1)
            scores = torch.tensor([float(logp[w[0]]) for w in words], dtype=torch.float64)
            right += int(scores[1] > scores[0]) == row["label"]
            loss -= float(torch.log_softmax(scores, -1)[row["label"]])
    return right / len(rows), loss / len(rows)


def _losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def test_eval_during_a_run_is_the_same_on_one_rank_pertp2_and_ddp2(tmp_path, model):
    """The candidate loss (the default) trains alike on every layout (losses to float
    summation order with DDP), the learning rate decaying linearly (each rank's schedule
    the same), evaluations agree, best/ holds the chosen evaluation's weights."""
    test = tmp_path / "test.jsonl"      # 40 of the held-out examples: one row each
    test.write_text("".join(TEST.read_text().splitlines(keepends=True)[:40]))
    outs, losses = {}, {}
    for layout in (Layout(), Layout(pertp=2), Layout(ddp=2)):
        out = tmp_path / f"run-{layout.world_size}{layout.pertp}"
        result = CliRunner().invoke(app, ["run", str(_plan(tmp_path, model, layout)),
                                          "--model-path", str(model), "--data", str(TRAIN),
                                          *TASK, "--eval-data", str(test), "--eval-every", "2",
                                          "--steps", "6", "--lr", "1e-3",
                                          "--lr-schedule", "linear", "--out", str(out),
                                          "--save-best", "eval_loss:max",
                                          "--threads", "1", "-q"])
        assert result.exit_code == 0, result.output
        outs[layout.label()], losses[layout.label()] = _evals(out), _losses(out)
    one, *others = outs.values()
    assert [r["step"] for r in one] == [2, 4, 6]
    for other in others:
        assert [r["step"] for r in other] == [2, 4, 6]
        for a, b in zip(one, other):
            assert set(a) >= {"eval_loss", "eval_accuracy", "eval_f1"}
            assert a["eval_accuracy"] == b["eval_accuracy"] and a["eval_f1"] == b["eval_f1"]
            assert math.isclose(a["eval_loss"], b["eval_loss"], rel_tol=1e-6)
    first, *rest = losses.values()
    for other in rest:
        for a, b in zip(first, other, strict=True):
            for key in ("loss_plus", "loss_minus"):
                assert math.isclose(a[key], b[key], rel_tol=1e-6), (key, a, b)
    _check_best(tmp_path / "run-11", one, test)
    # zoexec eval of final/ gives the run's last evaluation, and a plain forward agrees
    final = tmp_path / "run-11" / "final"
    result = CliRunner().invoke(app, ["eval", str(final), "--data", str(test), *TASK, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output.strip().splitlines()[-1])
    assert shown["eval_accuracy"] == one[-1]["eval_accuracy"]
    assert math.isclose(shown["eval_loss"], one[-1]["eval_loss"], rel_tol=1e-6)
    accuracy, loss = _hand_metrics(final, test)
    assert shown["eval_accuracy"] == accuracy and math.isclose(shown["eval_loss"], loss, rel_tol=1e-6)


def _check_best(out: Path, evals: list[dict], test: Path) -> None:
    """best/ is the step of the highest eval_loss (--save-best eval_loss:max: not the
    last evaluation, as the loss falls), reloads, and scores that evaluation."""
    best = max(evals, key=lambda r: r["eval_loss"])
    assert best is not evals[-1]
    state = json.loads((out / "best" / "state.json").read_text())
    assert (state["global_step"], state["metric"]) == (best["step"], "eval_loss")
    assert math.isclose(state["value"], best["eval_loss"], rel_tol=1e-12)
    result = CliRunner().invoke(app, ["eval", str(out / "best"), "--data", str(test), *TASK, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output.strip().splitlines()[-1])
    assert math.isclose(shown["eval_loss"], best["eval_loss"], rel_tol=1e-6)
    assert shown["eval_accuracy"] == best["eval_accuracy"]


def test_eval_samples_scores_a_fixed_subset_in_run_and_eval(tmp_path, model):
    """--eval-samples 10: zoexec eval twice gives the same figures, those of a file
    holding the same ten examples; the run's evaluation of the base model (--steps 1
    with lr 0 leaves it as it is) equals zoexec eval's."""
    from zoexec.data.choices import subset

    lines = TEST.read_text().splitlines(keepends=True)
    ten = tmp_path / "ten.jsonl"
    ten.write_text("".join(lines[i] for i in subset(len(lines), 10)))
    shown = []
    for data, extra in ((TEST, ["--eval-samples", "10"]), (TEST, ["--eval-samples", "10"]), (ten, [])):
        result = CliRunner().invoke(app, ["eval", str(model), "--data", str(data), *TASK, *extra, "--json"])
        assert result.exit_code == 0, result.output
        shown.append({k: v for k, v in json.loads(result.output.strip().splitlines()[-1]).items()
                      if k.startswith("eval_")})
    assert shown[0] == shown[1] and shown[0] == pytest.approx(shown[2], rel=1e-9)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(_plan(tmp_path, model, Layout())), "--model-path",
                                      str(model), "--data", str(TRAIN), *TASK, "--eval-data", str(TEST),
                                      "--eval-samples", "10", "--steps", "1", "--lr", "0",
                                      "--out", str(out), "--threads", "1", "-q"])
    assert result.exit_code == 0, result.output
    run = {k: v for k, v in _evals(out)[0].items() if k.startswith("eval_")}
    assert run == pytest.approx(shown[0], rel=1e-6)


@pytest.mark.parametrize("mode", ["stop", "warn"])
def test_a_climbing_loss_stops_the_run_or_warns(tmp_path, model, mode):
    """lr 1 on the micro model: the candidate loss climbs from 0.70 by orders of magnitude
    in three steps (and is not finite by step 5). With a window of 4 the rule fires at
    step 4: by default the run stops there (exit 1, a snapshot after step 4, one error
    line); with warn it says so once and ends (5 steps: before the loss overflows)."""
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(_plan(tmp_path, model, Layout())),
                                      "--model-path", str(model), "--data", str(TRAIN), *TASK,
                                      "--steps", "5", "--lr", "1", "--divergence-window", "4",
                                      *(["--on-divergence", "warn"] if mode == "warn" else []),
                                      "--out", str(out), "--threads", "1", "-q"])
    text = result.output.strip()
    assert "Traceback" not in text and text.count("the loss is climbing") == 1, text
    if mode == "warn":
        assert result.exit_code == 0 and text.startswith("zoexec: warning: step 4:"), text
        assert len(_losses(out)) == 5 and (out / "final").is_dir()
        return
    assert result.exit_code == 1 and text.startswith("error: step 4:") and "\n" not in text, text
    assert "lower --lr (now 1)" in text and "snapshots/checkpoint-4" in text
    assert len(_losses(out)) == 4 and (out / "snapshots" / "checkpoint-4" / "state.json").is_file()
    assert not (out / "final").exists()


@pytest.mark.parametrize("args,message", [
    (["{tmp}/none", "--data", str(TEST)], "none does not exist"),
    (["{model}", "--data", "{tmp}/none.jsonl"], "does not exist"),
    (["{model}", "--data", str(TEST), "--task", "classification", "--template", "{review} It was",
      "--label-words", "terrible,great"], "no column 'review'"),
    (["{model}", "--data", str(TEST), "--task", "classification", "--template", "{sentence}",
      "--label-words", "terrible,splendid"], "label word 'splendid' is not in the tokenizer"),
    (["{model}", "--data", "{tmp}/empty.jsonl", "--task", "completion"], "holds no rows"),
    (["{model}", "--data", str(TEST), *TASK, "--demonstrations", "2"],
     "--demonstrations 2 needs --demonstrations-data FILE, the training file"),
    (["{model}", "--data", str(TEST), "--demonstrations-in-training"], "No such option"),
])
def test_eval_bad_input_is_one_error_line(tmp_path, model, args, message):
    (tmp_path / "empty.jsonl").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(model)) for a in args]
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
