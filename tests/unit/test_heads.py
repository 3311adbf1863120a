"""zoexec.model.heads: the candidate loss against hand computations, and the head taken
at the labelled positions only equal to the head over every position (the vocabulary
loss, the per-row losses, the candidates' log-probabilities) on OPT and Llama blocks."""

from __future__ import annotations

import math

import pytest
import torch

from tests.fixtures.host_reads import HostReads
from zoexec.data.batch import IGNORE, Batch, Choices, shard
from zoexec.model import heads
from zoexec.model.families import bind_block, causal_lm_loss_sum, causal_lm_row_losses
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError


class IdentityHead:
    """A head whose logits are the hidden states: logits chosen by hand."""

    @staticmethod
    def logits(hidden):
        return hidden


def _row(logits_at_answer: list[float], *, vocab: int = 6, prompt: int = 3, label_token: int):
    """One row: `prompt` prompt tokens, then the label token; the answer position
    (prompt - 1) holds the given logits, every other position zeros."""
    hidden = torch.zeros(1, prompt + 1, vocab)
    hidden[0, prompt - 1] = torch.tensor(logits_at_answer)
    labels = torch.full((1, prompt + 1), IGNORE)
    labels[0, prompt] = label_token
    return hidden, labels


def test_two_single_token_candidates_give_the_hand_computed_loss():
    """Candidates: tokens 4 ("terrible") and 1 ("great"); logits 2.0 and 0.5 at the
    answer position; label 0. Candidate loss: -log(e^2 / (e^2 + e^0.5)) =
    log(1 + e^-1.5); the vocabulary loss normalises over all six tokens."""
    logits = [0.3, 0.5, -1.0, 0.0, 2.0, 1.0]
    hidden, labels = _row(logits, label_token=4)
    batch = Batch(torch.zeros_like(labels), labels,
                  Choices(torch.tensor([0]), tokens=torch.tensor([[4, 1]])))
    total, count = heads.loss_sum(IdentityHead, hidden, batch)
    assert count == 1 and math.isclose(float(total), math.log(1 + math.exp(-1.5)), rel_tol=1e-6)
    vocab_total, vocab_count = heads.loss_sum(IdentityHead, hidden, Batch(batch.ids, labels))
    hand = -(2.0 - math.log(sum(math.exp(v) for v in logits)))
    assert vocab_count == 1 and math.isclose(float(vocab_total), hand, rel_tol=1e-6)
    scores = heads.row_scores(IdentityHead, hidden, batch)     # evaluation: log-probabilities
    lse = math.log(sum(math.exp(v) for v in logits))
    assert scores[0].tolist() == pytest.approx([2.0 - lse, 0.5 - lse], rel=1e-6)


def test_candidates_of_several_tokens_score_their_mean_log_probability():
    """Example with candidates A = (4, 5) and B = (1,), label 1 (B): two rows. Row A's
    answer position gives log p(4) and the next position log p(5); the score of A is
    their mean, of B log p(1); loss = -log softmax(scores)[1]."""
    vocab = 6
    hidden = torch.zeros(2, 5, vocab)
    hidden[0, 2] = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0])   # predicts 4
    hidden[0, 3] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 2.0])   # predicts 5
    hidden[1, 2] = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.0, 0.0])   # predicts 1
    labels = torch.full((2, 5), IGNORE)
    labels[0, 3:5] = torch.tensor([4, 5])
    labels[1, 3] = 1
    batch = Batch(torch.zeros_like(labels), labels, Choices(torch.tensor([1]), size=2))

    def logp(values, token):
        return values[token] - math.log(sum(math.exp(v) for v in values))

    score_a = (logp([0, 0, 0, 0, 1.0, 0], 4) + logp([0, 0, 0, 0, 0, 2.0], 5)) / 2
    score_b = logp([0, 0.5, 0, 0, 0, 0], 1)
    hand = -(score_b - math.log(math.exp(score_a) + math.exp(score_b)))
    total, count = heads.loss_sum(IdentityHead, hidden, batch)
    assert count == 1 and math.isclose(float(total), hand, rel_tol=1e-6)


def test_single_token_candidates_need_one_labelled_position_per_row():
    hidden, labels = _row([0.0] * 6, label_token=4)
    labels[0, 2] = 3                                    # a second labelled position
    batch = Batch(torch.zeros_like(labels), labels,
                  Choices(torch.tensor([0]), tokens=torch.tensor([[4, 1]])))
    with pytest.raises(ZoError, match="one labelled position per row"):
        heads.loss_sum(IdentityHead, hidden, batch)


@pytest.fixture(scope="module", params=["tiny-opt", "tiny-llama"])
def hidden_states(request):
    """(parts, the last block's output [3, 10, hidden], labels with prompts, padding and
    one-token rows) of a tiny model."""
    parts, flats = build_parts(request.param, seed=1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, parts.config.vocab_size, (3, 10), generator=gen)
    with torch.no_grad():
        hidden, ctx = parts.embed(ids)
        for flat in flats:
            bind_block(parts, flat.to(parts.dtype, copy=True))
            hidden = parts.block_forward(hidden, ctx)
    labels = ids.clone()
    labels[0, :4] = IGNORE                 # a prompt
    labels[1, :] = IGNORE                  # one label (single-token candidate row)
    labels[1, 6] = ids[1, 6]
    labels[2, 7:] = IGNORE                 # padding
    return parts, hidden, labels


def test_the_head_at_the_labelled_positions_equals_the_full_head(hidden_states):
    parts, hidden, labels = hidden_states
    with torch.no_grad():
        full = parts.logits(hidden)
        total, count = heads.loss_sum(parts, hidden, Batch(labels, labels))
        ref_total, ref_count = causal_lm_loss_sum(full, labels)
        rows = heads.row_losses(parts, hidden, labels, Batch(labels, labels).positions)
        ref_rows = causal_lm_row_losses(full, labels)
    assert count == ref_count
    assert math.isclose(float(total), float(ref_total), rel_tol=1e-5)
    torch.testing.assert_close(rows, ref_rows, rtol=1e-5, atol=1e-6)


def test_candidate_scores_equal_the_full_heads_log_probabilities(hidden_states):
    parts, hidden, labels = hidden_states
    one = labels[1:2]
    tokens = torch.tensor([[3, 7, 11]])
    batch = Batch(one, one, Choices(torch.tensor([2]), tokens=tokens))
    with torch.no_grad():
        scores = heads.row_scores(parts, hidden[1:2], batch)
        logp = torch.log_softmax(parts.logits(hidden[1:2]).double(), -1)[0, 5]   # position 5 predicts 6
        total, _ = heads.loss_sum(parts, hidden[1:2], batch)
    torch.testing.assert_close(scores[0], logp[tokens[0]], rtol=1e-5, atol=1e-6)
    hand = -torch.log_softmax(logp[tokens[0]], -1)[2]
    assert math.isclose(float(total), float(hand), rel_tol=1e-5)


def test_shards_and_selections_keep_examples_whole():
    ids = torch.arange(24).view(8, 3)
    batch = Batch(ids, ids, Choices(torch.tensor([0, 1, 1, 0]), size=2))
    second = shard(batch, data_shard=1, num_shards=2)
    assert second.ids.tolist() == ids[4:].tolist() and second.choices.answers.tolist() == [1, 0]
    with pytest.raises(ZoError, match="global batch \\(4\\) is not divisible by the data shards \\(3\\)"):
        shard(batch, data_shard=0, num_shards=3)
    with pytest.raises(ValueError, match="split an example"):
        batch.select(1, 3)


@pytest.fixture
def no_host_reads(monkeypatch):
    """Within the test, any read of a tensor's values by the host fails."""
    HostReads(monkeypatch).refuse()


def _candidate_batches() -> list[Batch]:
    hidden_a, labels_a = _row([2.0, 0.5, 0, 0, 0, 0], label_token=4)
    single = Batch(torch.zeros_like(labels_a), labels_a,
                   Choices(torch.tensor([0]), tokens=torch.tensor([[4, 1]])))
    labels = torch.full((2, 6), IGNORE)
    labels[0, 4:6], labels[1, 3] = torch.tensor([4, 5]), 1
    several = Batch(torch.zeros_like(labels), labels, Choices(torch.tensor([1]), size=2))
    text = Batch(labels.clamp(min=0), labels)
    return [single, several, text]


def test_the_loss_of_a_moved_batch_never_makes_the_host_read_the_device(request):
    """A batch moved with Batch.to (as the engine's _batch does) carries the labelled
    positions found on the host: the head then queues its work without reading a value
    back (no nonzero, no comparison turned into a Python bool), so a GPU's host goes on
    issuing the step while the device computes."""
    moved = [b.to("cpu") for b in _candidate_batches()]
    request.getfixturevalue("no_host_reads")
    for batch in moved:
        hidden = torch.randn(*batch.ids.shape, 6)
        total, count = heads.loss_sum(IdentityHead, hidden, batch)
        assert count > 0 and total.dim() == 0
        heads.row_scores(IdentityHead, hidden, batch)


def test_the_steps_loss_vector_is_made_on_the_device(monkeypatch):
    """streams.loss_vector fills the all-reduce vector in place: torch.tensor(list,
    device=cuda) would copy from pageable host memory, which waits for the stream."""
    from zoexec.train.streams import loss_vector

    made = []
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or torch.zeros(1))
    vec = loss_vector((0.0, 1.0), torch.device("cpu"))
    assert not made and vec.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_candidate_token_logits_equal_the_whole_heads_and_never_make_them(hidden_states,
                                                                          monkeypatch):
    """The candidate loss of single-token candidates from the LM head's rows of the
    candidate tokens alone: the same loss as the whole logits gathered (float
    rounding), and the whole logits are never computed (parts.logits not called)."""
    parts, hidden, labels = hidden_states
    one = labels[1:2]
    tokens = torch.tensor([[3, 7, 11]])
    batch = Batch(one, one, Choices(torch.tensor([2]), tokens=tokens))
    with torch.no_grad():
        whole = parts.logits(hidden[1:2, 5:6])[:, 0].float().gather(1, tokens)
        total, _ = heads.loss_sum(parts, hidden[1:2], batch)
        hand = torch.nn.functional.cross_entropy(whole, torch.tensor([2]), reduction="sum")

        def refuse(_hidden):
            raise AssertionError("the whole logits were computed")
        monkeypatch.setattr(parts, "logits", refuse)
        again, _ = heads.loss_sum(parts, hidden[1:2], batch)
        picked = heads.candidate_token_logits(parts, hidden[1:2], batch.positions, tokens)
    torch.testing.assert_close(picked, whole, rtol=1e-5, atol=1e-6)
    assert math.isclose(float(total), float(hand), rel_tol=1e-5)
    assert float(again) == float(total)
