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
    """Accuracy and eval_loss of the label words with a plain transformers forward."""
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
            scores = [float(logp[w[0]]) for w in words]
            right += int(scores[1] > scores[0]) == row["label"]
            loss -= scores[row["label"]]
    return right / len(rows), loss / len(rows)


def test_eval_during_a_run_is_the_same_on_one_rank_pertp2_and_ddp2(tmp_path, model):
    test = tmp_path / "test.jsonl"      # 40 of the held-out examples: 80 rows to score
    test.write_text("".join(TEST.read_text().splitlines(keepends=True)[:40]))
    outs = {}
    for layout in (Layout(), Layout(pertp=2), Layout(ddp=2)):
        out = tmp_path / f"run-{layout.world_size}{layout.pertp}"
        result = CliRunner().invoke(app, ["run", str(_plan(tmp_path, model, layout)),
                                          "--model-path", str(model), "--data", str(TRAIN),
                                          *TASK, "--eval-data", str(test), "--eval-every", "3",
                                          "--steps", "6", "--lr", "1e-3", "--out", str(out),
                                          "--threads", "1", "-q"])
        assert result.exit_code == 0, result.output
        outs[layout.label()] = _evals(out)
    one, *others = outs.values()
    assert [r["step"] for r in one] == [3, 6]
    for other in others:
        assert [r["step"] for r in other] == [3, 6]
        for a, b in zip(one, other):
            assert set(a) >= {"eval_loss", "eval_accuracy", "eval_f1"}
            assert a["eval_accuracy"] == b["eval_accuracy"] and a["eval_f1"] == b["eval_f1"]
            assert math.isclose(a["eval_loss"], b["eval_loss"], rel_tol=1e-9)
    # zoexec eval of final/ gives the run's last evaluation, and a plain forward agrees
    final = tmp_path / "run-11" / "final"
    result = CliRunner().invoke(app, ["eval", str(final), "--data", str(test), *TASK, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output.strip().splitlines()[-1])
    assert shown["eval_accuracy"] == one[-1]["eval_accuracy"]
    assert math.isclose(shown["eval_loss"], one[-1]["eval_loss"], rel_tol=1e-6)
    accuracy, loss = _hand_metrics(final, test)
    assert shown["eval_accuracy"] == accuracy and math.isclose(shown["eval_loss"], loss, rel_tol=1e-6)


@pytest.mark.parametrize("args,message", [
    (["{tmp}/none", "--data", str(TEST)], "is not a model folder"),
    (["{model}", "--data", "{tmp}/none.jsonl"], "does not exist"),
    (["{model}", "--data", str(TEST), "--task", "classification", "--template", "{review} It was",
      "--label-words", "terrible,great"], "no column 'review'"),
    (["{model}", "--data", str(TEST), "--task", "classification", "--template", "{sentence}",
      "--label-words", "terrible,splendid"], "label word 'splendid' is not in the tokenizer"),
    (["{model}", "--data", "{tmp}/empty.jsonl", "--task", "completion"], "holds no rows"),
])
def test_eval_bad_input_is_one_error_line(tmp_path, model, args, message):
    (tmp_path / "empty.jsonl").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(model)) for a in args]
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
