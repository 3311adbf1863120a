"""One span type for predicted and measured time, and its file formats.

A Span is one task of one training step on one rank: an upload, an all-gather, a
forward. The simulator emits them as its prediction; zoexec emits them as measurement.
Task ids (`Span.task_id`) are stable across both, so a measured span can be paired with
its prediction.

Trace directory written by `zoexec run --trace DIR` (each rank writes its own span
file as the run goes, SpanWriter; rank 0 writes meta.json at the end):
    DIR/meta.json          {"schema_version", "plan_sha256", "world_size", "steps", ...}
                           (TraceMeta: the entries the planner reads are checked)
    DIR/rank{r}.jsonl      one span per line (Span.to_dict), times in seconds relative
                           to the common epoch of the run (clock offsets removed)

Reading checks every number (SpanRecord, TraceMeta: pydantic schemas, strict types,
finite values within bounds); a problem is one ZoError naming the file, the line and
the field. `schema_problem` words a schema's first complaint for plan.json too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, load_json, loads_strict, need_file, not_utf8
from zoplan.layout import MAX_RANKS, Layout
from zoplan.models import SHAPE_BOUNDS

TRACE_SCHEMA_VERSION = 1
MAX_SECONDS = 1e9            # any time of a plan or a trace: 30 years
MAX_STEP = 10**9
MAX_BLOCKS = SHAPE_BOUNDS["num_layers"][2]

# Lanes: the engines of one rank. A lane does one thing at a time.
LANE_COMPUTE = "compute"
LANE_H2D = "h2d"
LANE_COLLECTIVE = "collective"
LANE_D2H = "d2h"
LANES = (LANE_COMPUTE, LANE_H2D, LANE_COLLECTIVE, LANE_D2H)

# Task kinds and the lane each runs on.
KIND_LANE = {
    "h2d": LANE_H2D,            # upload of the rank's slice of a block
    "slice_update": LANE_COLLECTIVE,  # Layout.slice_update: step t-1's update of the
                                      # rank's own slice, right before the all-gather
    "allgather": LANE_COLLECTIVE,  # slice group exchanges slices -> whole block
    "update": LANE_COMPUTE,     # deferred update of step t-1 + perturbation of step t
                                # (with slice_update: the perturbation alone)
    "forward": LANE_COMPUTE,    # forward of one block (both perturbations or one)
    "d2h": LANE_D2H,            # write-back of the rank's share of the updated block
    "embed": LANE_COMPUTE,      # resident embeddings
    "head": LANE_COMPUTE,       # final norm + LM head + loss
    "allreduce": LANE_COLLECTIVE,  # scalar loss exchange / all-reduce
}
KINDS = tuple(KIND_LANE)
NO_BLOCK = -1
# the same names as types, for the schemas (test_trace checks they match KINDS and LANES)
SpanKind = Literal["h2d", "slice_update", "allgather", "update", "forward", "d2h", "embed",
                   "head", "allreduce"]
SpanLane = Literal["", "compute", "h2d", "collective", "d2h"]   # "": the kind's lane


def task_id(kind: str, rank: int, block: int = NO_BLOCK) -> str:
    """Stable id of a task of one step, shared by prediction and measurement."""
    return f"{kind}/b{block}/r{rank}" if block != NO_BLOCK else f"{kind}/r{rank}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Span:
    """One task on one rank's lane: [start_s, start_s + dur_s)."""

    kind: str
    rank: int
    start_s: float
    dur_s: float
    block: int = NO_BLOCK
    step: int = 0
    lane: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KIND_LANE:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.lane:
            object.__setattr__(self, "lane", KIND_LANE[self.kind])
        if self.dur_s < 0:
            raise ValueError(f"dur_s must be >= 0, got {self.dur_s}")

    @property
    def name(self) -> str:
        return task_id(self.kind, self.rank, self.block)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s

    def to_dict(self) -> dict[str, Any]:
        # spelled out: dataclasses.asdict deep-copies and is ~10x slower on big traces
        return {"kind": self.kind, "rank": self.rank, "start_s": self.start_s,
                "dur_s": self.dur_s, "block": self.block, "step": self.step,
                "lane": self.lane}

    @classmethod
    def from_dict(cls, data: Any) -> Span:
        """A span from its dict, checked (SpanRecord): a ZoError otherwise."""
        try:
            return cls.from_record(SpanRecord.model_validate(data))
        except ValidationError as exc:
            raise ZoError(f"malformed span {_short(data)}: {schema_problem(exc)}") from None

    @classmethod
    def from_record(cls, rec: SpanRecord) -> Span:
        return cls(kind=rec.kind, rank=rec.rank, start_s=float(rec.start_s),
                   dur_s=float(rec.dur_s), block=rec.block, step=rec.step,
                   lane=rec.lane or KIND_LANE[rec.kind])


# ---- the schemas of what is read: strict types, finite numbers within bounds ------------
class Checked(BaseModel):
    """Base of the artifacts' schemas: no type coercion (1.5 is not a rank, "2" not a
    degree, true not a count), no NaN or infinity; other keys are kept."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANKS)]


class SpanRecord(Checked):
    """One line of a rank's span file, one entry of a plan's predicted spans."""

    kind: SpanKind
    rank: Rank
    start_s: Annotated[float, Field(ge=-MAX_SECONDS, le=MAX_SECONDS)]
    dur_s: Seconds
    block: Annotated[int, Field(ge=NO_BLOCK, lt=MAX_BLOCKS)] = NO_BLOCK
    step: Annotated[int, Field(ge=0, le=MAX_STEP)] = 0
    lane: SpanLane = ""

    @model_validator(mode="after")
    def _lane_of_kind(self) -> SpanRecord:
        if self.lane and self.lane != KIND_LANE[self.kind]:
            raise ValueError(f"a {self.kind} span runs on lane {KIND_LANE[self.kind]!r}, "
                             f"not {self.lane!r}")
        return self


_SPAN_ROWS = TypeAdapter(list[SpanRecord])
CheckSeconds = Annotated[float, Field(gt=0, le=1e4)]


class _Timed(Checked):
    """One reference shape of a speed check (its sizes, and the median time)."""

    median_s: CheckSeconds


class _SpeedCheck(Checked):
    """zoexec.profiler.probe.SpeedProbe.check: a median time per reference shape."""

    threads: Annotated[int, Field(ge=1)] | None = None
    gemm: _Timed
    memory: _Timed
    z: _Timed


class _SpeedProbe(Checked):
    """zoexec.train.speed.SpeedMonitor's probe: one time per reference shape."""

    after_step: Annotated[int, Field(ge=-1)] | None = None
    gemm: CheckSeconds | None = None
    memory: CheckSeconds | None = None
    z: CheckSeconds | None = None


class TraceMeta(Checked):
    """meta.json: the entries zoplan reads (show, calibrate) are typed and bounded;
    others (records, host_memory, first_update, ...) are the executor's notes."""

    schema_version: Literal[1]   # TRACE_SCHEMA_VERSION (test_trace checks)
    plan_sha256: str | None = None
    plan_path: str | None = None
    world_size: Annotated[int, Field(ge=1, le=MAX_RANKS)] | None = None
    steps: Annotated[int, Field(ge=0, le=MAX_STEP)] | None = None
    layout: dict[str, Any] | None = None
    device_kind: Literal["cuda", "cpu"] | None = None
    threads: Annotated[int, Field(ge=1)] | None = None
    speed_check: list[_SpeedCheck] | None = None
    speed_probes: list[_SpeedProbe] | None = None


def schema_problem(exc: ValidationError, *, skip: int = 0) -> str:
    """The first complaint of a schema, as "where: what (got value)"; `skip`: leading
    parts of the place left out (the index of a line the caller names itself)."""
    err = exc.errors()[0]
    loc = err["loc"][skip:]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    what = re.sub(r" or instance of \w+", "", err["msg"].removeprefix("Value error, "))
    what = what[:1].lower() + what[1:]
    got = "" if err["type"] == "missing" else f" (got {_short(err.get('input'))})"
    return f"{where}: {what}{got}" if where else f"{what}{got}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def step_time(spans: Iterable[Span]) -> float:
    """Wall time from the first span's start to the last span's end."""
    spans = list(spans)
    if not spans:
        return 0.0
    return max(s.end_s for s in spans) - min(s.start_s for s in spans)


def write_trace(directory: Path, spans: Iterable[Span], meta: dict[str, Any]) -> None:
    """Write a trace directory: meta.json and one rank{r}.jsonl per rank. A non-finite
    number in `meta` (the loss of a run that diverged) is written as null: a trace is
    strict JSON, which read_trace reads back."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_rank: dict[int, list[Span]] = {}
    for span in spans:
        by_rank.setdefault(span.rank, []).append(span)
    for rank, rank_spans in sorted(by_rank.items()):
        lines = "".join(json.dumps(s.to_dict()) + "\n" for s in rank_spans)
        atomic_write_text(directory / f"rank{rank}.jsonl", lines)
    write_trace_meta(directory, meta)


SPAN_BUFFER = 4096   # spans a rank holds before it appends them to its file


class SpanWriter:
    """One rank's spans written to DIR/rank{r}.jsonl as the run goes (zoexec runs with
    --trace): at most `buffer` spans are held, then appended, so a rank's memory does
    not grow with the steps and no process ever holds another rank's spans. meta.json
    (write_trace_meta, rank 0, at the end) makes the folder a whole trace."""

    def __init__(self, directory: Path, rank: int, *, buffer: int = SPAN_BUFFER) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"rank{rank}.jsonl"
        self.buffer = buffer
        self.count = 0
        self._held: list[Span] = []
        self._handle = self.path.open("w", encoding="utf-8")

    def append(self, span: Span) -> None:
        self._held.append(span)
        if len(self._held) >= self.buffer:
            self.flush()

    def flush(self) -> None:
        self._handle.write("".join(json.dumps(s.to_dict()) + "\n" for s in self._held))
        self._handle.flush()
        self.count += len(self._held)
        self._held.clear()

    def close(self) -> None:
        if not self._handle.closed:
            self.flush()
            self._handle.close()


class NoSpans:
    """Where the spans of a run without --trace go: nowhere (nothing is kept)."""

    count = 0

    def append(self, span: Span) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def write_trace_meta(directory: Path, meta: dict[str, Any]) -> None:
    """meta.json of a trace whose span files the ranks wrote (SpanWriter)."""
    atomic_write_text(Path(directory) / "meta.json",
                      json.dumps(_finite({"schema_version": TRACE_SCHEMA_VERSION, **meta}),
                                 indent=2, allow_nan=False))


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_trace(directory: Path) -> tuple[dict[str, Any], list[Span]]:
    """Read a trace directory written by write_trace (or by zoexec ranks), checked: the
    meta (TraceMeta), every span line (SpanRecord) and each span's rank against its
    file's."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ZoError(f"trace directory {directory} does not exist" if not directory.exists()
                      else f"trace {directory} is not a directory")
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise ZoError(f"trace directory {directory} has no meta.json")
    meta = read_meta(meta_path)
    files = sorted(directory.glob("rank*.jsonl"))
    if not files:
        raise ZoError(f"trace directory {directory} has no rank*.jsonl files")
    spans: list[Span] = []
    for path in files:
        spans.extend(_read_spans(path))
    return meta, spans


def read_meta(path: Path) -> dict[str, Any]:
    """meta.json of a trace, checked against TraceMeta (the dict as written)."""
    meta: dict[str, Any] = load_json(path, what="trace meta")
    try:
        TraceMeta.model_validate(meta)
        if isinstance(meta.get("layout"), dict):
            Layout(**meta["layout"]).check_bounds()
    except ValidationError as exc:
        raise ZoError(f"trace meta {path}: {schema_problem(exc)}") from None
    except (TypeError, ValueError) as exc:
        raise ZoError(f"trace meta {path}: layout: {exc}") from None
    return meta


def _read_spans(path: Path) -> list[Span]:
    match = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
    if not match:
        raise ZoError(f"{path}: a span file is named rank<r>.jsonl")
    need_file(path, what="span file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ZoError(f"{path} is not a text file ({not_utf8(exc)})") from None
    except OSError as exc:
        raise ZoError(f"cannot read {path}: {exc.strerror}") from None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:  # one parse per file; on failure, find the bad line for the message
        rows = loads_strict("[" + ",".join(line for _, line in numbered) + "]")
    except ValueError:
        rows = [_parse_line(path, n, line) for n, line in numbered]
    try:
        records = _SPAN_ROWS.validate_python(rows)
    except ValidationError as exc:
        index = int(exc.errors()[0]["loc"][0])   # the row's index in the list
        raise ZoError(f"{path}:{numbered[index][0]}: malformed span: "
                      f"{schema_problem(exc, skip=1)}") from None
    rank = int(match[1])
    for (lineno, _), rec in zip(numbered, records):
        if rec.rank != rank:
            raise ZoError(f"{path}:{lineno}: a span of rank {rec.rank} in the file of rank {rank}")
    return [Span.from_record(rec) for rec in records]


def _parse_line(path: Path, lineno: int, line: str) -> Any:
    try:
        return loads_strict(line)
    except ValueError as exc:
        raise ZoError(f"{path}:{lineno} is not valid JSON: {exc}") from None
