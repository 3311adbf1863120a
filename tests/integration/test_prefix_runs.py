"""Prefix-tuning runs on the CPU with gloo: a layout of PertP 2 with resident sliced
blocks trains the same prefixes as one rank, bit for bit; nothing is written back;
final/ is a PEFT prefix folder; a killed run resumes to the same prefixes; on a model
folder with a tokenizer, `zoexec eval final/` gives the run's last evaluation, and
export --merge says a prefix has nothing to merge."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.options import build_config
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from frozen_base import killed_and_resumed, layout_runs, losses  # noqa: E402

MODEL, SEED, STEPS, LR, EPS = "tiny-opt", 3, 3, 1e-2, 1e-1
WORKLOAD = Workload.for_prefix(batch=4, seq=16, compute_dtype="fp32")
LAYOUTS = {"one": (Layout(), ()), "pertp2-s2-resident": (Layout(pertp=2, slices=2, prefetch=1), (1, 2))}


SETTINGS = dict(model=MODEL, workload=WORKLOAD, steps=STEPS, seed=SEED, lr=LR, eps=EPS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return layout_runs(tmp_path_factory.mktemp("prefix"), LAYOUTS, **SETTINGS)


def test_pertp2_with_resident_slices_trains_the_prefixes_of_one_rank(runs):
    one, other = runs["one"], runs["pertp2-s2-resident"]
    for a, b in zip(one["losses"], other["losses"], strict=True):
        assert (a["loss_plus"], a["loss_minus"], a["g"]) == (b["loss_plus"], b["loss_minus"], b["g"])
    assert one["losses"][0]["loss_plus"] != one["losses"][0]["loss_minus"]   # eps moved the loss
    table = one["weights"]["prompt_embeddings"]
    assert table.shape == (5, get_model(MODEL).num_layers * 2 * get_model(MODEL).kv_dim)
    assert (table == other["weights"]["prompt_embeddings"]).all()
    for run in runs.values():
        kinds = {s.kind for s in run["trace"][1]}
        assert "d2h" not in kinds and {"update", "forward", "head"} <= kinds
    config = json.loads((one["final"] / "adapter_config.json").read_text())
    assert (config["peft_type"], config["num_virtual_tokens"]) == ("PREFIX_TUNING", 5)


def test_a_killed_prefix_run_resumes_to_the_same_prefixes(runs, tmp_path):
    killed_and_resumed(tmp_path, model=MODEL, workload=WORKLOAD, steps=STEPS, seed=SEED,
                       lr=LR, eps=EPS)
    out = tmp_path / "out"
    got = load_file(str(out / "final" / "adapter_model.safetensors"))["prompt_embeddings"]
    assert (got == runs["one"]["weights"]["prompt_embeddings"]).all()
    assert [r["g"] for r in losses(out)] == [r["g"] for r in runs["one"]["losses"]]


def test_a_prefix_run_of_a_model_folder_evaluates_and_loads(tmp_path):
    """`zoexec eval final/` (the base from adapter_config.json) gives the run's last
    evaluation; final/ has the tokenizer; export --merge refuses in one line."""
    from frozen_base import micro_task
    from transformers import AutoTokenizer

    micro = micro_task(tmp_path, Workload.for_prefix(batch=8, seq=48, compute_dtype="fp32"))
    base, test, task = micro.base, micro.test, micro.task
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", str(micro.plan), "--model-path", str(base), "--data", str(micro.train), *task,
        "--eval-data", str(test),
        "--steps", "4", "--lr", "1e-2", "--eps", "1e-1", "--out", str(out), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "load: PeftModel.from_pretrained(" in result.output
    assert AutoTokenizer.from_pretrained(out / "final")("It was great")["input_ids"]
    last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
            if "eval_loss" in x][-1]
    result = CliRunner().invoke(app, ["eval", str(out / "final"), "--data", str(test), *task,
                                      "--batch", "8", "--seq", "48", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output.strip().splitlines()[-1])
    assert shown["eval_accuracy"] == last["eval_accuracy"]
    assert shown["eval_loss"] == pytest.approx(last["eval_loss"], rel=1e-6)
    accuracy, loss = _peft_metrics(base, out / "final", test)   # PEFT's own prefix forward
    assert shown["eval_accuracy"] == accuracy and shown["eval_loss"] == pytest.approx(loss, rel=1e-5)
    result = CliRunner().invoke(app, ["export", "--merge", str(out / "final"), "--base", str(base),
                                      "-o", str(tmp_path / "merged")])
    assert result.exit_code == 2 and "a prefix has no weights to merge" in result.output


def _peft_metrics(base: Path, final: Path, data: Path) -> tuple[float, float]:
    """Accuracy and the candidate loss of PeftModel.from_pretrained(base, final), one
    example a forward: the label words' log-probabilities at the prompt's last token."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(final)).eval()
    tok = AutoTokenizer.from_pretrained(final)
    words = [tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in ("terrible", "great")]
    right, loss = 0, 0.0
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    with torch.no_grad():
        for row in rows:
            prompt = tok(row["sentence"] + " It was")["input_ids"]
            logp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1)
            scores = torch.stack([logp[w] for w in words])
            right += int(scores[1] > scores[0]) == row["label"]
            loss -= float(torch.log_softmax(scores, -1)[row["label"]])
    return right / len(rows), loss / len(rows)


def test_a_prefix_option_that_is_not_the_plans_is_refused(tmp_path):
    from zoplan.errors import ZoError

    hand_plan(model=MODEL, layout=Layout(), workload=WORKLOAD).save(tmp_path / "plan.json")
    with pytest.raises(ZoError, match="--prefix-tokens 4: must be 5, the plan's"):
        build_config(plan=tmp_path / "plan.json", prefix_tokens=4)
    with pytest.raises(ZoError, match="--tuning lora: must be prefix, the plan's"):
        build_config(plan=tmp_path / "plan.json", tuning="lora")
