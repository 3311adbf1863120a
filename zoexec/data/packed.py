"""Packed text read as a run uses it: the documents of a data file tokenised in file
order, CHUNK_TOKENS tokens at a time, only as far as the batches asked for reach.

- A document is tokenised in pieces of at most PIECE_CHARS characters (ids: of as many
  ids), cut before a whitespace character where there is one in the piece's second
  half: a document's memory is a piece's tokens, never the whole document's. A
  document of one piece is tokenised exactly as before (the tokenizer's special tokens,
  an EOS appended when missing); of several, the first piece with the special tokens,
  the others without, the EOS after the last (a byte-level BPE tokenizer, whose words
  carry the space before them, gives the same ids as the whole text).
- Chunk c holds tokens [c * CHUNK_TOKENS, (c + 1) * CHUNK_TOKENS) of the packed stream
  (the last chunk fewer) and where the next one starts (a Cursor: the document's line or
  row, the piece, the tokens of it already taken), so chunk c + 1 is made from chunk
  c's end without reading anything before it.
- Chunks are kept in memory (the newest KEPT of them), or, inside a launch's private
  folder (zoexec.launch.spawn.private_folder: the launcher's preflight and every local
  rank see the same folder; under torchrun the folder of the agent's ranks,
  spawn.node_folder), written there once per node: the first process that needs
  a chunk makes it under a lock and writes it atomically (a temporary name, then a
  rename), the others read it. A chunk file is trusted only after its header (magic,
  the key of the data file, tokenizer and options it was made from, its index, its
  length) and its payload's digest are checked; one that fails is made again.

Torch-free (numpy)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from zoexec.data.hugeline import HugeText, scan_line
from zoexec.data.records import open_rows
from zoexec.data.rowfile import ROW_BYTES_FLOOR
from zoplan.errors import ZoError
from zoplan.io import loads_strict, need_file, not_utf8

CHUNK_TOKENS = 1 << 18      # tokens of the packed stream a chunk holds (1 MiB as int32)
PIECE_CHARS = 1 << 16       # characters (or ids) of a document tokenised at a time
KEPT = 8                    # chunks a process keeps in memory
SHARED_FILES = 256          # chunk files a node keeps of one data file (1.25 GiB: 5 bytes a
                            # token); those farthest from a new one are removed, and made
                            # again if a rank comes back to them (a later epoch)
SHARED_PREFIX = "zoexec-rdzv-"   # a launch's private folder, a torchrun node's (zoexec.store.shmfiles)
_MAGIC = b"ZOTK1\n"
_VERSION = 1


class Cursor(NamedTuple):
    """Where a chunk's first token is: the document's byte offset (JSONL) or row index
    (`pos`) and its line or row number (`line`, from 1), the character (or id) where
    the piece starts (`at`), the piece's index (`piece`), the piece's tokens already in
    the previous chunk (`skip`)."""

    pos: int = 0
    line: int = 1
    at: int = 0
    piece: int = 0
    skip: int = 0


@dataclass(frozen=True)
class Head:
    """A chunk's length, where the next one starts, and whether the data ended in it."""

    count: int
    next: Cursor
    ended: bool


def document_of(record: object, where: str, *, column: str) -> list[int] | str | HugeText:
    """A record's document: its 'input_ids' (checked to be integers) or its text (read
    in pieces from a line too long to read whole: HugeText)."""
    if isinstance(record, HugeText):
        return record
    if isinstance(record, dict) and record.get("input_ids") is not None:
        ids = record["input_ids"]
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise ZoError(f"{where}: 'input_ids' must be a list of integers")
        return ids
    if isinstance(record, dict) and isinstance(record.get(column), str):
        text: str = record[column]
        return text
    raise ZoError(f"{where}: expected an object with {column!r} (string) or "
                  f"'input_ids' (name the text's column with --text-column)")


def check_vocab(ids: Sequence[int], vocab: int, where: str) -> None:
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ZoError(f"{where}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")


def pieces(doc: list[int] | str | HugeText, at: int) -> Iterator[tuple[int, list[int] | str, bool]]:
    """(start, piece, last) of `doc` from `at` (a piece boundary): cuts every
    PIECE_CHARS characters or ids, a text's before the last whitespace of the piece's
    second half where there is one (a line too long to read whole: PIECE_CHARS bytes
    of its JSON, zoexec.data.hugeline; `at` a file offset)."""
    if isinstance(doc, HugeText):
        yield from doc.pieces(at, PIECE_CHARS)
        return
    size = len(doc)
    while True:
        end = min(size, at + PIECE_CHARS)
        if isinstance(doc, str) and end < size:
            cut = max(doc.rfind(" ", at + PIECE_CHARS // 2, end), doc.rfind("\n", at + PIECE_CHARS // 2, end))
            end = cut if cut > at else end
        yield at, doc[at:end], end >= size
        if end >= size:
            return
        at = end


class Packer:
    """Makes the chunks of packed text of a data file: its documents, in file order,
    tokenised with the tokenizer `load()` gives (loaded when first needed), each line or
    row checked; problems are ZoErrors naming the file and line."""

    def __init__(self, path: Path, *, vocab: int, column: str, load: Callable[[str], Any],
                 tokenizer_dir: str | Path | None) -> None:
        self.path, self.vocab, self.column = Path(path), vocab, column
        self.load, self.tokenizer_dir = load, tokenizer_dir
        self.jsonl = self.path.suffix.lower() == ".jsonl" and not self.path.is_dir()
        self._tokenizer: Any = None
        self._rows: Sequence[dict[str, Any]] | None = None
        self._huge: dict[int, HugeText] = {}   # lines too long to read whole, by offset
        if self.jsonl:
            need_file(self.path, what="data file")

    # ---- documents -------------------------------------------------------------------------
    def records(self, cursor: Cursor) -> Iterator[tuple[int, int, object, str]]:
        """(pos, line, record, where) of every document from `cursor`'s on."""
        if not self.jsonl:
            if self._rows is None:
                self._rows = open_rows(self.path)
            for index in range(cursor.pos, len(self._rows)):
                yield index, index + 1, self._rows[index], f"{self.path} row {index + 1}"
            return
        try:
            with self.path.open("rb") as handle:
                handle.seek(cursor.pos)
                offset, number = cursor.pos, cursor.line
                for raw in iter(lambda: handle.readline(ROW_BYTES_FLOOR + 1), b""):
                    if len(raw) > ROW_BYTES_FLOOR:   # not read whole: its text in pieces
                        where = f"{self.path}:{number}"
                        huge = self._huge.get(offset)
                        if huge is None:
                            huge = scan_line(self.path, handle, offset, column=self.column, where=where,
                                         limit=ROW_BYTES_FLOOR)
                            self._huge[offset] = huge
                        yield offset, number, huge, where
                        handle.seek(huge.line_end + 1)
                        offset, number = huge.line_end + 1, number + 1
                        continue
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ZoError(f"data file {self.path}:{number} is not UTF-8 text "
                                      f"({not_utf8(exc, offset=offset)})") from None
                    if line.strip():
                        where = f"{self.path}:{number}"
                        try:
                            record = loads_strict(line)
                        except ValueError as exc:
                            raise ZoError(f"{where}: not valid JSON "
                                          f"({getattr(exc, 'msg', exc)})") from None
                        yield offset, number, record, where
                    offset += len(raw)
                    number += 1
        except OSError as exc:
            raise ZoError(f"cannot read data file {self.path}: {exc.strerror or exc}") from None

    # ---- tokens ----------------------------------------------------------------------------
    def encode(self, text: str, *, special: bool, where: str) -> list[int]:
        """The tokenizer's ids of `text` (every tokenizer call of packed text is this one)."""
        if self._tokenizer is None:
            self._tokenizer = self.load(where)
        return list(self._tokenizer(text, add_special_tokens=special)["input_ids"])

    def piece_ids(self, piece: list[int] | str, *, first: bool, last: bool, where: str) -> list[int]:
        """The ids of a piece of a document: a text tokenised (the special tokens with
        the first piece, an EOS after the last when the tokenizer has one and it is not
        there), checked against the vocabulary."""
        if not isinstance(piece, str):
            check_vocab(piece, self.vocab, where)
            return piece
        ids = self.encode(piece, special=first, where=where)
        eos = self._tokenizer.eos_token_id
        if piece.strip() and not [i for i in ids if i != eos]:
            raise ZoError(f"{where}: the tokenizer in {self.tokenizer_dir} turns this text into "
                          f"no tokens (an empty vocabulary?); give the model's own tokenizer "
                          f"files or 'input_ids'")
        if last and eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        check_vocab(ids, self.vocab, where)
        return ids

    def make(self, cursor: Cursor, size: int) -> tuple[np.ndarray, np.ndarray, Head]:
        """The `size` tokens of the stream from `cursor` (fewer where the data ends):
        the ids (int32), each token's "first of its document" flag (uint8), the Head."""
        ids: list[int] = []
        first: list[int] = []
        for pos, line, record, where in self.records(cursor):
            doc = document_of(record, where, column=self.column)
            mine = pos == cursor.pos and line == cursor.line
            at, index, skip = (cursor.at, cursor.piece, cursor.skip) if mine else (0, 0, 0)
            for start, piece, last in pieces(doc, at):
                if len(ids) == size:
                    return self._done(ids, first, Cursor(pos, line, start, index, 0), ended=False)
                got = self.piece_ids(piece, first=index == 0, last=last, where=where)
                flags = [0] * len(got)
                if index == 0 and got:
                    flags[0] = 1
                take = got[skip:skip + size - len(ids)]
                ids += take
                first += flags[skip:skip + len(take)]
                if skip + len(take) < len(got):   # the chunk is full inside this piece
                    return self._done(ids, first, Cursor(pos, line, start, index, skip + len(take)),
                                      ended=False)
                index, skip = index + 1, 0
        return self._done(ids, first, Cursor(), ended=True)

    @staticmethod
    def _done(ids: list[int], first: list[int], cursor: Cursor, *, ended: bool
              ) -> tuple[np.ndarray, np.ndarray, Head]:
        return (np.asarray(ids, dtype=np.int32), np.asarray(first, dtype=np.uint8),
                Head(len(ids), cursor, ended))

    def key(self) -> str:
        """What the chunks are made of: the data file (path, size, time, inode; a
        folder's files), the tokenizer's files, the column, the vocabulary, the chunk
        and piece sizes."""
        def stamp(path: Path) -> list[object]:
            try:
                st = path.stat()
            except OSError:
                return [str(path), None]
            return [str(path), st.st_size, st.st_mtime_ns, st.st_ino]

        data = [self.path.resolve()]
        if self.path.is_dir():
            data += sorted(p for p in self.path.rglob("*") if p.is_file())
        tokenizer = (sorted(p for p in Path(self.tokenizer_dir).iterdir() if p.is_file())
                     if self.tokenizer_dir is not None and Path(self.tokenizer_dir).is_dir() else [])
        parts = [_VERSION, [stamp(p) for p in data], [stamp(p) for p in tokenizer], self.column,
                 self.vocab, CHUNK_TOKENS, PIECE_CHARS]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def shared_folder() -> Path | None:
    """The folder where chunks are shared with the node's other processes: a
    launch's private folder or a torchrun node's (tempfile's folder while a launch or
    a torchrun rank runs), else None."""
    folder = tempfile.tempdir
    if folder is None or not Path(folder).name.startswith(SHARED_PREFIX):
        return None
    return Path(folder) / "tokens"


class Chunks:
    """The chunks of one data file (Packer), made in order as they are first needed,
    the newest KEPT kept in memory; shared through the files of `folder` (None: none)."""

    def __init__(self, packer: Packer, folder: Path | None) -> None:
        self.packer, self.folder = packer, folder
        self.name = packer.key() if folder is not None else ""
        self.heads: dict[int, Head] = {}
        self._kept: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    @property
    def total(self) -> int | None:
        """Tokens of the whole stream, once its last chunk was made (else None)."""
        last = self.last()
        return None if last is None else last * CHUNK_TOKENS + self.heads[last].count

    def last(self) -> int | None:
        """The index of the last chunk, once known."""
        last = len(self.heads) - 1
        return last if last >= 0 and self.heads[last].ended else None

    def get(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk `index`'s ids and flags (those before it made first when they were not)."""
        kept = self._kept.get(index)
        if kept is not None:
            self._kept.move_to_end(index)
            return kept
        if index > len(self.heads):
            self.head(index - 1)
        cursor = Cursor() if index == 0 else self.heads[index - 1].next
        made = self._load(index) if self.folder is not None else None
        if made is None:
            made = self._shared(index, cursor) if self.folder is not None else \
                self.packer.make(cursor, CHUNK_TOKENS)
        ids, first, head = made
        self.heads[index] = head
        self._kept[index] = (ids, first)
        if len(self._kept) > KEPT:
            self._kept.popitem(last=False)
        return ids, first

    def head(self, index: int) -> Head:
        """Chunk `index`'s Head (the chunks up to it made, in order, where they were not)."""
        while index not in self.heads:
            self.get(len(self.heads))   # heads are made in order: 0..len - 1 are known
        return self.heads[index]

    def cover(self, tokens: int) -> int:
        """Make the chunks holding the stream's first `tokens` tokens (those there are);
        returns how many tokens there are of them."""
        last = self.last()
        if last is not None:
            return min(tokens, last * CHUNK_TOKENS + self.heads[last].count)
        index = max(0, len(self.heads) - 1)   # those before are made and not the last
        while index * CHUNK_TOKENS < tokens:
            if self.head(index).ended:
                return min(tokens, index * CHUNK_TOKENS + self.heads[index].count)
            index += 1
        return tokens

    def span(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens start..stop of the stream (made up to there), ids and flags."""
        ids, flags = [], []
        for index in range(start // CHUNK_TOKENS, (stop - 1) // CHUNK_TOKENS + 1):
            a, f = self.get(index)
            lo = max(start - index * CHUNK_TOKENS, 0)
            hi = min(stop - index * CHUNK_TOKENS, a.size)
            ids.append(a[lo:hi])
            flags.append(f[lo:hi])
        return np.concatenate(ids), np.concatenate(flags)

    # ---- files of the node -----------------------------------------------------------------
    def _path(self, index: int) -> Path:
        return self.folder / f"{self.name}-{index}.tok" if self.folder else Path()

    def _shared(self, index: int, cursor: Cursor) -> tuple[np.ndarray, np.ndarray, Head]:
        """Chunk `index` made by this process under the node's lock, unless another made
        it meanwhile (then read)."""
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / f"{self.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            made = self._load(index)
            if made is not None:
                return made
            made = self.packer.make(cursor, CHUNK_TOKENS)
            self._write(index, *made)
            self._prune(index)
            return made

    def _prune(self, index: int) -> None:
        """Keep the SHARED_FILES chunk files nearest chunk `index` (a reader that finds
        one gone makes it again)."""
        assert self.folder is not None
        made = list(self.folder.glob(f"{self.name}-*.tok"))
        if len(made) <= SHARED_FILES:
            return
        made.sort(key=lambda path: abs(int(path.stem.rsplit("-", 1)[1]) - index))
        for path in made[SHARED_FILES:]:
            path.unlink(missing_ok=True)

    def _write(self, index: int, ids: np.ndarray, first: np.ndarray, head: Head) -> None:
        payload = ids.tobytes() + first.tobytes()
        header = json.dumps({"key": self.name, "chunk": index, "count": head.count,
                             "next": list(head.next), "ended": head.ended,
                             "digest": hashlib.blake2b(payload, digest_size=16).hexdigest()}).encode()
        path = self._path(index)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_MAGIC + struct.pack("<I", len(header)) + header + payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _load(self, index: int) -> tuple[np.ndarray, np.ndarray, Head] | None:
        """Chunk `index` from its file, if there is one that checks out: else None."""
        try:
            raw = self._path(index).read_bytes()
        except OSError:
            return None
        try:
            if not raw.startswith(_MAGIC):
                return None
            size = struct.unpack_from("<I", raw, len(_MAGIC))[0]
            begin = len(_MAGIC) + 4
            header = json.loads(raw[begin:begin + size])
            payload = raw[begin + size:]
            count = int(header["count"])
            if (header["key"] != self.name or header["chunk"] != index or len(payload) != 5 * count
                    or hashlib.blake2b(payload, digest_size=16).hexdigest() != header["digest"]):
                return None
            ids = np.frombuffer(payload, dtype=np.int32, count=count)
            first = np.frombuffer(payload, dtype=np.uint8, offset=4 * count, count=count)
            return ids, first, Head(count, Cursor(*header["next"]), bool(header["ended"]))
        except (ValueError, KeyError, TypeError, struct.error):
            return None
