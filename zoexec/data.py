"""Training data: a built-in learnable synthetic task, JSONL files, and per-rank sharding.

Every source answers `batch(step, batch_size, seq) -> LongTensor [batch_size, seq]`,
deterministic in (seed, step): every rank builds the same global batch and keeps its
own rows with `shard`, so the layout never changes what the model sees.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch

from zoexec.zo import mix_seed
from zoplan.errors import ZoError

_TAG_SYNTHETIC = 0x5359      # separates the data streams' seeds from z's
_TAG_JSONL = 0x4A53


def _generator(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(mix_seed(*parts))


class SyntheticTask:
    """Walks around a fixed random cycle of `alphabet` tokens (chosen by `seed` among the
    vocabulary): every row starts at a random point of the cycle and follows it, so each
    next token is determined by the current one. A model that knows only which tokens
    occur reaches ln(alphabet) (`unigram_loss`, 2.77 for 16); one that learned the cycle
    approaches 0; an untrained one sits near ln(vocab). A tiny model trained with MeZO
    goes clearly below ln(vocab) within a few hundred steps (tests/test_data.py)."""

    def __init__(self, *, vocab: int, seed: int = 0, alphabet: int = 16) -> None:
        if vocab < 2 or alphabet < 2:
            raise ZoError(f"synthetic task needs vocab >= 2 and alphabet >= 2, got "
                          f"vocab {vocab}, alphabet {alphabet}")
        self.vocab, self.seed, self.alphabet = vocab, seed, min(alphabet, vocab)
        self.cycle = torch.randperm(vocab, generator=_generator(_TAG_SYNTHETIC, seed, -1))[:self.alphabet]

    @property
    def unigram_loss(self) -> float:
        return math.log(self.alphabet)

    def batch(self, step: int, batch_size: int, seq: int) -> torch.Tensor:
        starts = torch.randint(self.alphabet, (batch_size, 1),
                               generator=_generator(_TAG_SYNTHETIC, self.seed, step))
        return self.cycle[(starts + torch.arange(seq)) % self.alphabet]


# Files that hold a tokenizer's vocabulary (fast tokenizers, SentencePiece, BPE, WordPiece):
# a model folder without any of them has no tokenizer, whatever transformers makes of it
# (for an OPT config it builds an empty GPT-2 tokenizer that turns every text into nothing
# but EOS).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


class JsonlReader:
    """The documents of a JSONL file as token ids, each line checked: {"text": "..."}
    (tokenised with the tokenizer of `tokenizer_dir`, an EOS appended when the tokenizer
    has one) or {"input_ids": [...]}; ids within the vocabulary. Every problem is a
    ZoError naming the file and line."""

    def __init__(self, path, *, vocab: int, tokenizer_dir=None) -> None:
        self.path, self.vocab, self.tokenizer_dir = Path(path), vocab, tokenizer_dir
        self._tokenizer = None

    def documents(self) -> Iterator[list[int]]:
        if not self.path.is_file():
            raise ZoError(f"data file {self.path} does not exist")
        try:
            with self.path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    if line.strip():
                        yield self._line_ids(line, number)
        except UnicodeDecodeError:
            raise ZoError(f"data file {self.path} is not UTF-8 text") from None
        except OSError as exc:
            raise ZoError(f"cannot read data file {self.path}: {exc.strerror or exc}") from None

    def count_tokens(self) -> int:
        """Tokens of the whole file, each line checked, none kept."""
        return sum(len(ids) for ids in self.documents())

    def _line_ids(self, line: str, number: int) -> list[int]:
        where = f"{self.path}:{number}"
        try:
            record = json.loads(line, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise ZoError(f"{where}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
        if isinstance(record, dict) and "input_ids" in record:
            ids = record["input_ids"]
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise ZoError(f"{where}: 'input_ids' must be a list of integers")
        elif isinstance(record, dict) and isinstance(record.get("text"), str):
            ids = self._tokenize(record["text"], where)
        else:
            raise ZoError(f"{where}: expected an object with 'text' (string) or 'input_ids'")
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise ZoError(f"{where}: token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})")
        return ids

    def _tokenize(self, text: str, where: str) -> list[int]:
        tokenizer = self._tokenizer or self._load_tokenizer(where)
        ids = list(tokenizer(text)["input_ids"])
        eos = tokenizer.eos_token_id
        if text.strip() and not [i for i in ids if i != eos]:
            raise ZoError(f"{where}: the tokenizer in {self.tokenizer_dir} turns this text into "
                          f"no tokens (an empty vocabulary?); give the model's own tokenizer "
                          f"files or 'input_ids'")
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        return ids

    def _load_tokenizer(self, where: str):
        if self.tokenizer_dir is None:
            raise ZoError(f"{where}: text data needs a tokenizer; pass a model directory "
                          f"(init) that holds one, or give 'input_ids'")
        folder = Path(self.tokenizer_dir)
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise ZoError(f"{where}: text data needs a tokenizer, and model folder {folder} "
                          f"has none (no {', '.join(TOKENIZER_FILES)}); add the model's "
                          f"tokenizer files or give 'input_ids'")
        from transformers import AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - broken tokenizer files: the folder's problem
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ZoError(f"no usable tokenizer in {folder}: {reason}") from None
        return self._tokenizer


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


class JsonlData:
    """A JSONL file, one object per line: {"text": "..."} (tokenised with the tokenizer
    of `tokenizer_dir`, an EOS appended when the tokenizer has one) or
    {"input_ids": [...]} (JsonlReader checks each line). All documents are concatenated
    and cut into rows of `seq` tokens (the tail shorter than `seq` is dropped); rows are
    visited in a fresh random order each epoch, fixed by `seed`."""

    def __init__(self, path, *, vocab: int, seed: int = 0, tokenizer_dir=None) -> None:
        self.path, self.vocab, self.seed = Path(path), vocab, seed
        self.tokenizer_dir = tokenizer_dir
        self.tokens = self._read()
        self._rows: dict[int, torch.Tensor] = {}
        self._orders: dict[tuple[int, int], torch.Tensor] = {}

    def _read(self) -> torch.Tensor:
        reader = JsonlReader(self.path, vocab=self.vocab, tokenizer_dir=self.tokenizer_dir)
        stream: list[int] = []
        for ids in reader.documents():
            stream.extend(ids)
        if not stream:
            raise ZoError(f"data file {self.path} holds no tokens")
        return torch.tensor(stream, dtype=torch.long)

    def rows(self, seq: int) -> torch.Tensor:
        """All packed rows of length `seq`: [num_rows, seq]."""
        if seq not in self._rows:
            num_rows = self.tokens.numel() // seq
            if num_rows == 0:
                raise ZoError(f"data file {self.path} has {self.tokens.numel()} tokens, "
                              f"fewer than one sequence of {seq}")
            self._rows[seq] = self.tokens[:num_rows * seq].view(num_rows, seq)
        return self._rows[seq]

    def _order(self, num_rows: int, epoch: int) -> torch.Tensor:
        key = (num_rows, epoch)
        if key not in self._orders:
            if len(self._orders) > 4:
                self._orders.clear()
            self._orders[key] = torch.randperm(num_rows, generator=_generator(_TAG_JSONL, self.seed, epoch))
        return self._orders[key]

    def batch(self, step: int, batch_size: int, seq: int) -> torch.Tensor:
        rows = self.rows(seq)
        num_rows = rows.shape[0]
        picks = []
        for k in range(step * batch_size, (step + 1) * batch_size):
            picks.append(self._order(num_rows, k // num_rows)[k % num_rows])
        return rows[torch.stack(picks)]


def shard(batch: torch.Tensor, *, data_shard: int, num_shards: int) -> torch.Tensor:
    """This rank's contiguous rows of the global batch (data_shard in 0..num_shards-1)."""
    rows = batch.shape[0]
    if num_shards < 1 or not 0 <= data_shard < num_shards:
        raise ZoError(f"data shard {data_shard} is not in 0..{num_shards - 1}")
    if rows % num_shards:
        raise ZoError(f"global batch ({rows}) is not divisible by the data shards ({num_shards})")
    per = rows // num_shards
    return batch[data_shard * per:(data_shard + 1) * per]


def check_data(source: str, *, vocab: int, batch: int, seq: int, tokenizer_dir=None) -> None:
    """What a rank's data source would refuse, found before any rank starts (zoexec's
    preflight): every line of a JSONL file read and checked as the ranks will (tokens
    counted, not kept), and enough tokens for one global batch of `batch` rows of `seq`
    tokens."""
    if source == "synthetic":
        SyntheticTask(vocab=vocab)
        return
    tokens = JsonlReader(source, vocab=vocab, tokenizer_dir=tokenizer_dir).count_tokens()
    if tokens == 0:
        raise ZoError(f"data file {source} holds no tokens")
    if tokens < batch * seq:
        raise ZoError(f"data file {source} has {tokens} tokens, fewer than one batch of the "
                      f"plan ({batch} x {seq} = {batch * seq} tokens)")


def make_source(source: str, *, vocab: int, seed: int = 0, tokenizer_dir=None):
    """"synthetic" -> SyntheticTask, anything else -> JsonlData(path)."""
    if source == "synthetic":
        return SyntheticTask(vocab=vocab, seed=seed)
    return JsonlData(source, vocab=vocab, seed=seed, tokenizer_dir=tokenizer_dir)
