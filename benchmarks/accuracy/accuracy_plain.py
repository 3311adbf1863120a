"""The accuracy benchmark's plain baselines, torch and transformers only (no zoexec):

- `PlainTask`: prompts from a template ("Review: {sentence} Sentiment:"), optionally
  after K demonstrations (training examples fixed by a seed, each followed by its label
  word, separated by a blank line), and single-token candidates " word" per label.
- `candidate_logits`: one forward of the HF model over right-padded rows; the hidden
  state of each row's last prompt token is gathered and only there the head (the full
  vocabulary) is computed; the candidates' logits are read from it.
- `candidate_loss`: MeZO's loss for classification: cross-entropy over the candidates'
  logits at the answer position (a softmax over the candidates only), mean over rows.
- `score`: the plain scorer: one forward per example (batch 1), the likeliest
  candidate wins. Accuracy and the seconds it took.
- `mezo_train`: the plain single-process MeZO-SGD loop (Malladi et al., arXiv
  2305.17333, Algorithm 1, as their trainer does it): per step, z drawn from a generator
  seeded by the step's seed and added in place, +eps*z, loss, -2eps*z, loss, +eps*z
  (restore), then the update theta -= lr * g * z with z drawn again: four draws of z
  and two forwards per step. Batches: a fresh seeded permutation of the training rows
  each epoch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(kw_only=True)
class PlainTask:
    """How a row becomes a prompt and which token answers for each label."""

    tokenizer: object
    template: str
    label_words: tuple[str, ...]
    column: str = "sentence"
    demos: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.label_words) < 2:
            raise ValueError(f"label_words {self.label_words!r}: give two or more")
        self.candidates = []
        for word in self.label_words:
            ids = self.tokenizer(" " + word, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(f"label word {word!r} is {len(ids)} tokens; the plain "
                                 f"baselines score single-token candidates only")
            self.candidates.append(ids[0])
        prefix = "".join(self.fill(d) + " " + self.label_words[d["label"]] + "\n\n"
                         for d in self.demos)
        self.prefix = prefix

    def fill(self, row: dict) -> str:
        return self.template.format(**{self.column: row[self.column]})

    def encode(self, row: dict) -> list[int]:
        return list(self.tokenizer(self.prefix + self.fill(row))["input_ids"])


def pick_demos(train: list[dict], k: int, seed: int) -> list[dict]:
    """K training rows fixed by `seed` (the same before every prompt)."""
    return random.Random(seed).sample(train, k) if k else []


def pad_rows(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, their attention mask, and each row's last real position."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return ids, mask, torch.tensor([len(r) - 1 for r in rows])


def candidate_logits(model, rows: list[list[int]], candidates: list[int], pad: int) -> torch.Tensor:
    """[rows, candidates] logits at each row's last token; the head only there."""
    ids, mask, last = pad_rows(rows, pad)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    at_last = hidden[torch.arange(len(rows)), last]
    return model.lm_head(at_last)[:, candidates].float()


def candidate_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """MeZO's classification loss: cross-entropy over the candidates' logits."""
    return F.cross_entropy(logits, labels)


@torch.no_grad()
def score(model, task: PlainTask, rows: list[dict]) -> tuple[float, float]:
    """(accuracy, seconds) of one forward per example, the likeliest candidate."""
    model.eval()
    pad = task.tokenizer.pad_token_id or 0
    start, right = time.perf_counter(), 0
    for row in rows:
        logits = candidate_logits(model, [task.encode(row)], task.candidates, pad)
        right += int(logits.argmax(dim=-1).item() == row["label"])
    return right / len(rows), time.perf_counter() - start


def _perturb(params: list[torch.Tensor], seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype), alpha=scale)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + 12_345) % (2 ** 62)


def batches(rows: list, batch: int, seed: int):
    """Rows in a fresh permutation each epoch (fixed by seed): yields lists of rows."""
    epoch = 0
    while True:
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed * 977 + epoch))
        for start in range(0, len(rows) - batch + 1, batch):
            yield [rows[i] for i in order[start:start + batch]]
        epoch += 1


@torch.no_grad()
def mezo_train(model, task: PlainTask, train: list[dict], *, seed: int, steps: int, lr: float,
               eps: float, batch: int, on_step: Callable | None = None) -> list[dict]:
    """Plain MeZO-SGD with the candidate loss; returns one dict per step (loss_plus,
    loss_minus, g, seconds). `on_step(step, record)` after each step (evaluations)."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    pad = task.tokenizer.pad_token_id or 0
    encoded = [(task.encode(r), r["label"]) for r in train]
    history, source = [], batches(encoded, batch, seed)
    for step in range(steps):
        start, rows = time.perf_counter(), next(source)
        ids, labels = [r[0] for r in rows], torch.tensor([r[1] for r in rows])

        def loss() -> float:
            return float(candidate_loss(candidate_logits(model, ids, task.candidates, pad), labels))

        s = step_seed(seed, step)
        _perturb(params, s, eps)
        loss_plus = loss()
        _perturb(params, s, -2 * eps)
        loss_minus = loss()
        _perturb(params, s, eps)
        g = (loss_plus - loss_minus) / (2 * eps)
        _perturb(params, s, -lr * g)
        history.append({"step": step, "loss_plus": loss_plus, "loss_minus": loss_minus, "g": g,
                        "seconds": time.perf_counter() - start})
        if on_step is not None:
            on_step(step, history[-1])
    return history
