"""The accuracy benchmark's plain baselines (benchmarks/accuracy/accuracy_plain.py) and its data
split (benchmarks/accuracy/accuracy_setup.py), on a tiny random Llama model with tied embeddings
and grouped-query attention: the candidate loss against a hand computation, the head at
the last real token of right-padded rows, one MeZO step against its formula, the scorer
against the candidates' logits. Nothing is downloaded."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT / "benchmarks" / "accuracy"))
from accuracy_plain import (  # noqa: E402
    PlainTask,
    candidate_logits,
    candidate_loss,
    mezo_train,
    pick_demos,
    score,
    step_seed,
)
from accuracy_setup import split_rows  # noqa: E402
from tiny_model import make_tokenizer  # noqa: E402

WORDS = ("the", "movie", "was", "fun", "boring", "great", "terrible", "Review", ":",
         "Sentiment", "a", "film")
ROWS = [{"sentence": "the movie was fun", "label": 1},
        {"sentence": "a boring film", "label": 0},
        {"sentence": "the film was great fun", "label": 1},
        {"sentence": "boring", "label": 0}]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(WORDS)


@pytest.fixture
def model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


def task_of(tokenizer, demos=()) -> PlainTask:
    return PlainTask(tokenizer=tokenizer, template="Review : {sentence} Sentiment :",
                     label_words=("terrible", "great"), demos=list(demos))


def test_candidate_loss_is_the_cross_entropy_over_the_candidates_only():
    logits = torch.tensor([[2.0, 0.5], [0.1, 1.1], [-1.0, 3.0]])
    labels = torch.tensor([0, 1, 0])
    by_hand = [-(2.0 - math.log(math.exp(2.0) + math.exp(0.5))),
               -(1.1 - math.log(math.exp(0.1) + math.exp(1.1))),
               -(-1.0 - math.log(math.exp(-1.0) + math.exp(3.0)))]
    assert float(candidate_loss(logits, labels)) == pytest.approx(sum(by_hand) / 3, rel=1e-6)


def test_the_head_is_read_at_each_rows_last_real_token(tokenizer, model):
    task = task_of(tokenizer)
    rows = [task.encode(r) for r in ROWS]
    assert len({len(r) for r in rows}) > 1                       # padding is exercised
    got = candidate_logits(model, rows, task.candidates, tokenizer.pad_token_id)
    for i, ids in enumerate(rows):                                # each row alone, unpadded
        full = model(torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(got[i], full[task.candidates], rtol=1e-5, atol=1e-5)


def test_one_mezo_step_is_the_spsa_estimate_and_the_update_along_z(tokenizer, model):
    task, eps, lr = task_of(tokenizer), 1e-2, 0.5
    before = [p.detach().clone() for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names                          # tied: perturbed once
    history = mezo_train(model, task, ROWS, seed=3, steps=1, lr=lr, eps=eps, batch=4)
    gen = torch.Generator().manual_seed(step_seed(3, 0))
    zs = [torch.randn(p.shape, generator=gen) for p in before]
    ids = [task.encode(r) for r in ROWS]   # batch 4 of 4 rows: every row, in some order
    labels = torch.tensor([r["label"] for r in ROWS])

    def loss_at(scale: float) -> float:
        with torch.no_grad():
            for p, p0, z in zip(model.parameters(), before, zs):
                p.copy_(p0 + scale * z)
            return float(candidate_loss(candidate_logits(model, ids, task.candidates,
                                                         tokenizer.pad_token_id), labels))

    after = [p.detach().clone() for p in model.parameters()]
    plus, minus = loss_at(eps), loss_at(-eps)
    record = history[0]
    assert record["loss_plus"] == pytest.approx(plus, rel=1e-4)
    assert record["loss_minus"] == pytest.approx(minus, rel=1e-4)
    assert record["g"] == pytest.approx((plus - minus) / (2 * eps), rel=1e-3, abs=1e-4)
    for p0, p1, z in zip(before, after, zs):
        torch.testing.assert_close(p1, p0 - lr * record["g"] * z, rtol=1e-4, atol=1e-5)


def test_the_scorer_takes_the_likeliest_candidate(tokenizer, model):
    task = task_of(tokenizer)
    logits = candidate_logits(model, [task.encode(r) for r in ROWS], task.candidates,
                              tokenizer.pad_token_id)
    likeliest = [{**r, "label": int(logits[i].argmax())} for i, r in enumerate(ROWS)]
    other = [{**r, "label": 1 - int(logits[i].argmax())} for i, r in enumerate(ROWS)]
    accuracy, seconds = score(model, task, likeliest)
    assert accuracy == 1.0 and seconds >= 0
    assert score(model, task, other)[0] == 0.0


def test_demonstrations_are_fixed_by_the_seed_and_precede_the_prompt(tokenizer):
    demos = pick_demos(ROWS, 2, seed=5)
    assert demos == pick_demos(ROWS, 2, seed=5) and len(demos) == 2
    task = task_of(tokenizer, demos)
    first = demos[0]
    assert task.prefix.startswith(f"Review : {first['sentence']} Sentiment : "
                                  f"{('terrible', 'great')[first['label']]}\n\n")
    assert task.encode(ROWS[0])[-len(task_of(tokenizer).encode(ROWS[0])):] == \
        task_of(tokenizer).encode(ROWS[0])


def test_a_label_word_of_two_tokens_is_refused(tokenizer):
    with pytest.raises(ValueError, match="2 tokens"):
        PlainTask(tokenizer=tokenizer, template="{sentence}", label_words=("a film", "great"))


def test_the_split_is_balanced_disjoint_and_independent_of_row_order():
    rows = [{"sentence": f"sentence {i}", "label": i % 2} for i in range(40)]
    test, train = split_rows(rows, test_per_label=3, train_per_label=5)
    again = split_rows(list(reversed(rows)), test_per_label=3, train_per_label=5)
    assert (test, train) == again
    assert [sum(r["label"] == k for r in test) for k in (0, 1)] == [3, 3]
    assert [sum(r["label"] == k for r in train) for k in (0, 1)] == [5, 5]
    assert not {r["sentence"] for r in test} & {r["sentence"] for r in train}


def test_a_model_folder_is_reused_only_when_every_file_has_its_recorded_hash(tmp_path):
    import json as json_

    from accuracy_setup import MANIFEST, _intact, sha256_file

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights").write_bytes(b"abc")
    files = {"model/weights": sha256_file(folder / "weights")}
    (tmp_path / MANIFEST).write_text(json_.dumps({"packages": [], "files": files}))
    assert _intact(tmp_path, folder)
    (folder / "weights").write_bytes(b"abd")                       # changed on disk
    assert not _intact(tmp_path, folder)
    (folder / "weights").unlink()
    assert not _intact(tmp_path, folder)


def test_the_table_gives_the_zoexec_runs_accuracy_at_each_evaluation_over_the_seeds():
    from accuracy_tuning import fine_tuned_lines

    def seed(accs, loss, secs):
        return {"evals": [{"step": 100 * (i + 1), "eval_accuracy": a, "eval_loss": loss + i}
                          for i, a in enumerate(accs)], "step_seconds": secs}
    r = {"zoexec_fine_tuned": {"tuning": "lora", "lr": 3e-3, "eps": 1e-2, "steps": 300, "seeds": {
        "0": seed([0.5, 0.6, 0.7], 0.5, 2.0), "1": seed([0.6, 0.7, 0.8], 0.7, 4.0),
        "2": {"note": "exit 1: diverged"}}}}
    head, secs = fine_tuned_lines(r)
    assert head == ("zoexec lora lr 0.003 eps 0.01, 2 seed(s), held-out accuracy step 100: "
                    "0.5500 +- 0.0707; step 200: 0.6500 +- 0.0707; step 300: 0.7500 +- 0.0707; "
                    "eval loss at step 300: 2.6000 +- 0.1414")
    assert secs == "  seconds a step 3.00 +- 1.41, training 900 +- 424 s (300 steps x each seed's median step)"
    assert fine_tuned_lines({}) == []
