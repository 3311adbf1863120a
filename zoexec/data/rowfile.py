"""Rows of a data file read as a run uses them, not all at once: a row is parsed (and
tokenised, zoexec.data.tasks.Tokens) when a batch, a check or an evaluation asks for
it, so start-up and memory follow the work (steps x batch, the evaluated rows), not
the file's size.

- A JSONL file is indexed once (where each non-blank line starts and ends, 16 bytes a
  row, read in chunks of CHUNK_BYTES: no line is held whole while indexing), and row i
  is read, decoded and parsed when asked for. A line longer than `max_row_bytes` is
  refused in one line naming it, before it is read.
- Other formats (JSON, CSV, Parquet, a save_to_disk folder) are read by the `datasets`
  library into a memory-mapped Arrow table (zoexec.data.records): row i is converted to
  a dict when asked for.
- A text field is cut to `text_budget(seq)` characters before it is tokenised
  (CHARS_PER_TOKEN characters a token, generous: English text averages about 4 with
  the BPE tokenizers of the supported families): a prompt keeps its end (the batch
  keeps a prompt's last tokens anyway, zoexec.data.batch.pack_examples), an answer
  longer than that cannot fit the sequence and is refused.

`Examples` is the task's examples of such rows, made one at a time on demand.
Torch-free."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from zoplan.errors import ZoError
from zoplan.io import loads_strict, not_utf8

CHARS_PER_TOKEN = 32          # characters a token may stand for before text is cut
ROW_BYTES_FLOOR = 16 << 20    # a JSONL row may always be this long (16 MiB)
CHUNK_BYTES = 1 << 20         # the index reads the file this much at a time
MAX_NESTING = 1000            # JSON levels: Python's reader stops near its recursion limit
_BLANK = b" \t\r\n\x0b\x0c"
Row = dict[str, Any]   # a row: its columns' values


class _Indexed(Sequence[Any]):
    """A sequence whose items are made when asked for: a slice is a list of them, an
    index is checked and made positive before `_at` makes the item."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self._at(int(index) % len(self))

    def _at(self, index: int) -> Any:
        raise NotImplementedError


def text_budget(seq: int | None) -> int | None:
    """The characters of a text field tokenised for rows of `seq` tokens (None: no
    cut, e.g. `zoexec lengths`, which measures rows uncut)."""
    return None if seq is None else seq * CHARS_PER_TOKEN


def row_byte_limit(seq: int | None) -> int:
    """The longest JSONL row read for rows of `seq` tokens: ROW_BYTES_FLOOR, or 16
    bytes a character of the text budget where that is more (a field as JSON escapes
    takes up to 6 bytes a character, and a row holds a few fields)."""
    budget = text_budget(seq)
    return ROW_BYTES_FLOOR if budget is None else max(ROW_BYTES_FLOOR, 16 * budget)


def fmt_size(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size:,} bytes"


class JsonlRows(_Indexed):
    """The rows (JSON objects, one a non-blank line) of a JSONL file, each read and
    parsed when asked for; problems are ZoErrors naming the file and the line."""

    def __init__(self, path: Path, *, max_row_bytes: int = ROW_BYTES_FLOOR) -> None:
        import numpy as np

        self.path, self.max_row_bytes = Path(path), max_row_bytes
        starts: list[Any] = []
        ends: list[Any] = []
        try:
            with self.path.open("rb") as handle:
                _index(handle, starts, ends)
        except OSError as exc:
            raise ZoError(f"cannot read data file {self.path}: {exc.strerror or exc}") from None
        self.starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        self.ends = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.starts.size)

    def _at(self, index: int) -> Any:
        start, end = int(self.starts[index]), int(self.ends[index])
        if end - start > self.max_row_bytes:
            raise ZoError(f"{self.path}:{self.line_of(start)}: a row of {fmt_size(end - start)}, "
                          f"over the {fmt_size(self.max_row_bytes)} a row may hold (its text is "
                          f"cut to {CHARS_PER_TOKEN} characters a token of the sequence before "
                          f"tokenising); shorten the row or leave out the columns the task does "
                          f"not read")
        try:
            with self.path.open("rb") as handle:
                handle.seek(start)
                raw = handle.read(end - start)
        except OSError as exc:
            raise ZoError(f"cannot read data file {self.path}: {exc.strerror or exc}") from None
        return self._parse(raw, start)

    def __iter__(self) -> Iterator[Row]:
        for index in range(len(self)):
            yield self[index]

    def _parse(self, raw: bytes, start: int) -> Row:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ZoError(f"data file {self.path}:{self.line_of(start)} is not UTF-8 text "
                          f"({not_utf8(exc, offset=start)})") from None
        try:
            record = loads_strict(text)
        except ValueError as exc:
            why = getattr(exc, "msg", exc)
            if why == "nested too deeply":
                raise ZoError(f"{self.path}:{self.line_of(start)}: JSON nested too deeply (over "
                              f"{MAX_NESTING} levels)") from None
            raise ZoError(f"{self.path}:{self.line_of(start)}: not valid JSON ({why})") from None
        if not isinstance(record, dict):
            raise ZoError(f"{self.path}:{self.line_of(start)}: expected a JSON object, got "
                          f"{type(record).__name__}")
        return record

    def line_of(self, offset: int) -> int:
        """The line number (from 1) of the line starting at byte `offset`."""
        count, done = 1, 0
        with self.path.open("rb") as handle:
            while done < offset:
                chunk = handle.read(min(CHUNK_BYTES, offset - done))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                done += len(chunk)
        return count


def _index(handle: BinaryIO, starts: list[Any], ends: list[Any]) -> None:
    """Append to `starts` and `ends` (int64 arrays) the byte range of every line of
    `handle` holding more than whitespace, reading CHUNK_BYTES at a time."""
    import numpy as np

    blank: Any = np.zeros(256, dtype=bool)
    blank[list(_BLANK)] = True
    pos, line_start, inked = 0, 0, False   # the open line: where it starts, any ink yet
    while True:
        chunk = handle.read(CHUNK_BYTES)
        if not chunk:
            break
        data = np.frombuffer(chunk, dtype=np.uint8)
        ink = np.concatenate(([0], np.cumsum(~blank[data], dtype=np.int64)))
        breaks = np.flatnonzero(data == 10)
        if breaks.size:
            local = np.concatenate(([0], breaks[:-1] + 1))
            has = ink[breaks] - ink[local] > 0
            has[0] |= inked
            begin = np.concatenate(([line_start], pos + breaks[:-1] + 1)).astype(np.int64)
            starts.append(begin[has])
            ends.append((pos + breaks).astype(np.int64)[has])
            line_start, inked = pos + int(breaks[-1]) + 1, bool(ink[-1] - ink[breaks[-1] + 1] > 0)
        else:
            inked = inked or bool(ink[-1] > 0)
        pos += len(chunk)
    if inked:
        starts.append(np.array([line_start], dtype=np.int64))
        ends.append(np.array([pos], dtype=np.int64))


class TableRows(_Indexed):
    """The rows of a memory-mapped `datasets` table, each converted when asked for (a
    text cell that is not UTF-8: a ZoError naming the file)."""

    def __init__(self, data: Any, path: Path, on_bad_text: Callable[[UnicodeDecodeError], str]) -> None:
        self.data, self.path, self.on_bad_text = data, path, on_bad_text

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def _at(self, index: int) -> Any:
        try:
            return dict(self.data[index])
        except UnicodeDecodeError as exc:
            raise ZoError(f"data {self.path} is not UTF-8 text ({self.on_bad_text(exc)})") from None

    def __iter__(self) -> Iterator[Row]:
        try:
            for batch in self.data.iter(batch_size=1000):
                columns = list(batch)
                for values in zip(*(batch[c] for c in columns)):
                    yield dict(zip(columns, values))
        except UnicodeDecodeError as exc:
            raise ZoError(f"data {self.path} is not UTF-8 text ({self.on_bad_text(exc)})") from None


class Examples(_Indexed):
    """A task's examples of `rows`, example i made by `make(rows[i], i + 1)` (the row's
    number, for messages) when first asked for and kept, up to KEPT_EXAMPLES of them (the
    most recently made): a run's epochs reuse the rows they read without reading and
    tokenising them again, and memory stays bounded by the rows used, not the file."""

    KEPT_EXAMPLES: ClassVar[int] = 4096   # a few hundred MB at most for rows of 2,048 tokens

    def __init__(self, rows: Sequence[Row], make: Callable[[Row, int], Any]) -> None:
        self.rows, self.make = rows, make
        self._kept: OrderedDict[int, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self.rows)

    def _at(self, index: int) -> Any:
        kept = self._kept.get(index)
        if kept is not None:
            self._kept.move_to_end(index)
            return kept
        made = self.make(self.rows[index], index + 1)
        self._kept[index] = made
        if len(self._kept) > self.KEPT_EXAMPLES:
            self._kept.popitem(last=False)
        return made

    def __iter__(self) -> Iterator[Any]:
        for number, row in enumerate(self.rows, start=1):
            yield self.make(row, number)

    def map(self, change: Callable[[Any, Row], Any]) -> Examples:
        """These examples, each then changed by `change(example, row)`."""
        make = self.make
        return Examples(self.rows, lambda row, number: change(make(row, number), row))
