"""Multiple choice and generation end to end on a tiny model: `zoexec run` with the copa
and squad presets gives the same losses, weights and evaluation metrics on one rank,
PertP 2 and DDP 2; greedy decoding through the block pipeline (`zoexec eval`, with a
demonstration) generates what transformers' own greedy `generate` does from the same
prompts, so exact match and F1 come out as computed by hand.

Tolerances as tests/integration/test_zoexec_layouts.py: PertP runs the same ops on the
same rows as one rank (bit-identical); DDP sums per-shard losses (float32 summation
order, amplified by 1/(2 eps) in g)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.data.generation import answer_scores
from zoexec.data.presets import with_preset
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_eval_set
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import make_model_dir, words_in  # noqa: E402

LAYOUTS = {"one": Layout(), "pertp2": Layout(pertp=2), "ddp2": Layout(ddp=2)}
LOSS_RTOL, G_ATOL, W_ATOL = 1e-5, 5e-3, 5e-5
PEOPLE = ("Ann", "Bob", "Cid", "Dee")
COPA = [{"premise": f"{p} was tired.", "choice1": f"{p} slept early.", "choice2": f"{p} ran far.",
         "question": ("cause", "effect")[i % 2], "label": i % 2} for i, p in enumerate(PEOPLE * 2)]
SQUAD = [{"title": p, "context": f"{p} lives in Rome.", "question": f"Where does {p} live?",
          "answers": {"text": ["Rome", "in Rome"], "answer_start": [0, 0]}} for p in PEOPLE * 2]
TEMPLATE_WORDS = "because so Title Context Question Answer : Rome in nothing"
LR = {"copa": "1e-3", "squad": "1e-6"}   # squad: small steps keep the base model's answers


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tasktypes")
    texts = [v for r in COPA + SQUAD for v in r.values() if isinstance(v, str)] + [TEMPLATE_WORDS]
    words = words_in(texts)   # then fillers: every id the model may generate is a word
    words += [f"w{i}" for i in range(get_model("tiny-opt").vocab - 4 - len(words))]
    model = make_model_dir(tmp / "model", model="tiny-opt", words=words)
    for name, rows in (("copa", COPA), ("squad", SQUAD)):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "squad-test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _greedy_golds(model, tmp)))
    return tmp, model


def _hf_greedy(model: Path, prompts: list[tuple[int, ...]], max_new: int) -> list[str]:
    """transformers' greedy generate from each prompt's ids, the answer text (no EOS)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(model).eval()
    tok = AutoTokenizer.from_pretrained(model)
    out = []
    with torch.no_grad():
        for ids in prompts:
            new = hf.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            out.append(tok.decode(new[0, len(ids):], skip_special_tokens=True).strip())
    return out


def _greedy_golds(model: Path, tmp: Path) -> list[dict]:
    """SQuAD rows whose golds are the base model's own greedy answers for rows 0-3 and
    a word it does not say for rows 4-7: the runs' eval_exact_match is then near 0.5."""
    spec = TaskOptions(**with_preset({"task_preset": "squad"}), max_new_tokens=4)
    evals = make_eval_set(tmp / "squad.jsonl", spec, vocab=get_model(str(model)).vocab, seq=48,
                          tokenizer_dir=model)
    said = _hf_greedy(model, evals.decoding.prompts, 4)
    return [{**row, "answers": {"text": [said[i] if i < 4 and said[i] else "nothing"]}}
            for i, row in enumerate(SQUAD)]


def _run(tmp: Path, model: Path, name: str, preset: str, layout: Layout) -> dict:
    plan = tmp / f"plan-{name}-{preset}.json"
    hand_plan(model=get_model(str(model)), layout=layout,
              workload=Workload(batch=4, seq=48, param_dtype="fp32", compute_dtype="fp32")).save(plan)
    out = tmp / f"run-{name}-{preset}"
    test = tmp / ("squad-test.jsonl" if preset == "squad" else "copa.jsonl")
    result = CliRunner().invoke(app, ["run", str(plan), "--model-path", str(model),
                                      "--data", str(tmp / f"{preset}.jsonl"), "--task-preset", preset,
                                      "--eval-data", str(test),
                                      *(["--max-new-tokens", "4"] if preset == "squad" else []),
                                      "--steps", "3", "--lr", LR[preset], "--out", str(out),
                                      "--threads", "1", "-q"])
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"losses": [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()],
            "weights": load_file(str(out / "final" / "model.safetensors")),
            "evals": [m for m in metrics if "eval_loss" in m]}


@pytest.mark.parametrize("preset,metrics", [
    ("copa", ("eval_accuracy", "eval_accuracy_norm")),
    ("squad", ("eval_exact_match", "eval_f1")),
])
def test_a_task_type_is_the_same_on_one_rank_pertp2_and_ddp2(setup, preset, metrics):
    tmp, model = setup
    runs = {name: _run(tmp, model, name, preset, layout) for name, layout in LAYOUTS.items()}
    ref = runs["one"]
    assert ref["evals"] and set(metrics) <= set(ref["evals"][-1])
    for name in ("pertp2", "ddp2"):
        got, exact = runs[name], LAYOUTS[name].ddp == 1
        for a, b in zip(ref["losses"], got["losses"], strict=True):
            for key in ("loss_plus", "loss_minus"):
                assert b[key] == pytest.approx(a[key], rel=0 if exact else LOSS_RTOL), (name, key)
            assert b["g"] == pytest.approx(a["g"], abs=0 if exact else G_ATOL)
        for key, tensor in ref["weights"].items():
            torch.testing.assert_close(got["weights"][key], tensor, rtol=0, atol=0 if exact else W_ATOL)
        for a, b in zip(ref["evals"], got["evals"], strict=True):
            assert all(a[k] == b[k] for k in metrics), (name, a, b)
            assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=0 if exact else LOSS_RTOL)
    if preset == "squad":   # the model barely moved: its answers are still the base model's
        assert ref["evals"][-1]["eval_exact_match"] == 0.5


def test_zoexec_eval_generates_what_transformers_generate_does(setup):
    """`zoexec eval` of the base model with one demonstration: its prompts (as the eval set
    builds them) given to transformers' greedy generate give the answers whose exact match
    and F1 against the golds are the numbers zoexec eval prints."""
    tmp, model = setup
    test = tmp / "squad-test.jsonl"
    spec = TaskOptions(**with_preset({"task_preset": "squad"}), max_new_tokens=4, demonstrations=1)
    evals = make_eval_set(test, spec, vocab=get_model(str(model)).vocab, seq=48, tokenizer_dir=model)
    said = _hf_greedy(model, evals.decoding.prompts, 4)
    scores = [answer_scores(s, list(g)) for s, g in zip(said, evals.decoding.golds)]
    result = CliRunner().invoke(app, ["eval", str(model), "--data", str(test), "--task-preset", "squad",
                                      "--max-new-tokens", "4", "--demonstrations", "1", "--seq", "48",
                                      "--demonstrations-data", str(test), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output.strip().splitlines()[-1])
    assert shown["eval_exact_match"] == pytest.approx(sum(s[0] for s in scores) / len(scores))
    assert shown["eval_f1"] == pytest.approx(sum(s[1] for s in scores) / len(scores))


@pytest.mark.parametrize("args,message", [
    (["--task", "multiple-choice", "--template", "{premise}"], "needs --template (the prompt) and"),
    (["--task-preset", "copa", "--choices", "{choice1}"], "give two or more templates"),
    (["--task-preset", "squad", "--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
    (["--task-preset", "mnli"], "--task-preset 'mnli': give one of sst2"),
    (["--task-preset", "rte"], "no column 'hypothesis'"),
])
def test_bad_task_options_are_one_error_line(setup, args, message):
    tmp, model = setup
    result = CliRunner().invoke(app, ["eval", str(model), "--data", str(tmp / "copa.jsonl"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
