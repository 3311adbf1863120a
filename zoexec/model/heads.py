"""The head only where the loss or the metric looks, and the losses computed from it.

The last block leaves hidden states [rows, seq, hidden]; position i predicts the label
of position i + 1 (labels IGNORE where nothing is predicted: a prompt, padding). The
final norm and the LM head act on each position alone, so the hidden states of the
positions that predict a label are gathered first and only those go through the norm
and the head (ModelParts.logits): for a classification row that is one position (the
answer position, the prompt's last token), for a completion its completion's tokens,
for packed text nearly all. The figures equal the full computation's up to float
rounding (the head's matrix product over fewer rows). The candidate loss of
single-token candidates goes further: only the LM head's rows of the candidate tokens
are applied (candidate_token_logits), never the [rows, vocabulary] logits.

Losses (a sum and what it is counted over, so that the engine's all-reduce of sums
gives the mean over the global batch whatever the layout):
- the vocabulary loss (no `Batch.choices`): next-token cross-entropy over the whole
  vocabulary, summed over the labelled tokens, counted in tokens (transformers'
  ForCausalLMLoss with reduction "sum");
- the candidate loss (`Batch.choices`, MeZO's classification loss): per example, the
  cross-entropy of the correct candidate among the candidates' scores, summed over the
  examples, counted in examples. A candidate's score is its log-likelihood after the
  prompt: with single-token candidates (`Choices.tokens`) the logits of the candidate
  tokens at the answer position, the softmax over the vocabulary's normaliser cancels
  in the softmax over the candidates; with a row per candidate the mean log-probability
  of its tokens (MeZO's large-model code: forward_wrap_with_option_len in utils.py
  normalises by the candidate's length), or its sum (`Choices.mean` False); a
  multiple-choice example with fewer candidates than the batch's most has empty rows
  (`Choices.valid` False) that score -inf, nothing in the softmax.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
from torch import nn

from zoexec.data.batch import Batch, Choices, Positions
from zoplan.errors import ZoError


class HeadParts(Protocol):
    """What the losses use of the model's parts (ModelParts): the final norm and the
    head on hidden states (and, where the parts have it, token_logits)."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


def gathered_logits(parts: HeadParts, hidden: torch.Tensor, labels: torch.Tensor, where: Positions
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row of each predicting position [N], its target token [N], its logits [N, vocab]
    in fp32): the final norm and the head on the N positions that predict a label only
    (`where`: Batch.positions, found on the host: no wait for the device here)."""
    rows, cols = where.rows, where.cols
    logits = parts.logits(hidden[rows, cols]).float()
    return rows, labels[rows, cols + 1], logits


def token_losses(parts: HeadParts, hidden: torch.Tensor, labels: torch.Tensor, where: Positions
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(row of each labelled token [N], its next-token cross-entropy [N], fp32)."""
    rows, target, logits = gathered_logits(parts, hidden, labels, where)
    return rows, nn.functional.cross_entropy(logits, target, reduction="none")


def row_losses(parts: HeadParts, hidden: torch.Tensor, labels: torch.Tensor, where: Positions) -> torch.Tensor:
    """Per row: [summed next-token CE over its labelled tokens, their count] (float64
    [rows, 2]; a row without a label: zeros)."""
    rows, nll = token_losses(parts, hidden, labels, where)
    out = torch.zeros(labels.shape[0], 2, dtype=torch.float64, device=labels.device)
    out[:, 0].index_add_(0, rows, nll.double())
    out[:, 1].index_add_(0, rows, torch.ones_like(nll, dtype=torch.float64))
    return out


def loss_sum(parts: HeadParts, hidden: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, int]:
    """(summed loss (float64 scalar), what it counts): the vocabulary loss over the
    labelled tokens, or with `batch.choices` the candidate loss over the examples."""
    if batch.choices is None:
        _, nll = token_losses(parts, hidden, batch.labels, batch.positions)
        return nll.double().sum(), int(nll.numel())
    scores = candidate_logits(parts, hidden, batch)
    ce = nn.functional.cross_entropy(scores, batch.choices.answers, reduction="none")
    return ce.double().sum(), int(ce.numel())


def candidate_logits(parts: HeadParts, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """[examples, candidates] fp32 scores whose softmax is the candidate distribution:
    the candidate tokens' logits at each row's answer position (single tokens), or
    the candidates' mean log-probability per token (a row each)."""
    choices = cast(Choices, batch.choices)   # loss_sum's: a batch with choices
    if choices.tokens is not None:
        where = batch.positions
        if set(where.counts) != {1}:
            raise ZoError(f"single-token candidates need one labelled position per row; the "
                          f"batch's {batch.rows} rows have {sum(where.counts)}")
        return candidate_token_logits(parts, hidden, where, choices.tokens)
    sums = row_losses(parts, hidden, batch.labels, batch.positions)
    scores = -sums[:, 0] / sums[:, 1].clamp(min=1) if choices.mean else -sums[:, 0]
    if choices.valid is not None:   # padding rows of fewer candidates
        scores = scores.masked_fill(~choices.valid.reshape(-1), -torch.inf)
    return scores.float().view(-1, choices.size)


def candidate_token_logits(parts: HeadParts, hidden: torch.Tensor, where: Positions,
                           tokens: torch.Tensor) -> torch.Tensor:
    """[rows, candidates] fp32 logits of the single-token candidates at each row's
    answer position. The training loss needs nothing else (the vocabulary's normaliser
    cancels in the softmax over the candidates), so only the LM head's rows of the
    candidate tokens are applied (ModelParts.token_logits): rows x candidates x hidden
    multiply-adds instead of rows x vocabulary x hidden, and no [rows, vocabulary]
    logits. A head without token_logits gives the whole logits, gathered."""
    picked = hidden[where.rows, where.cols]
    by_rows = getattr(parts, "token_logits", None)
    if by_rows is None:
        return parts.logits(picked).float().gather(1, tokens)
    return by_rows(picked, tokens).float()


def row_scores(parts: HeadParts, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Evaluation, per row (float64): with single-token `choices`, the log-probability
    (over the vocabulary) of each candidate token at the row's answer position
    [rows, candidates] (a row without a label: zeros); otherwise [summed next-token CE
    over the row's labelled tokens, their count] [rows, 2]."""
    if batch.choices is None or batch.choices.tokens is None:
        return row_losses(parts, hidden, batch.labels, batch.positions)
    rows, _, logits = gathered_logits(parts, hidden, batch.labels, batch.positions)
    logp = torch.log_softmax(logits, dim=-1).gather(1, batch.choices.tokens[rows])
    out = torch.zeros(batch.rows, batch.choices.tokens.shape[1], dtype=torch.float64,
                      device=logits.device)
    out[rows] = logp.double()
    return out
