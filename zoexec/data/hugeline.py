"""A packed-text document on a JSONL line too long to read whole (over ROW_BYTES_FLOOR):
its text is found and decoded a piece at a time, so that its memory is a piece's, never
the line's.

The line's bytes are scanned once, CHUNK at a time, for its JSON structure: an object
whose keys are found at the top level, every string skipped by its unescaped quote,
brackets counted. The value of the text column must be a string; "input_ids" on such
a line is refused (a list of ids that long cannot be read in pieces: split it). A
piece is the string's raw bytes from a piece boundary, PIECE_BYTES of them cut before
the last space of the second half (a space is never inside an escape or a UTF-8
sequence), else before an escape or a UTF-8 sequence that the cut would split, and is
decoded as a JSON string of its own. Torch-free."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from zoexec.data.rowfile import fmt_size
from zoplan.errors import ZoError
from zoplan.io import loads_strict

CHUNK = 1 << 20
_SPECIAL = re.compile(rb'["\\{}\[\]:,]')
_IN_STRING = re.compile(rb'["\\]')
_BLANK = b" \t\r\n"


@dataclass(frozen=True)
class HugeText:
    """The raw byte range [start, end) of the text column's string on the line (file
    offsets), and the line's end (its newline, or the file's end)."""

    path: Path
    start: int
    end: int
    line_end: int
    where: str

    def pieces(self, at: int, size: int) -> Iterator[tuple[int, str, bool]]:
        """(raw offset, decoded text, last) of the pieces from `at` (0: the first)."""
        at = max(at, self.start)
        with self.path.open("rb") as handle:
            while True:
                stop = min(self.end, at + size)
                handle.seek(at)
                raw = handle.read(stop - at)
                if stop < self.end:
                    raw = raw[:_cut(raw)]
                text = self._decode(raw)
                last = at + len(raw) >= self.end
                yield at, text, last
                if last:
                    return
                at += len(raw)

    def _decode(self, raw: bytes) -> str:
        try:
            text = loads_strict(b'"' + raw + b'"')
        except (ValueError, UnicodeDecodeError) as exc:
            raise ZoError(f"{self.where}: not valid JSON in the text "
                          f"({getattr(exc, 'msg', exc)})") from None
        if not isinstance(text, str):
            raise ZoError(f"{self.where}: not valid JSON in the text")
        return text


def _cut(raw: bytes) -> int:
    """Where to end a piece of a string's raw bytes: after the last space of the second
    half, else before a split escape (a backslash in the last 12 bytes) or UTF-8
    sequence."""
    space = raw.rfind(b" ", len(raw) // 2)
    if space > 0:
        return space
    cut = len(raw)
    slash = raw.rfind(b"\\", max(0, cut - 12))
    if slash >= 0:
        cut = slash
    while cut > 0 and 0x80 <= raw[cut - 1] < 0xC0 or cut > 0 and raw[cut - 1] >= 0xC0:
        cut -= 1
    return cut or len(raw)


def scan_line(path: Path, handle: BinaryIO, start: int, *, column: str, where: str,
              limit: int) -> HugeText:
    """The text column's string on the JSONL line that starts at byte `start`, a line
    over `limit` bytes (ZoError naming `where` when the line is not an object, gives
    "input_ids", or has no string in `column`)."""
    handle.seek(start)
    pos, depth, want = start, 0, column.encode()
    in_string = escaped = collect = False
    key, buffer = b"", bytearray()     # the top-level key whose value comes next
    string_start, found = 0, None
    while True:
        chunk = handle.read(CHUNK)
        if not chunk:
            return _found(path, found, column, where, pos, depth + in_string)
        newline = chunk.find(b"\n")   # the line's end (a JSON string holds no raw newline)
        if newline >= 0:
            chunk = chunk[:newline]
        i = 0
        while i < len(chunk):
            if escaped:
                escaped, i = False, i + 1
                continue
            if in_string:
                match = _IN_STRING.search(chunk, i)
                stop = len(chunk) if match is None else match.start()
                if collect and len(buffer) < 1024:
                    buffer += chunk[i:stop]
                if match is None:
                    break
                i = match.end()
                if match.group() == b"\\":
                    escaped = True
                    continue
                in_string = False
                if collect:
                    key, collect = bytes(buffer), False
                elif depth == 1 and key == want:
                    found = (string_start, pos + match.start())
                continue
            match = _SPECIAL.search(chunk, i)
            if match is None:
                break
            byte, i = match.group(), match.end()
            if depth == 0:
                if byte != b"{" or found is not None or key:
                    raise ZoError(f"{where}: not valid JSON (expected one object on the line)")
                depth, key = 1, b""
            elif byte == b'"':
                in_string = True
                if depth == 1 and _after_key_start(chunk, match.start()):
                    collect = True
                    buffer.clear()
                elif depth == 1:
                    string_start = pos + match.end()
            elif byte in (b"{", b"["):
                if depth == 1 and key == b"input_ids" and byte == b"[":
                    raise ZoError(f"{where}: a document of {fmt_size(limit)} or more "
                                  f"given as 'input_ids'; split it into several lines (documents)")
                depth += 1
            elif byte in (b"}", b"]"):
                depth -= 1
                if depth < 0:
                    raise ZoError(f"{where}: not valid JSON (unbalanced brackets)")
                if depth == 0:
                    key = b"-"     # the object ended: nothing more may follow
        if newline >= 0:
            return _found(path, found, column, where, pos + newline, depth + in_string + escaped)
        pos += len(chunk)


def _after_key_start(chunk: bytes, at: int) -> bool:
    """Is the quote at `at` a key's (after '{' or ',' and blanks)? Within the chunk only:
    a key whose quote opens a chunk after blanks is taken as a key."""
    before = chunk[:at].rstrip(_BLANK)
    return not before or before[-1:] in (b"{", b",")


def _found(path: Path, found: tuple[int, int] | None, column: str, where: str,
           line_end: int, depth: int) -> HugeText:
    if depth != 0:
        raise ZoError(f"{where}: not valid JSON (the object does not end on its line)")
    if found is None:
        raise ZoError(f"{where}: expected an object with {column!r} (string) or "
                      f"'input_ids' (name the text's column with --text-column)")
    return HugeText(path, found[0], found[1], line_end, where)
