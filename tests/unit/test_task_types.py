"""Multiple choice, generation, demonstrations and task presets (zoexec.data.multichoice,
.generation, .demos, .presets) against hand computations: the candidate loss and both
accuracies of a 2-candidate example, SQuAD's exact match and F1 of known strings, the
demonstrations a seed picks (never the evaluated row), the greedy decoder's head, and
each preset's prompt and candidates from a 2-row file (a byte-level tokenizer, so the
tokens decode to the exact text)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from zoexec.config import RunConfig
from zoexec.data.batch import IGNORE, Batch
from zoexec.data.demos import fit
from zoexec.data.generation import (
    Decoding,
    answer_scores,
    exact_match,
    generation_metrics,
    normalize_answer,
    token_f1,
)
from zoexec.data.multichoice import MultipleChoice, choice_batch, choice_metrics, choice_rows
from zoexec.data.presets import PRESETS, with_preset
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_eval_set, make_task_source
from zoexec.fields import FieldError
from zoexec.model import heads
from zoexec.train.generate import marked_batch, next_tokens
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

VOCAB = 4 + 256


class IdentityHead:
    """A head whose logits are the hidden states: log-probabilities chosen by hand."""

    @staticmethod
    def logits(hidden):
        return hidden


@pytest.fixture(scope="module")
def byte_tok(tmp_path_factory):
    """A byte-level tokenizer without merges (<s> <pad> </s> <unk>, then one token per
    byte): every text encodes byte by byte and decodes to itself."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *alphabet])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", pad_token="<pad>",
                                  eos_token="</s>", unk_token="<unk>")
    path = tmp_path_factory.mktemp("bytes") / "tok"
    tok.save_pretrained(path)
    return path, tok


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- multiple choice: the candidate loss and the two accuracies ---------------------------------
def _hidden_for(batch: Batch, probs: dict) -> torch.Tensor:
    """Log-probabilities [rows, seq, vocab 4] where each labelled token is predicted with
    probability probs[(row, position)] and the other three share the rest."""
    hidden = torch.zeros(batch.rows, batch.ids.shape[1], 4)
    for (row, pos), p in probs.items():
        token = int(batch.labels[row, pos + 1])
        dist = torch.full((4,), (1 - p) / 3)
        dist[token] = p
        hidden[row, pos] = dist.log()
    return hidden


def test_two_candidates_hand_computed_loss_and_both_accuracies():
    """Prompt (0, 1); candidate A = (2,) with p 0.5, candidate B = (3, 2) with p 0.6 for
    each token; B is right. Summed log-likelihoods: ln 0.5 > ln 0.36 (A wins raw); per
    token: ln 0.5 < ln 0.6 (B wins normalised). Loss (mean): -log softmax(ln .5, ln .6)[B]
    = ln(1 + 0.5/0.6) = ln(11/6); summed: ln(1 + 0.5/0.36) = ln(43/18)."""
    ex = MultipleChoice(prompt=(0, 1), candidates=((2,), (3, 2)), golds=(1,))
    for score, hand in (("mean", math.log(11 / 6)), ("sum", math.log(43 / 18))):
        batch = choice_batch([ex], score=score, seq=8, pad=0)
        assert batch.ids.tolist() == [[0, 1, 2, 0], [0, 1, 3, 2]]
        hidden = _hidden_for(batch, {(0, 1): 0.5, (1, 1): 0.6, (1, 2): 0.6})
        total, count = heads.loss_sum(IdentityHead, hidden, batch)
        assert count == 1 and math.isclose(float(total), hand, rel_tol=1e-6)
        rows, _ = choice_rows([ex])
        out = heads.row_losses(IdentityHead, hidden, batch.labels, batch.positions)
        metrics = choice_metrics(out, [(0, 2)], [ex.golds], score=score)
        assert metrics["eval_accuracy"] == 0.0 and metrics["eval_accuracy_norm"] == 1.0
        assert math.isclose(metrics["eval_loss"], hand, rel_tol=1e-6)
        assert len(rows) == 2


def test_fewer_candidates_are_padded_with_rows_the_loss_ignores():
    """An example of 2 candidates beside one of 3: its third row is empty and masked; its
    loss is what it is alone."""
    two = MultipleChoice(prompt=(0,), candidates=((2,), (3,)), golds=(0,))
    three = MultipleChoice(prompt=(1,), candidates=((2,), (3,), (2, 3)), golds=(2,))
    alone = choice_batch([two], score="mean", seq=8, pad=0)
    both = choice_batch([two, three], score="mean", seq=8, pad=0)
    assert both.choices.size == 3 and both.choices.valid.tolist() == [[True, True, False], [True] * 3]
    probs = {(0, 0): 0.7, (1, 0): 0.2}
    lone, _ = heads.loss_sum(IdentityHead, _hidden_for(alone, probs), alone)
    hidden = _hidden_for(both, {**probs, (3, 0): 0.1, (4, 0): 0.1, (5, 0): 0.5, (5, 1): 0.5})
    total, count = heads.loss_sum(IdentityHead, hidden, both)
    hand_three = -math.log(0.5 / (0.1 + 0.1 + 0.5))          # mean of ln .5 twice: ln .5
    assert count == 2 and math.isclose(float(lone), -math.log(0.7 / 0.9), rel_tol=1e-6)
    assert math.isclose(float(total), float(lone) + hand_three, rel_tol=1e-6)


# ---- generation: SQuAD's normalisation, exact match, F1 -----------------------------------------
@pytest.mark.parametrize("text,normal", [
    ("The  Eiffel Tower!", "eiffel tower"),
    ("an apple, a pear", "apple pear"),
    ("  Theatre  ", "theatre"),          # "the" only as a word
    ("A.B.C.", "abc"),                   # punctuation removed, not spaced
    ("\tDenver\nBroncos ", "denver broncos"),
])
def test_squad_normalisation(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_and_f1_of_known_strings():
    assert exact_match("Paris.", "paris") == 1.0 and exact_match("Paris", "Paris, France") == 0.0
    assert token_f1("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)   # P 1, R 1/2
    assert token_f1("to to be", "to to") == pytest.approx(0.8)                 # P 2/3, R 1: a bag
    assert token_f1("dog", "cat") == 0.0 and token_f1("the", "a") == 1.0       # both empty
    assert answer_scores("Denver Broncos", ["Broncos", "Denver Broncos"]) == (1.0, 1.0)
    assert answer_scores("Broncos win", ["Denver Broncos", "Carolina"]) == (0.0, 0.5)
    metrics = generation_metrics(["Denver Broncos", "Broncos win"],
                                 [["Denver Broncos"], ["Denver Broncos", "Carolina"]])
    assert metrics == {"eval_exact_match": 0.5, "eval_f1": 0.75}


def test_decoding_stops_at_eos_or_a_newline(byte_tok):
    _, tok = byte_tok
    ids = tok("Paris\nTitle", add_special_tokens=False)["input_ids"]
    newline = Decoding(prompts=[()], golds=[("Paris",)], max_new=8, eos=2, newline=True,
                       decode=tok.decode, pad=1)
    assert newline.stops(ids[5]) and not newline.stops(ids[0]) and newline.stops(2)
    assert newline.answer(ids) == "Paris" and newline.answer([*ids[:5], 2, 9]) == "Paris"
    plain = Decoding(prompts=[()], golds=[("Paris",)], max_new=8, eos=2, newline=False,
                     decode=tok.decode, pad=1)
    assert not plain.stops(ids[5]) and plain.answer(ids) == "Paris\nTitle"


def test_the_greedy_head_picks_the_argmax_after_each_rows_last_token():
    batch = marked_batch([(5, 6, 7), (8,), ()], pad=1)
    assert batch.ids.tolist() == [[5, 6, 7], [8, 1, 1], [1, 1, 1]]
    hidden = torch.zeros(3, 3, 10)
    hidden[0, 2, 4] = 1.0       # row 0: after its 3rd token, 4
    hidden[0, 1, 9] = 5.0       # (not its last token: ignored)
    hidden[1, 0, 7] = 1.0       # row 1: after its only token, 7
    assert next_tokens(IdentityHead, hidden, batch)[:, 0].tolist() == [4.0, 7.0, -1.0]


# ---- demonstrations -----------------------------------------------------------------------------
SST = [{"sentence": f"review {i}", "label": i % 2} for i in range(6)]
SST_SPEC = TaskOptions(name="classification", template="{sentence} It was",
                    label_words=("terrible", "great"), demonstrations=2)


def test_demonstrations_are_fixed_by_the_seed_and_never_the_evaluated_row(tmp_path, byte_tok):
    path, tok = byte_tok
    data = _jsonl(tmp_path / "sst.jsonl", SST)
    evals = make_eval_set(data, SST_SPEC, vocab=VOCAB, seq=256, tokenizer_dir=path)
    again = make_eval_set(data, SST_SPEC, vocab=VOCAB, seq=256, tokenizer_dir=path)
    texts = [tok.decode(row.prompt) for row in evals.rows[::2]]   # a row per candidate
    assert [tok.decode(row.prompt) for row in evals.rows] == [tok.decode(row.prompt) for row in again.rows]
    for number, text in enumerate(texts):
        shots = text.split("\n\n")
        assert len(shots) == 3 and shots[-1] == f"review {number} It was"
        assert f"review {number} " not in "\n\n".join(shots[:2])           # never itself
        for shot in shots[:2]:
            i = int(shot.split()[1])
            assert shot == f"review {i} It was {('terrible', 'great')[i % 2]}"
    other = TaskOptions(**{**SST_SPEC.__dict__, "demonstrations_seed": 7})
    moved = make_eval_set(data, other, vocab=VOCAB, seq=256, tokenizer_dir=path)
    assert [tok.decode(r.prompt) for r in moved.rows[::2]] != texts
    source = make_task_source(data, SST_SPEC, vocab=VOCAB, tokenizer_dir=path, seq=256)
    assert all("\n\n" not in tok.decode(ex.prompt) for ex in source.examples)   # eval only


def test_demonstrations_in_training_and_from_another_file(tmp_path, byte_tok):
    path, tok = byte_tok
    train = _jsonl(tmp_path / "train.jsonl", SST)
    test = _jsonl(tmp_path / "test.jsonl", [{"sentence": "new one", "label": 1}])
    spec = TaskOptions(**{**SST_SPEC.__dict__, "demonstrations_in_training": True})
    source = make_task_source(train, spec, vocab=VOCAB, tokenizer_dir=path, seq=256)
    for number, ex in enumerate(source.examples):
        shots = tok.decode(ex.prompt).split("\n\n")
        assert len(shots) == 3 and f"review {number} " not in "\n\n".join(shots[:2])
    evals = make_eval_set(test, SST_SPEC, vocab=VOCAB, seq=256, tokenizer_dir=path,
                          train_path=train)
    shots = tok.decode(evals.rows[0].prompt).split("\n\n")
    assert shots[-1] == "new one It was" and all(s.startswith("review ") for s in shots[:2])
    with pytest.raises(ZoError, match="holds 1 rows, fewer than 2"):
        make_eval_set(test, SST_SPEC, vocab=VOCAB, seq=256, tokenizer_dir=path)


def test_a_long_row_loses_whole_demonstrations_first_then_prompt_tokens():
    demos = [(1, 2, 3), (4, 5)]
    assert fit((0,), demos, (0, 9, 9), room=9) == (0, 1, 2, 3, 4, 5, 9, 9)
    assert fit((0,), demos, (0, 9, 9), room=6) == (0, 4, 5, 9, 9)   # the first one goes
    assert fit((0,), demos, (0, 9, 9), room=3) == (0, 9, 9)
    assert fit((0,), demos, (0, 9, 9), room=2) == (0, 9, 9)         # pack_examples cuts the rest
    assert fit((), demos, (9,), room=None) == (1, 2, 3, 4, 5, 9)


# ---- presets --------------------------------------------------------------------------------------
PRESET_ROWS = {
    "sst2": ({"sentence": "a fine film", "label": 1}, "a fine film It was", [" terrible", " great"]),
    "rte": ({"premise": "P.", "hypothesis": "H", "label": 0},
            'P.\nDoes this mean that "H" is true? Yes or No?\n', ["Yes", "No"]),
    "cb": ({"premise": "P.", "hypothesis": "H", "label": 2},
           'Suppose P. Can we infer that "H"? Yes, No, or Maybe?\n', ["Yes", "No", "Maybe"]),
    "boolq": ({"passage": "Text.", "question": "is it", "label": 1}, "Text. is it?\n", ["No", "Yes"]),
    "wsc": ({"text": "Tom saw him.", "span1_text": "Tom", "span2_text": "him", "label": 0},
            'Tom saw him.\nIn the previous sentence, does the pronoun "him" refer to Tom? Yes or '
            'No?\n', ["No", "Yes"]),
    "wic": ({"word": "bank", "sentence1": "S1.", "sentence2": "S2.", "label": 1},
            'Does the word "bank" have the same meaning in these two sentences? Yes, No?\nS1.\nS2.\n',
            ["No", "Yes"]),
    "multirc": ({"paragraph": "Para.", "question": "Q?", "answer": "A", "label": 0},
                'Para.\nQuestion: Q?\nI found this answer "A". Is that correct? Yes or No?\n',
                ["No", "Yes"]),
    "copa": ({"premise": "The man broke his toe.", "choice1": "He dropped a hammer.",
              "choice2": "He got a hole in his sock.", "question": "cause", "label": 0},
             "The man broke his toe because", [" he dropped a hammer.", " he got a hole in his sock."]),
    "record": ({"passage": "News.\n@highlight\nA fact", "query": "@placeholder won.",
                "entities": ["Ann", "Bob"], "answers": ["Bob"]},
               "News.\n- A fact\n", ["Ann won.", "Bob won."]),
    "squad": ({"title": "T", "context": "C.", "question": "Q?",
               "answers": {"text": ["Paris", "paris"], "answer_start": [0, 0]}},
              "Title: T\nContext: C.\nQuestion: Q?\nAnswer:", [" Paris</s>"]),
    "drop": ({"passage": "P.", "question": "Q?", "answers_spans": {"spans": ["12"], "types": ["number"]}},
             "Passage: P.\nQuestion: Q?\nAnswer:", [" 12</s>"]),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_builds_its_prompts_from_a_two_row_file(tmp_path, byte_tok, name):
    """The preset's prompt and candidates (or answer) of a 2-row file in the HF dataset's
    columns, written out by hand from MeZO's table of prompts."""
    path, tok = byte_tok
    row, prompt, candidates = PRESET_ROWS[name]
    second = {**row, **({"label": 1} if "label" in row and name != "cb" else {})}
    data = _jsonl(tmp_path / f"{name}.jsonl", [row, second])
    spec = TaskOptions(**with_preset({"task_preset": name}))
    source = make_task_source(data, spec, vocab=VOCAB, tokenizer_dir=path, seq=256)
    ex = source.examples[0]
    assert tok.decode(ex.prompt) == prompt
    shown = ([tok.decode(c) for c in ex.candidates] if hasattr(ex, "candidates")
             else [tok.decode(ex.target)])
    assert shown == candidates
    evals = make_eval_set(data, spec, vocab=VOCAB, seq=256, tokenizer_dir=path)
    if spec.name == "generation":
        assert evals.decoding.golds[0] == tuple(row[spec.answer_column].get("text") or
                                                row[spec.answer_column]["spans"])
        assert tok.decode(evals.decoding.prompts[0]) == prompt
    if name == "record":
        assert ex.golds == (1,)


def test_a_preset_gives_defaults_that_options_override(tmp_path):
    assert with_preset({"task_preset": "sst2", "label_words": ("bad", "good")}) == {
        "name": "classification", "template": "{sentence} It was", "label_words": ("bad", "good"),
        "label_column": "label", "task_preset": "sst2"}
    plan = hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8))
    cfg = RunConfig.make(plan=plan.data, data="d.jsonl", task_preset="copa", choice_score="sum")
    spec = cfg.task
    assert spec.name == "multiple-choice" and spec.choices == ("{choice1_lc}", "{choice2_lc}")
    assert spec.choice_score == "sum" and spec.record()["task_preset"] == "copa"
    assert TaskOptions(data="d.jsonl", **TaskOptions.record_fields(spec.record())) == spec


@pytest.mark.parametrize("kw,message", [
    ({"name": "multiple-choice", "template": "{q}"}, "needs --template .* and the candidates"),
    ({"name": "multiple-choice", "template": "{q}", "choices": ("{a}",)}, "two or more templates"),
    ({"name": "multiple-choice", "template": "{q}", "choices_column": "c", "choices": ("{a}", "{b}")},
     "takes one --choices template"),
    ({"name": "generation", "max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"name": "completion", "choices": ("{a}", "{b}")}, "options of --task multiple-choice"),
    ({"name": "text", "demonstrations": 2}, "--demonstrations 2"),
    ({"name": "completion", "demonstrations_in_training": True}, "needs --demonstrations K"),
    ({"task_preset": "mnli"}, "task_preset must be one of sst2, .*, got 'mnli'"),
])
def test_option_errors_of_the_new_task_types(kw, message):
    with pytest.raises((ZoError, FieldError), match=message):
        TaskOptions(**kw)


def test_multiple_choice_data_errors_name_the_row(tmp_path, byte_tok):
    path, _ = byte_tok
    spec = TaskOptions(name="multiple-choice", template="{q}", choices_column="c")
    for rows, message in (([{"q": "x", "c": "ab", "label": 0}], "row 1: column 'c' holds str"),
                          ([{"q": "x", "c": ["a", "b"], "label": "z"}], "label 'z' in column 'label'"),
                          ([{"q": "x", "c": ["a", "b"], "label": 2}], r"label 2 is not a candidate's")):
        with pytest.raises(ZoError, match=message):
            make_task_source(_jsonl(tmp_path / "mc.jsonl", rows), spec, vocab=VOCAB,
                             tokenizer_dir=path)
    gen = TaskOptions(name="generation", template="{q}", answer_column="a")
    with pytest.raises(ZoError, match="row 1: column 'a' holds no text"):
        make_task_source(_jsonl(tmp_path / "g.jsonl", [{"q": "x", "a": []}]), gen, vocab=VOCAB,
                         tokenizer_dir=path)
    batch = make_task_source(_jsonl(tmp_path / "ok.jsonl", [{"q": "x", "c": ["a", "bc"], "label": "bc"}]),
                             spec, vocab=VOCAB, tokenizer_dir=path).batch(0, 1, 16)
    assert batch.choices.answers.tolist() == [1] and batch.labels[1].tolist().count(IGNORE) == 1   # " bc": 3 bytes after "x"


def test_save_best_takes_the_metrics_of_the_task_type(tmp_path):
    """--save-best names a metric the task reports: eval_exact_match for generation,
    eval_accuracy_norm for multiple choice, not classification's eval_f1 of two labels."""
    from zoexec.options import build_config

    plan = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8)).save(plan)
    data = _jsonl(tmp_path / "d.jsonl", [{"q": "x"}])
    common = dict(plan=plan, data=str(data), eval_data=str(data), out=str(tmp_path / "out"))
    cfg = build_config(**common, task_preset="squad", save_best="eval_exact_match")
    assert cfg.checkpoint.best == ("eval_exact_match", True) and cfg.task.name == "generation"
    cfg = build_config(**common, task_preset="copa", save_best="eval_accuracy_norm")
    assert cfg.checkpoint.best == ("eval_accuracy_norm", True)
    with pytest.raises(ZoError, match="--task generation reports eval_loss, eval_exact_match, eval_f1"):
        build_config(**common, task_preset="drop", save_best="eval_accuracy")
    with pytest.raises(ZoError, match="--task multiple-choice reports"):
        build_config(**common, task_preset="copa", save_best="eval_f1")
