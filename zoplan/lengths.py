"""Row lengths: the contract between `zoexec lengths` (which tokenises a data set with
its task's own code) and `zoplan optimize --lengths` (which prices the padded batches a
run of that data will see).

A lengths file (JSON, written atomically) holds:
  schema_version     2
  data, data_sha256  the data file (or save_to_disk folder) measured, and its sha256
  task               the task's options as run.json records them (zoexec TaskOptions.record)
  tokenizer          the folder whose tokenizer made the tokens
  rows_per_example   rows one example adds to a batch (classification with multi-token
                     label words and the candidate loss: one per candidate; else 1)
  histogram          [[width, examples], ...] sorted by width: the tokens of an example's
                     longest row (prompt + target), before any cut to a plan's seq
  count              examples (the histogram's counts summed)
  head_positions     the positions per example whose final norm and LM head a run
                     computes (those that predict a label: zoexec.model.heads), the mean
                     over the examples: 1 for single-token label words with MeZO's
                     candidate loss, a completion's tokens + EOS, each candidate's tokens

The padded width of a batch is the longest row of its `batch` examples, at most `seq`
(zoexec.data.batch.pack_examples pads to it). The sampling model: the batch's examples
are `batch` independent draws, with replacement, from the file's examples (zoexec
visits them in a shuffled order each epoch, so within an epoch it draws without
replacement; the two agree when the file holds many more examples than a batch).
With F(w) the fraction of examples of width <= w,
    E[width] = sum over widths w of w x (F(w)^batch - F(w-)^batch).
The head acts on the labelled positions only, summed over the batch's examples: a
batch's head tokens are batch x head_positions (Workload.head_share).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, dumps_canonical, load_json, sha256_path, sha256_text

SCHEMA_VERSION = 2   # 2: head_positions
_KEYS = ("schema_version", "data", "data_sha256", "task", "tokenizer", "rows_per_example",
         "histogram", "count", "head_positions")


def expected_width(histogram: Iterable[tuple[int, int]], *, batch: int, cap: int) -> float:
    """E[min(cap, the longest of `batch` draws with replacement)] from `histogram`
    ([(width, examples), ...]); see the module docstring."""
    widths: dict[int, int] = {}
    for width, examples in histogram:
        widths[min(width, cap)] = widths.get(min(width, cap), 0) + examples
    total, below, mean = sum(widths.values()), 0, 0.0
    for width in sorted(widths):
        upto = below + widths[width]
        mean += width * ((upto / total) ** batch - (below / total) ** batch)
        below = upto
    return mean


@dataclass(frozen=True, kw_only=True)
class RowLengths:
    """What a plan keeps of a lengths file: its sha256, the data's, the rows per example,
    the histogram (the priced width is derived from it: Workload.priced_seq) and the
    head positions per example (Workload.head_share)."""

    sha256: str
    data_sha256: str
    rows_per_example: int = 1
    histogram: tuple[tuple[int, int], ...] = ()
    head_positions: float | None = None   # None: a plan made before it was measured

    def __post_init__(self) -> None:
        for name in ("sha256", "data_sha256"):
            value = getattr(self, name)
            if not (isinstance(value, str) and len(value) == 64
                    and all(ch in "0123456789abcdef" for ch in value)):
                raise ValueError(f"{name} must be 64 hex digits, got {value!r}")
        _check_count("rows_per_example", self.rows_per_example)
        if not isinstance(self.histogram, tuple) or not self.histogram:
            raise ValueError(f"histogram must hold one or more [width, examples] pairs, "
                             f"got {self.histogram!r}")
        for pair in self.histogram:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"histogram entries must be [width, examples], got {pair!r}")
            _check_count("histogram width", pair[0])
            _check_count("histogram examples", pair[1])
        widths = [w for w, _ in self.histogram]
        if widths != sorted(set(widths)):
            raise ValueError(f"histogram widths must be distinct and sorted, got {widths}")
        h = self.head_positions
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float))
                              or not 0 < h <= self.rows_per_example * widths[-1]):
            raise ValueError(f"head_positions must be a number in (0, rows_per_example x "
                             f"the widest row], got {h!r}")

    @property
    def count(self) -> int:
        return sum(n for _, n in self.histogram)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"sha256": self.sha256, "data_sha256": self.data_sha256,
               "rows_per_example": self.rows_per_example,
               "histogram": [list(pair) for pair in self.histogram]}
        if self.head_positions is not None:
            out["head_positions"] = self.head_positions
        return out

    @classmethod
    def from_dict(cls, data: object) -> RowLengths:
        """A plan's lengths (to_dict's), checked: ValueError or TypeError naming what
        is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"lengths must be an object, got {data!r}")
        fields = dict(data)
        hist = fields.get("histogram")
        if isinstance(hist, list):
            fields["histogram"] = tuple(tuple(p) if isinstance(p, list) else p for p in hist)
        return cls(**fields)


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def histogram_of(widths: list[int]) -> tuple[tuple[int, int], ...]:
    """[(width, examples), ...] of a list of widths, sorted by width."""
    counts: dict[int, int] = {}
    for width in widths:
        counts[width] = counts.get(width, 0) + 1
    return tuple(sorted(counts.items()))


class LengthsDocument(TypedDict):
    """A lengths file's content (the module docstring's keys)."""

    schema_version: int
    data: str
    data_sha256: str
    task: dict[str, Any]          # the task's options as run.json records them
    tokenizer: str
    rows_per_example: int
    histogram: list[list[int]]
    count: int
    head_positions: float


def lengths_document(*, data: str, task: dict[str, Any], tokenizer: str, rows_per_example: int,
                     widths: list[int], head_positions: float) -> LengthsDocument:
    """The lengths file's content for these measured example widths and the mean
    head positions per example."""
    hist = histogram_of(widths)
    RowLengths(sha256="0" * 64, data_sha256="0" * 64, rows_per_example=rows_per_example,
               histogram=hist, head_positions=head_positions)   # the checks of reading it
    return {"schema_version": SCHEMA_VERSION, "data": data, "data_sha256": sha256_path(data),
            "task": task, "tokenizer": tokenizer, "rows_per_example": rows_per_example,
            "histogram": [list(pair) for pair in hist], "count": len(widths),
            "head_positions": head_positions}


def write_lengths(path: Path | str, document: LengthsDocument) -> None:
    atomic_write_text(path, dumps_canonical(document), what="the lengths file")


def load_lengths(path: Path | str) -> RowLengths:
    """Read and verify a lengths file: its fields, the count against the histogram, and
    (where the data file it names is still there) the data's sha256."""
    doc = load_json(path, what="lengths file")
    text = Path(path).read_text()
    if not isinstance(doc, dict):
        raise ZoError(f"lengths file {path}: not a JSON object")
    missing = [key for key in _KEYS if key not in doc]
    if missing:
        raise ZoError(f"lengths file {path}: missing {', '.join(missing)} (write it with "
                      f"`zoexec lengths`)")
    if doc["schema_version"] != SCHEMA_VERSION:
        raise ZoError(f"lengths file {path}: schema_version {doc['schema_version']!r}, this "
                      f"zoplan reads {SCHEMA_VERSION}: measure it again with `zoexec lengths`")
    try:
        lengths = RowLengths.from_dict({
            "sha256": sha256_text(text), "data_sha256": doc["data_sha256"],
            "rows_per_example": doc["rows_per_example"], "histogram": doc["histogram"],
            "head_positions": doc["head_positions"]})
    except (TypeError, ValueError) as exc:
        raise ZoError(f"lengths file {path}: {exc}") from None
    if doc["count"] != lengths.count:
        raise ZoError(f"lengths file {path}: count {doc['count']!r} but the histogram holds "
                      f"{lengths.count} examples")
    _check_data(path, doc, lengths)
    return lengths


def _check_data(path: Path | str, doc: dict[str, Any], lengths: RowLengths) -> None:
    """The data file the lengths were measured on, where it is still there, unchanged."""
    data = Path(str(doc["data"]))
    if not data.exists():
        return
    now = sha256_path(data)
    if now != lengths.data_sha256:
        raise ZoError(f"lengths file {path} was measured on {data} with sha256 "
                      f"{lengths.data_sha256[:12]}..., which now has sha256 {now[:12]}...: "
                      f"measure it again with `zoexec lengths`")
