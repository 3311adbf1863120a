"""zoexec.data.tasks: the rows each task builds (what the loss counts), the data formats
read with `datasets`, the evaluation metrics, and the errors that name the problem."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from zoexec.data.batch import IGNORE, Example
from zoexec.data.records import load_records
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_eval_set, make_task_source
from zoexec.data.tasks import EvalSet, pack_examples
from zoexec.data.text import TextData, load_tokenizer
from zoexec.fields import FieldError
from zoexec.model.families import causal_lm_loss_sum, causal_lm_row_losses
from zoplan.errors import ZoError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from make_model import make_tokenizer  # noqa: E402

WORDS = ("is", "the", "opposite", "of", "hot", "cold", "up", "down", "It", "was", "great",
         "terrible", "film", "fine", "dull", ".")
CLS = TaskOptions(name="classification", template="{sentence} It was",
               label_words=("terrible", "great"))


@pytest.fixture
def tok_dir(tmp_path):
    """A word-level tokenizer: <s>=0 <pad>=1 </s>=2 <unk>=3, then WORDS from 4."""
    make_tokenizer(WORDS).save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def _ids(*words):
    return [4 + WORDS.index(w) for w in words]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_no_eos_ends_the_completion_at_its_own_last_token(tmp_path, tok_dir):
    """--no-eos: the row and the loss stop at the completion's last token; run.json
    records it with the task; another task type refuses it."""
    data = _jsonl(tmp_path / "c.jsonl", [{"prompt": "the opposite of hot is", "completion": " cold"}])
    task = TaskOptions(name="completion", no_eos=True)
    batch = make_task_source(data, task, vocab=32, tokenizer_dir=tok_dir).batch(0, 1, 16)
    assert batch.ids[0].tolist() == _ids("the", "opposite", "of", "hot", "is", "cold")
    assert batch.labels[0].tolist() == [IGNORE] * 5 + _ids("cold")
    assert task.record()["no_eos"] is True and TaskOptions.from_record(task.record()) == task
    with pytest.raises(ZoError, match="--no-eos True is one of the options of --task completion"):
        TaskOptions(**{**CLS.record_fields(CLS.record()), "no_eos": True})


def test_completion_loss_counts_only_the_completion_tokens(tmp_path, tok_dir):
    """Against a hand computation: logits chosen per position, the loss is the CE of
    predicting 'cold' and </s> after the prompt, nothing else."""
    data = _jsonl(tmp_path / "c.jsonl", [{"prompt": "the opposite of hot is", "completion": " cold"}])
    source = make_task_source(data, TaskOptions(name="completion"), vocab=32, tokenizer_dir=tok_dir)
    batch = source.batch(0, 2, 16)
    prompt, target = _ids("the", "opposite", "of", "hot", "is"), [*_ids("cold"), 2]
    assert batch.ids[0].tolist() == prompt + target
    assert batch.labels[0].tolist() == [IGNORE] * 5 + target
    logits = torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(0))
    logp = torch.log_softmax(logits.double(), -1)[0]
    hand = -(logp[4, target[0]] + logp[5, target[1]])   # position i predicts token i + 1
    total, count = causal_lm_loss_sum(logits, batch.labels[:1])
    assert count == 2 and math.isclose(float(total), float(hand), rel_tol=1e-6)
    rows = causal_lm_row_losses(logits, batch.labels[:1])
    assert rows[0, 1] == 2 and math.isclose(float(rows[0, 0]), float(hand), rel_tol=1e-6)


def test_rows_are_padded_and_truncated_from_the_prompt(tok_dir):
    long = Example(tuple(range(10, 20)), (7, 8))
    short = Example((5,), (6,))
    batch = pack_examples([long, short], seq=6, pad=1)
    assert batch.ids.tolist() == [[16, 17, 18, 19, 7, 8], [5, 6, 1, 1, 1, 1]]
    assert batch.labels.tolist() == [[IGNORE] * 4 + [7, 8], [IGNORE, 6] + [IGNORE] * 4]
    with pytest.raises(ZoError, match="target of 6 tokens does not fit a sequence of 6"):
        pack_examples([Example((1,), tuple(range(6)))], seq=6, pad=1)


def test_classification_trains_on_the_label_word_and_scores_every_candidate(tmp_path, tok_dir):
    rows = [{"sentence": "the film was fine", "label": 1}, {"sentence": "the film was dull", "label": "terrible"}]
    data = _jsonl(tmp_path / "s.jsonl", rows)
    source = make_task_source(data, CLS, vocab=32, tokenizer_dir=tok_dir, seed=3)
    batch = source.batch(0, 2, 16)
    prompts = {tuple(_ids("the", "film", "was", w, "It", "was")): label
               for w, label in (("fine", "great"), ("dull", "terrible"))}
    for ids, labels in zip(batch.ids.tolist(), batch.labels.tolist()):
        assert tuple(ids[:6]) in prompts and ids[6:] == _ids(prompts[tuple(ids[:6])])
        assert labels == [IGNORE] * 6 + ids[6:]
    again = make_task_source(data, CLS, vocab=32, tokenizer_dir=tok_dir, seed=3).batch(0, 2, 16)
    assert torch.equal(again.ids, batch.ids)
    source.batch(2, 1, 16)
    assert source.epoch_of(2) == pytest.approx(1.5)   # 3 batches of 1 over 2 examples
    evals = make_eval_set(data, CLS, vocab=32, seq=16, tokenizer_dir=tok_dir)
    # single-token label words: one row per example, every candidate scored from it
    assert [ex.target for ex in evals.rows] == [tuple(_ids("great")), tuple(_ids("terrible"))]
    assert evals.tokens == tuple(_ids("terrible", "great")) and evals.labels == [1, 0]


def test_metrics_accuracy_f1_and_loss():
    rows = [Example((1,), (2,))] * 6
    evals = EvalSet(rows=rows, pad=0, groups=[(0, 2, 1), (2, 2, 0), (4, 2, 1)], scored=[1, 2, 5])
    # summed CE per row: example 0 picks 1 (right), 1 picks 1 (wrong), 2 picks 0 (wrong)
    losses = torch.tensor([[3.0, 1], [1.0, 1], [2.0, 1], [0.5, 1], [0.1, 1], [4.0, 1]],
                          dtype=torch.float64)
    out = evals.metrics(losses)
    assert out["eval_accuracy"] == pytest.approx(1 / 3)
    assert out["eval_f1"] == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))     # tp 1, fp 1, fn 1
    assert out["eval_loss"] == pytest.approx((1.0 + 2.0 + 4.0) / 3)
    three = EvalSet(rows=rows[:3], pad=0, groups=[(0, 3, 2)], scored=[2])
    assert "eval_f1" not in three.metrics(losses[:3])


def test_text_packing_never_predicts_across_documents(tmp_path):
    data = _jsonl(tmp_path / "t.jsonl", [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]},
                                         {"input_ids": [10, 11, 12]}])
    text = TextData(data, vocab=32)
    rows = text.rows(4)
    assert rows.ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert rows.labels.tolist() == [[IGNORE, 6, 7, IGNORE], [9, IGNORE, 11, 12]]
    evals = make_eval_set(data, TaskOptions(), vocab=32, seq=6)
    batch = pack_examples(evals.rows, seq=6, pad=0)
    assert batch.ids.tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 0, 0, 0, 0]]
    assert batch.labels.tolist() == [[IGNORE, 6, 7, IGNORE, 9, IGNORE],
                                     [11, 12, IGNORE, IGNORE, IGNORE, IGNORE]]


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json", "disk"])
def test_other_formats_read_with_datasets(tmp_path, tok_dir, suffix):
    import datasets

    rows = [{"prompt": "the opposite of up is", "completion": " down"}] * 3
    table = datasets.Dataset.from_list(rows)
    path = tmp_path / f"d{suffix}"
    if suffix == ".csv":
        table.to_csv(path, index=False)
    elif suffix == ".parquet":
        table.to_parquet(path)
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        table.save_to_disk(path)
    assert load_records(path) == rows
    source = make_task_source(path, TaskOptions(name="completion"), vocab=32, tokenizer_dir=tok_dir)
    assert source.batch(0, 1, 16).labels[0].tolist()[-2:] == [*_ids("down"), 2]


@pytest.mark.parametrize("rows,spec,message", [
    ([{"prompt": "up", "answer": " down"}], TaskOptions(name="completion"),
     r"no column 'completion' \(it has 'prompt', 'answer'\)"),
    ([{"text": "the film", "label": 0}], CLS, r"no column 'sentence'"),
    ([{"sentence": "the film", "label": 2}], CLS, r"row 1: label 2 in column 'label' is neither 0..1 nor one of"),
    ([{"sentence": "the film", "label": 0}],
     TaskOptions(name="classification", template="{sentence}", label_words=("great", "awful")),
     r"label word 'awful' is not in the tokenizer's vocabulary"),
    ([{"sentence": "the film", "label": 0}],
     TaskOptions(name="classification", template="{sentence}", label_words=("great", "great ")),
     r"a word appears twice|tokenise to the same"),
    ([], TaskOptions(name="completion"), "holds no rows"),
])
def test_data_errors_name_the_problem(tmp_path, tok_dir, rows, spec, message):
    data = _jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ZoError, match=message):
        make_task_source(data, spec, vocab=32, tokenizer_dir=tok_dir)


def test_option_and_file_errors(tmp_path, tok_dir):
    with pytest.raises(ZoError, match="needs --template"):
        TaskOptions(name="classification", label_words=("a", "b"))
    with pytest.raises(ZoError, match="two or more words"):
        TaskOptions(name="classification", template="{x}", label_words=("a",))
    with pytest.raises(ZoError, match="options of --task classification"):
        TaskOptions(template="{x}")
    with pytest.raises(FieldError, match="name must be one of text, completion, classification"):
        TaskOptions(name="nope")
    with pytest.raises(ZoError, match="names no column"):
        TaskOptions(name="classification", template="It was", label_words=("a", "b"))
    with pytest.raises(ZoError, match="does not exist"):
        load_records(tmp_path / "none.csv")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ZoError, match="unknown format"):
        load_records(tmp_path / "x.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "completion": "b"}\n{oops\n')
    with pytest.raises(ZoError, match=r"bad.jsonl:2: not valid JSON"):
        load_records(tmp_path / "bad.jsonl")
    with pytest.raises(ZoError, match="text data needs a tokenizer"):
        load_tokenizer(None, where="d.jsonl")
    assert TaskOptions.from_record(CLS.record()) == CLS
    assert CLS.record() == {"name": "classification", "template": "{sentence} It was",
                             "label_words": ["terrible", "great"], "label_column": "label",
                             "classification_loss": "candidates"}


def test_the_task_is_recorded_and_a_resume_keeps_it(tmp_path):
    from zoexec.config import RunConfig, TaskOptions
    from zoexec.options import given_settings
    from zoexec.run.folder import RunDir
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    plan = hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8))
    rundir = RunDir(tmp_path)
    rundir.write_identity(RunConfig.make(plan=plan.data, data="d.jsonl",
                                         **TaskOptions.record_fields(CLS.record())), "abc")
    assert json.loads((tmp_path / "run.json").read_text())["task"] == CLS.record()
    same = given_settings({"name": "classification", "template": "{sentence} It was",
                           "label_words": ("terrible", "great")})["task"]
    assert rundir.resume_plan(plan_sha256="abc", given={"task": same}).settings["task"] == same
    other = given_settings({"name": "completion"})["task"]
    with pytest.raises(ZoError, match=r"the task completion .* differs from the run being resumed "
                                      r"\(classification"):
        rundir.resume_plan(plan_sha256="abc", given={"task": other})
    assert given_settings({})["task"] is None
