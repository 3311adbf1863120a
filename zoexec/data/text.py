"""Training data: a built-in learnable synthetic task, packed text, and per-rank sharding
(the prompt/completion and classification tasks: zoexec.data.tasks).

Every source answers `batch(step, batch_size, seq)` with a `Batch` (token ids and the
labels the loss predicts, IGNORE where nothing is predicted) or a bare LongTensor
[batch_size, seq] of packed text (every token predicted: `as_batch`), deterministic in
(seed, step): every rank builds the same global batch and keeps its own rows with
`shard`, so the layout never changes what the model sees.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch

from zoexec.data import packed
from zoexec.data.batch import IGNORE, Batch, Example, generator
from zoexec.data.packed import Chunks, Packer, shared_folder
from zoexec.data.rowfile import ROW_BYTES_FLOOR, fmt_size
from zoplan.errors import ZoError
from zoplan.io import loads_strict, need_file, not_utf8

_TAG_SYNTHETIC = 0x5359      # separates the data streams' seeds from z's
_TAG_JSONL = 0x4A53


class SyntheticTask:
    """Walks around a fixed random cycle of `alphabet` tokens (chosen by `seed` among the
    vocabulary): every row starts at a random point of the cycle and follows it, so each
    next token is determined by the current one. A model that knows only which tokens
    occur reaches ln(alphabet) (2.77 for 16); one that learned the cycle
    approaches 0; an untrained one sits near ln(vocab). A tiny model trained with MeZO
    goes clearly below ln(vocab) within a few hundred steps (tests/unit/test_data.py)."""

    def __init__(self, *, vocab: int, seed: int = 0, alphabet: int = 16) -> None:
        if vocab < 2 or alphabet < 2:
            raise ZoError(f"synthetic task needs vocab >= 2 and alphabet >= 2, got "
                          f"vocab {vocab}, alphabet {alphabet}")
        self.vocab, self.seed, self.alphabet = vocab, seed, min(alphabet, vocab)
        self.cycle = torch.randperm(vocab, generator=generator(_TAG_SYNTHETIC, seed, -1))[:self.alphabet]

    def batch(self, step: int, batch_size: int, seq: int) -> torch.Tensor:
        starts = torch.randint(self.alphabet, (batch_size, 1),
                               generator=generator(_TAG_SYNTHETIC, self.seed, step))
        return self.cycle[(starts + torch.arange(seq)) % self.alphabet]


# Files that hold a tokenizer's vocabulary (fast tokenizers, SentencePiece, BPE, WordPiece):
# a model folder without any of them has no tokenizer, whatever transformers makes of it
# (for an OPT config it builds an empty GPT-2 tokenizer that turns every text into nothing
# but EOS).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


class JsonlReader:
    """The documents of a JSONL file as token ids, each line checked: {"text": "..."}
    (the `column`; tokenised with the tokenizer of `tokenizer_dir`, an EOS appended
    when the tokenizer has one) or {"input_ids": [...]}; ids within the vocabulary.
    Every problem is a ZoError naming the file and line."""

    def __init__(self, path: str | Path, *, vocab: int, tokenizer_dir: str | Path | None = None,
                 column: str = "text") -> None:
        self.path, self.vocab, self.tokenizer_dir = Path(path), vocab, tokenizer_dir
        self.column = column
        self._tokenizer: Any = None

    def documents(self) -> Iterator[list[int]]:
        need_file(self.path, what="data file")
        offset = 0
        try:
            with self.path.open("rb") as handle:
                for number, raw in enumerate(iter(lambda: handle.readline(ROW_BYTES_FLOOR + 1), b""),
                                             start=1):
                    if len(raw) > ROW_BYTES_FLOOR:   # not read further: refused whole
                        raise ZoError(f"{self.path}:{number}: a document over "
                                      f"{fmt_size(ROW_BYTES_FLOOR)}; split it into several lines "
                                      f"(documents) of at most that")
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ZoError(f"data file {self.path}:{number} is not UTF-8 text "
                                      f"({not_utf8(exc, offset=offset)})") from None
                    offset += len(raw)
                    if line.strip():
                        yield self._line_ids(line, number)
        except OSError as exc:
            raise ZoError(f"cannot read data file {self.path}: {exc.strerror or exc}") from None

    def count_tokens(self) -> int:
        """Tokens of the whole file, each line checked, none kept."""
        return sum(len(ids) for ids in self.documents())

    def _line_ids(self, line: str, number: int) -> list[int]:
        where = f"{self.path}:{number}"
        try:
            record = loads_strict(line)
        except ValueError as exc:
            raise ZoError(f"{where}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
        return self.record_ids(record, where)

    def record_ids(self, record: object, where: str) -> list[int]:
        """The ids of one record ({column: text} or {"input_ids": [...]}), checked."""
        ids: list[int]
        if isinstance(record, dict) and record.get("input_ids") is not None:
            ids = record["input_ids"]
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise ZoError(f"{where}: 'input_ids' must be a list of integers")
        elif isinstance(record, dict) and isinstance(record.get(self.column), str):
            ids = self._tokenize(record[self.column], where)
        else:
            raise ZoError(f"{where}: expected an object with {self.column!r} (string) or "
                          f"'input_ids' (name the text's column with --text-column)")
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise ZoError(f"{where}: token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})")
        return ids

    def _tokenize(self, text: str, where: str) -> list[int]:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_dir, where=where)
        tokenizer = self._tokenizer
        ids = list(tokenizer(text)["input_ids"])
        eos = tokenizer.eos_token_id
        if text.strip() and not [i for i in ids if i != eos]:
            raise ZoError(f"{where}: the tokenizer in {self.tokenizer_dir} turns this text into "
                          f"no tokens (an empty vocabulary?); give the model's own tokenizer "
                          f"files or 'input_ids'")
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        return ids


def load_tokenizer(folder: str | Path | None, *, where: str) -> Any:
    """The tokenizer of model folder `folder` (ZoError, naming `where` needs it, when
    there is no folder, or the folder holds no tokenizer files or a broken one)."""
    if folder is None:
        raise ZoError(f"{where}: text data needs a tokenizer; pass a model directory "
                      f"(init) that holds one, or give 'input_ids'")
    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ZoError(f"{where}: text data needs a tokenizer, and model folder {folder} "
                      f"has none (no {', '.join(TOKENIZER_FILES)}); add the model's "
                      f"tokenizer files or give 'input_ids'")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - broken tokenizer files: the folder's problem
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ZoError(f"no usable tokenizer in {folder}: {reason}") from None


class TextData:
    """Packed text (the `text` task): documents, one per JSONL line or row of a data
    file ({"text": "..."} in the `column`, tokenised with the tokenizer of
    `tokenizer_dir`, an EOS appended when the tokenizer has one, or {"input_ids":
    [...]}), concatenated and cut into rows (windows) of `seq` tokens (the tail shorter
    than `seq` is dropped). Labels are the ids, but for the first token of every
    document (IGNORE): nothing predicts a document's first token from the one before,
    so a document never predicts the next one's tokens.

    Read as the batches need it (zoexec.data.packed: tokenised CHUNK_TOKENS at a time, in
    file order, shared with the node's ranks inside a launch): the rows are visited in
    blocks of BLOCK rows (max(1, packed.CHUNK_TOKENS // seq), consecutive in the file), the
    blocks in file order, the rows of each block in a fresh random order each epoch,
    fixed by (seed, epoch, block). A file of one block is visited as a whole in a
    random order (the order of every text file before the lazy reader)."""

    def __init__(self, path: str | Path, *, vocab: int, seed: int = 0, tokenizer_dir: str | Path | None = None,
                 column: str = "text") -> None:
        self.path, self.vocab, self.seed = Path(path), vocab, seed
        self.tokenizer_dir, self.column = tokenizer_dir, column
        self.packer = Packer(self.path, vocab=vocab, column=column, tokenizer_dir=tokenizer_dir,
                             load=lambda where: load_tokenizer(tokenizer_dir, where=where))
        self.chunks = Chunks(self.packer, shared_folder())
        self.chunks.get(0)   # the first chunk now: a bad start of the file fails at once
        self._orders: dict[tuple[int, int, int], torch.Tensor] = {}
        self._per_epoch: tuple[int, int] | None = None   # (batch, seq) of the last batch

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> TextData:
        return cls(path, **kwargs)

    # ---- the whole stream (evaluation, tests) ----------------------------------------------
    @property
    def tokens(self) -> torch.Tensor:
        """Every token of the file (all of it read)."""
        return self._all()[0]

    @property
    def starts(self) -> torch.Tensor:
        """Whether each token of the file is the first of its document."""
        return self._all()[1]

    def _all(self) -> tuple[torch.Tensor, torch.Tensor]:
        total = self.chunks.cover(sys.maxsize)
        if total == 0:
            raise ZoError(f"data file {self.path} holds no tokens")
        ids, first = self.chunks.span(0, total)
        return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(first.astype(bool))

    def rows(self, seq: int) -> Batch:
        """All packed rows of length `seq` (a Batch of [num_rows, seq]; all read)."""
        count = self._windows(seq, sys.maxsize)
        return self._window_batch(list(range(count)), seq)

    def eval_examples(self, seq: int) -> EvalRows:
        """Every token in rows of `seq` (the last one shorter), in order, for evaluation
        (zoexec.data.batch.Example: no prompt, the document starts skipped): EvalRows, a
        read-only sequence that reads the file once for its length and makes a row from
        the chunks when it is asked for (never the whole stream in memory)."""
        return EvalRows(self, seq)

    # ---- training batches ------------------------------------------------------------------
    def _windows(self, seq: int, upto: int) -> int:
        """Rows of `seq` among the first `upto` (all there are where fewer), made."""
        tokens = self.chunks.cover(upto * seq if upto < sys.maxsize else sys.maxsize)
        count = tokens // seq
        if count == 0 and self.chunks.total is not None:
            if self.chunks.total == 0:
                raise ZoError(f"data file {self.path} holds no tokens")
            raise ZoError(f"data file {self.path} has {self.chunks.total} tokens, "
                          f"fewer than one sequence of {seq}")
        return count

    def total_rows(self, seq: int) -> int | None:
        """Rows of `seq` in the file, once it was read to its end (else None)."""
        total = self.chunks.total
        return None if total is None else total // seq

    def picks(self, step: int, batch_size: int, seq: int) -> list[int]:
        """The rows (windows) of step `step`'s batch of `batch_size`."""
        block = max(1, packed.CHUNK_TOKENS // seq)
        self._windows(seq, 1)   # at least one row, or the one line saying why not
        self._per_epoch = (batch_size, seq)
        out = []
        for k in range(step * batch_size, (step + 1) * batch_size):
            count = self.total_rows(seq)
            epoch, r = (0, k) if count is None else divmod(k, count)
            j = r // block
            have = self._windows(seq, (j + 1) * block)   # block j made (or the end found)
            if count is None and have < (j + 1) * block:   # the file ended before it
                count = have
                epoch, r = divmod(k, count)
                j = r // block
            size = block if count is None else min(block, count - j * block)
            out.append(j * block + int(self._order(size, epoch, j)[r - j * block]))
        return out

    def _order(self, size: int, epoch: int, block: int) -> torch.Tensor:
        key = (size, epoch, block)
        if key not in self._orders:
            if len(self._orders) > 4:
                self._orders.clear()
            parts = (_TAG_JSONL, self.seed, epoch) + ((block,) if block else ())
            self._orders[key] = torch.randperm(size, generator=generator(*parts))
        return self._orders[key]

    def _window_batch(self, windows: list[int], seq: int) -> Batch:
        ids: np.ndarray = np.empty((len(windows), seq), dtype=np.int64)
        first: np.ndarray = np.empty((len(windows), seq), dtype=bool)
        for row, window in enumerate(windows):
            a, f = self.chunks.span(window * seq, (window + 1) * seq)
            ids[row], first[row] = a, f
        tensor = torch.from_numpy(ids)
        return Batch(tensor, tensor.masked_fill(torch.from_numpy(first), IGNORE))

    def batch(self, step: int, batch_size: int, seq: int) -> Batch:
        return self._window_batch(self.picks(step, batch_size, seq), seq)

    def cover_steps(self, steps: int, batch_size: int, seq: int) -> None:
        """Make the chunks the batches of steps 0..steps-1 read (all, where the file is
        shorter)."""
        block = max(1, packed.CHUNK_TOKENS // seq)
        self._windows(seq, -(-max(1, steps) * batch_size // block) * block)

    def epoch_of(self, step: int) -> float | None:
        """Passes over the packed rows after `step` (the metrics' "epoch"): once the
        file was read to its end and a batch drawn (else None)."""
        if self._per_epoch is None:
            return None
        batch_size, seq = self._per_epoch
        count = self.total_rows(seq)
        return (step + 1) * batch_size / count if count else None


class EvalRows(Sequence[Example]):
    """The evaluation rows of packed text (TextData.eval_examples): row i is tokens
    [i * seq, (i + 1) * seq) of the stream (the last row shorter) as an Example (no
    prompt, the target the ids, `skip` the positions of the documents' first tokens).
    The stream's length is found at once (the file read to its end, each line checked;
    zoexec.data.packed keeps KEPT chunks of it); a row (or a slice of rows: one span of
    the chunks) is made from the chunks when it is asked for. Read in order (the
    evaluator's calls go from the first row to the last), each chunk is made (or, in a
    launch, read from the node's chunk files) once a pass. Not pickled as it is: a copy
    is rebuilt from the file (the chunks' tokenizer is loaded, not sent)."""

    def __init__(self, data: TextData, seq: int) -> None:
        if seq < 1:
            raise ZoError(f"evaluation rows need a seq of at least 1, got {seq}")
        self.data, self.seq = data, seq
        self.total = data.chunks.cover(sys.maxsize)
        if self.total == 0:
            raise ZoError(f"data file {data.path} holds no tokens")
        self._count = -(-self.total // seq)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Example: ...

    @overload
    def __getitem__(self, index: slice) -> list[Example]: ...

    def __getitem__(self, index: int | slice) -> Example | list[Example]:
        if isinstance(index, slice):
            rows = range(*index.indices(self._count))
            if rows.step != 1:
                return [self._rows(i, i + 1)[0] for i in rows]
            return self._rows(rows.start, rows.stop) if rows else []
        row = index + self._count if index < 0 else index
        if not 0 <= row < self._count:
            raise IndexError(f"row {index} of {self._count}")
        return self._rows(row, row + 1)[0]

    def _rows(self, first: int, stop: int) -> list[Example]:
        """Rows first..stop - 1 (within range), from one span of the chunks."""
        begin, end = first * self.seq, min(stop * self.seq, self.total)
        ids, starts = self.data.chunks.span(begin, end)
        out = []
        for lo in range(0, end - begin, self.seq):
            hi = min(lo + self.seq, end - begin)
            skip = np.flatnonzero(starts[lo:hi])
            out.append(Example((), tuple(ids[lo:hi].tolist()), tuple(skip.tolist())))
        return out

    def __reduce__(self) -> tuple[Callable[..., EvalRows], tuple[object, ...]]:
        data = self.data
        return _eval_rows, (data.path, data.vocab, data.tokenizer_dir, data.column, self.seq)


def _eval_rows(path: Path, vocab: int, tokenizer_dir: str | Path | None, column: str,
               seq: int) -> EvalRows:
    """EvalRows rebuilt from the file (an unpickled copy)."""
    return EvalRows(TextData(path, vocab=vocab, tokenizer_dir=tokenizer_dir, column=column), seq)


JsonlData = TextData   # the name of the text source before tasks (tests, scripts)


def check_data(source: str, *, vocab: int, batch: int, seq: int, tokenizer_dir: str | Path | None = None,
               column: str = "text", steps: int | None = None) -> None:
    """What a rank's text source would refuse, found before any rank starts (zoexec's
    preflight): the documents the batches of the first `steps` steps read (None: every
    document) read, checked and tokenised as the ranks will (inside a launch, into the
    chunks they then read: zoexec.data.packed), and enough tokens for one global batch
    of `batch` rows of `seq` tokens."""
    if source == "synthetic":
        SyntheticTask(vocab=vocab)
        return
    data = TextData(source, vocab=vocab, tokenizer_dir=tokenizer_dir, column=column)
    if steps is None:
        data.chunks.cover(sys.maxsize)
    else:
        data.cover_steps(steps, batch, seq)
    tokens = data.chunks.cover(batch * seq)
    if tokens == 0:
        raise ZoError(f"data file {source} holds no tokens")
    if tokens < batch * seq:
        raise ZoError(f"data file {source} has {tokens} tokens, fewer than one batch of the "
                      f"plan ({batch} x {seq} = {batch * seq} tokens)")
