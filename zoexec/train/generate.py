"""Greedy decoding through the block pipeline, for `--task generation`'s evaluation.

No KV cache: each new token is one evaluation forward (Trainer.evaluate) of every
unfinished row, prompt and tokens so far, right-padded (causal attention: padding after
a row's last token changes nothing before it), with the head at each row's last token
only (`next_tokens`). The prompts go in calls of the plan's global batch, split over
the data shards as the evaluation's rows are (zoexec.run.evaluate); after each forward
the rank that computes l+ for a shard places its rows' tokens in a vector summed over
the world, so every rank knows every row's token, and all agree on which rows are done
and on when the call ends (every row stopped, or `max_new` tokens): every rank makes
the same forwards, as the slice groups' all-gathers need.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zoexec.data.batch import IGNORE, Batch
from zoexec.data.generation import Decoding
from zoexec.model.heads import HeadParts
from zoexec.train.engine import Trainer


def next_tokens(parts: HeadParts, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The likeliest next token after each row's marked position (labels != IGNORE: its
    last token), float64 [rows, 1]; -1 for a row without a mark."""
    rows, pos = (batch.labels != IGNORE).nonzero(as_tuple=True)
    out = torch.full((batch.rows, 1), -1.0, dtype=torch.float64, device=hidden.device)
    if rows.numel():
        logits = parts.logits(hidden[rows, pos]).float()
        out[rows, 0] = logits.argmax(dim=-1).double()
    return out


def marked_batch(rows: list[tuple[int, ...]], *, pad: int) -> Batch:
    """Rows right-padded to the longest, each marked at its last token (empty rows: a
    pad token, no mark)."""
    width = max([len(r) for r in rows] + [1])
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            labels[i, len(row) - 1] = row[-1]
    return Batch(ids, labels)


def greedy(trainer: Trainer, decoding: Decoding, *, batch: int) -> list[list[int]]:
    """The tokens generated after each of `decoding.prompts` (zoexec.data.generation
    .Decoding: the limit, the stop rule), in calls of `batch` rows over the job."""
    ddp = trainer.env.layout.ddp
    per = max(1, batch // ddp)
    call = per * ddp
    prompts = decoding.prompts
    out: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(prompts), call):
        chunk = list(range(start, min(start + call, len(prompts))))
        _decode_call(trainer, decoding, chunk, out, per=per, call=call)
    return out


def _decode_call(trainer: Trainer, decoding: Decoding, chunk: list[int], out: list[list[int]],
                 *, per: int,
                 call: int) -> None:
    """Generate for the prompts `chunk` (at most `call`), every rank the same forwards."""
    lo = trainer.data_shard * per
    done = [False] * len(chunk)
    for _ in range(decoding.max_new):
        if all(done):
            return
        rows: list[tuple[int, ...]] = []
        for j in range(lo, lo + per):
            live = j < len(chunk) and not done[j]
            rows.append(decoding.prompts[chunk[j]] + tuple(out[chunk[j]]) if live else ())
        tokens = trainer.evaluate(marked_batch(rows, pad=decoding.pad), head=next_tokens)
        shared = _share(trainer, tokens[:, 0], lo=lo, call=call)
        for j, index in enumerate(chunk):
            if not done[j]:
                token = int(shared[j])
                out[index].append(token)
                done[j] = decoding.stops(token)


def _share(trainer: Trainer, tokens: torch.Tensor, *, lo: int, call: int) -> torch.Tensor:
    """Every shard's tokens on every rank: [call] (each shard's from its l+ rank)."""
    vec = torch.zeros(call, dtype=torch.float64)
    if trainer.signs[0] > 0:
        vec[lo:lo + tokens.numel()] = tokens
    if trainer.env.place.world_size > 1:
        vec = vec.to(trainer.token.device)
        dist.all_reduce(vec, group=trainer.env.world)
        vec = vec.cpu()
    return vec
