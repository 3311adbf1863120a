"""Records from local data files (JSONL, JSON, CSV, Parquet, or a folder written by
`Dataset.save_to_disk`); nothing is downloaded. `open_rows` gives them as a sequence
read row by row as it is used (zoexec.data.rowfile: a JSONL file indexed by lines, the
other formats through the `datasets` library into a memory-mapped Arrow table);
`load_records` reads them all."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from zoexec.data.rowfile import MAX_NESTING, ROW_BYTES_FLOOR, JsonlRows, Row, TableRows
from zoplan.errors import ZoError, first_line
from zoplan.io import need_file, need_tree, not_utf8

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_records(path: str | Path) -> list[Row]:
    """The rows of a local data file or save_to_disk folder, as dicts (ZoError naming
    the file when it cannot be read, holds no rows, or is not a table)."""
    return list(open_rows(path))


def open_rows(path: str | Path, *, max_row_bytes: int = ROW_BYTES_FLOOR) -> Sequence[Row]:
    """The rows of a local data file or save_to_disk folder, each read when it is used
    (ZoError naming the file when it cannot be read, holds no rows, or is not a table;
    a JSONL line longer than `max_row_bytes` when it is read)."""
    path = Path(path)
    if path.is_dir():
        data = _from_disk(need_tree(path, what="data folder"))
    elif need_file(path, what="data file").suffix.lower() not in FORMATS:
        raise ZoError(f"data file {path}: unknown format {path.suffix or '(no suffix)'!r}; "
                      f"give .jsonl, .json, .csv, .parquet or a save_to_disk folder")
    elif path.suffix.lower() == ".jsonl":
        rows: Sequence[Row] = JsonlRows(path, max_row_bytes=max_row_bytes)
        if not len(rows):
            raise ZoError(f"data file {path} holds no rows")
        return rows
    else:
        data = _from_file(path, FORMATS[path.suffix.lower()])
    rows = TableRows(data, path, lambda exc: _where_not_utf8(path, exc))
    if not len(rows):
        raise ZoError(f"data file {path} holds no rows")
    return rows


def _datasets() -> Any:   # the datasets module (untyped)
    import datasets

    datasets.disable_progress_bars()
    # not even its errors: a file it cannot read is our one error line (the parquet
    # reader logs "Failed to read schema ..." before it raises)
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _from_disk(path: Path) -> Any:   # a datasets.Dataset
    datasets = _datasets()
    try:
        data = datasets.load_from_disk(str(path), keep_in_memory=False)   # memory-mapped
    except Exception as exc:  # noqa: BLE001 - not a saved data set: the folder's problem
        raise ZoError(f"data folder {path} is not a data set saved with save_to_disk "
                      f"({first_line(exc)})") from None
    if isinstance(data, datasets.DatasetDict):
        if list(data) != ["train"] and len(data) != 1:
            raise ZoError(f"data folder {path} holds several splits ({', '.join(data)}); give "
                          f"the folder of one (e.g. {path / list(data)[0]})")
        data = next(iter(data.values()))
    return data


def _from_file(path: Path, builder: str) -> Any:   # a datasets.Dataset
    if builder == "json":
        _check_nesting(path)
    datasets = _datasets()
    try:
        with tempfile.TemporaryDirectory(prefix="zoexec-data-") as cache:
            return datasets.load_dataset(builder, data_files=str(path), split="train",
                                         cache_dir=cache, keep_in_memory=False)
        # memory-mapped from an Arrow file in `cache`, removed here: the mapping stays
    except Exception as exc:  # noqa: BLE001 - the file's problem, named below
        if builder == "json":
            _find_bad_json_line(path)
        if isinstance(exc, StopIteration) or "empty" in str(exc).lower() or _no_rows(path):
            raise ZoError(f"data file {path} holds no rows") from None
        cause = exc.__cause__ or exc
        raise ZoError(f"cannot read data file {path}: {first_line(cause)}") from None


def _where_not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    """Where the bytes of data `path` are not UTF-8: the byte and its offset in the file
    (a text file), else the value pyarrow could not decode (a folder, parquet)."""
    if path.is_file() and path.suffix.lower() in (".jsonl", ".json", ".csv"):
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as whole:
            return not_utf8(whole)
    return f"a value holds byte {exc.object[exc.start]:#04x}, not UTF-8"


def _check_nesting(path: Path) -> None:
    """ZoError naming the line of a JSON(L) file nested deeper than Python's JSON reader
    goes (about 1,000 levels; pyarrow's reader crashes the process on ~50,000): only a
    line (a .json file: the whole) with more brackets than that is parsed to find out."""
    with path.open("rb") as handle:
        chunks = [handle.read()] if path.suffix.lower() == ".json" else handle
        for number, raw in enumerate(chunks, start=1):
            if raw.count(b"[") + raw.count(b"{") < MAX_NESTING:
                continue
            try:
                json.loads(raw)
            except RecursionError:
                where = f"{path}:{number}" if path.suffix.lower() == ".jsonl" else str(path)
                raise ZoError(f"{where}: JSON nested too deeply (over {MAX_NESTING} levels)") from None
            except ValueError:
                continue   # another problem: the data set library names it


def _no_rows(path: Path) -> bool:
    """Does a text data file hold no rows: no line but blanks (and a CSV's header), or a
    JSON file's empty list or object? (Read once the data set library failed on it.)"""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    lines = [line for line in text.splitlines() if line.strip()]
    if path.suffix.lower() == ".csv":
        return len(lines) <= 1
    if path.suffix.lower() == ".json":
        return text.strip() in ("[]", "{}")
    return not lines


def _find_bad_json_line(path: Path) -> None:
    """Name the first line of a JSONL file that is not one JSON object (when any)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ZoError(f"data file {path} is not UTF-8 text ({not_utf8(exc)})") from None
    if path.suffix.lower() == ".json":
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ZoError(f"{path}:{number}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(record, dict):
            raise ZoError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")


def check_columns(rows: Sequence[Row], columns: Iterable[str], where: str) -> None:
    """ZoError naming the columns `rows` lack (and those they have)."""
    have = list(rows[0])
    missing = [c for c in dict.fromkeys(columns) if c not in have]
    if missing:
        raise ZoError(f"{where}: no column {', '.join(repr(c) for c in missing)} (it has "
                      f"{', '.join(repr(c) for c in have)}); name the columns with "
                      f"--prompt-column/--completion-column/--label-column/--text-column or "
                      f"the template's {{fields}}")
