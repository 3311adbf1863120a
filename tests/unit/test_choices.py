"""zoexec.data.choices and the classification EvalSet: the rows each classification loss
trains on, one row per example for single-token candidates, the metrics from the
candidates' scores, --eval-samples' subset, and the options that go with them."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from zoexec.config import CheckpointOptions, FieldError, parse_best
from zoexec.data.batch import IGNORE
from zoexec.data.choices import classification_batch, subset
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_eval_set, make_task_source
from zoexec.data.tasks import EvalSet, Labelled

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from make_model import make_tokenizer  # noqa: E402

WORDS = ("the", "film", "was", "fine", "dull", "It", "terrible", "great", "so", "bad")
SPEC = TaskOptions(name="classification", template="{sentence} It was",
                label_words=("terrible", "great"))


@pytest.fixture
def tok_dir(tmp_path):
    """A word-level tokenizer: <s>=0 <pad>=1 </s>=2 <unk>=3, then WORDS from 4."""
    make_tokenizer(WORDS).save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def _ids(*words):
    return [4 + WORDS.index(w) for w in words]


def _data(tmp_path):
    rows = [{"sentence": "the film was fine", "label": 1}, {"sentence": "the film was dull", "label": 0},
            {"sentence": "the film", "label": 1}]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_single_token_candidates_train_on_one_row_per_example(tmp_path, tok_dir):
    source = make_task_source(_data(tmp_path), SPEC, vocab=32, tokenizer_dir=tok_dir, seed=0)
    batch = source.batch(0, 3, 16)
    assert batch.rows == 3 and batch.choices.tokens.tolist() == [_ids("terrible", "great")] * 3
    for ids, labels, answer in zip(batch.ids.tolist(), batch.labels.tolist(),
                                   batch.choices.answers.tolist()):
        end = max(i for i, v in enumerate(labels) if v != IGNORE)
        assert ids[end] == _ids(("terrible", "great")[answer])[0]      # the correct word
        assert [v for v in labels if v != IGNORE] == [ids[end]]         # labelled alone
        assert ids[end - 2:end] == _ids("It", "was")                    # after the prompt
    vocabulary = TaskOptions(**{**SPEC.__dict__, "classification_loss": "vocabulary"})
    plain = make_task_source(_data(tmp_path), vocabulary, vocab=32, tokenizer_dir=tok_dir).batch(0, 3, 16)
    assert plain.choices is None and torch.equal(plain.ids, batch.ids)   # the same rows, no choices


def test_longer_candidates_get_a_row_each(tok_dir):
    examples = [Labelled(prompt=(4, 5), candidates=((10, 11), (12,)), label=1),
                Labelled(prompt=(6,), candidates=((10, 11), (12,)), label=0)]
    batch = classification_batch(examples, loss="candidates", seq=8, pad=1)
    assert batch.ids.tolist() == [[4, 5, 10, 11], [4, 5, 12, 1], [6, 10, 11, 1], [6, 12, 1, 1]]
    assert batch.labels.tolist() == [[IGNORE, IGNORE, 10, 11], [IGNORE, IGNORE, 12, IGNORE],
                                     [IGNORE, 10, 11, IGNORE], [IGNORE, 12, IGNORE, IGNORE]]
    assert batch.choices.size == 2 and batch.choices.answers.tolist() == [1, 0]


def test_eval_scores_single_token_candidates_from_one_row_per_example(tmp_path, tok_dir):
    evals = make_eval_set(_data(tmp_path), SPEC, vocab=32, seq=16, tokenizer_dir=tok_dir)
    assert len(evals.rows) == 3 and evals.tokens == tuple(_ids("terrible", "great"))
    assert evals.labels == [1, 0, 1] and evals.width == 2
    batch = evals.pack(0, 3, rows=4, seq=16)           # a padding row after the three
    assert batch.rows == 4 and batch.choices.tokens.shape == (4, 2)
    assert (batch.labels[3] == IGNORE).all()
    # log-probabilities: example 0 picks great (right), 1 great (wrong), 2 terrible (wrong)
    out = torch.log(torch.tensor([[0.2, 0.7], [0.1, 0.3], [0.5, 0.4]], dtype=torch.float64))
    metrics = evals.metrics(out)
    assert metrics["eval_accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval_f1"] == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))   # tp 1, fp 1, fn 1
    hand = -(math.log(0.7 / 0.9) + math.log(0.1 / 0.4) + math.log(0.4 / 0.9)) / 3
    assert metrics["eval_loss"] == pytest.approx(hand)          # the candidate loss
    vocabulary = EvalSet(**{**evals.__dict__, "loss": "vocabulary"}).metrics(out)
    assert vocabulary["eval_loss"] == pytest.approx(-(math.log(0.7) + math.log(0.1) + math.log(0.4)) / 3)


def test_eval_samples_is_a_fixed_subset_in_file_order(tmp_path, tok_dir):
    picks = subset(100, 10)
    assert picks == sorted(picks) and len(set(picks)) == 10 and picks == subset(100, 10)
    assert subset(5, None) == subset(5, 9) == [0, 1, 2, 3, 4]
    two = make_eval_set(_data(tmp_path), SPEC, vocab=32, seq=16, tokenizer_dir=tok_dir, samples=2)
    every = make_eval_set(_data(tmp_path), SPEC, vocab=32, seq=16, tokenizer_dir=tok_dir)
    assert two.rows == [every.rows[i] for i in subset(3, 2)]


def test_the_classification_loss_is_recorded_and_old_runs_read_as_they_ran():
    assert SPEC.record()["classification_loss"] == "candidates"
    old = {k: v for k, v in SPEC.record().items() if k != "classification_loss"}
    assert TaskOptions.from_record(old).classification_loss == "vocabulary"


def test_save_best_names_a_metric_and_a_direction():
    assert parse_best("eval_accuracy:max") == ("eval_accuracy", True)
    assert parse_best("eval_loss") == ("eval_loss", False)
    assert parse_best("eval_f1") == ("eval_f1", True)
    assert CheckpointOptions(save_best="eval_loss:max").best == ("eval_loss", True)
    with pytest.raises(FieldError, match="save_best must be one of eval_loss"):
        CheckpointOptions(save_best="accuracy:max")
    with pytest.raises(FieldError, match="then :max or :min"):
        CheckpointOptions(save_best="eval_loss:up")
