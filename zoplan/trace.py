"""One span type for predicted and measured time, and its file formats.

A Span is one task of one training step on one rank: an upload, an all-gather, a
forward. The simulator emits them as its prediction; zoexec emits them as measurement.
Task ids (`Span.task_id`) are stable across both, so a measured span can be paired with
its prediction.

Trace directory written by `zoexec run --trace DIR`:
    DIR/meta.json          {"schema_version", "plan_sha256", "world_size", "steps", ...}
    DIR/rank{r}.jsonl      one span per line (Span.to_dict), times in seconds relative
                           to the common epoch of the run (clock offsets removed)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, load_json

TRACE_SCHEMA_VERSION = 1

# Lanes: the engines of one rank. A lane does one thing at a time.
LANE_COMPUTE = "compute"
LANE_H2D = "h2d"
LANE_COLLECTIVE = "collective"
LANE_D2H = "d2h"
LANES = (LANE_COMPUTE, LANE_H2D, LANE_COLLECTIVE, LANE_D2H)

# Task kinds and the lane each runs on.
KIND_LANE = {
    "h2d": LANE_H2D,            # upload of the rank's slice of a block
    "allgather": LANE_COLLECTIVE,  # slice group exchanges slices -> whole block
    "update": LANE_COMPUTE,     # deferred update of step t-1 + perturbation of step t
    "forward": LANE_COMPUTE,    # forward of one block (both perturbations or one)
    "d2h": LANE_D2H,            # write-back of the rank's share of the updated block
    "embed": LANE_COMPUTE,      # resident embeddings
    "head": LANE_COMPUTE,       # final norm + LM head + loss
    "allreduce": LANE_COLLECTIVE,  # scalar loss exchange / all-reduce
}
KINDS = tuple(KIND_LANE)
NO_BLOCK = -1


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

    def to_dict(self) -> dict:
        # spelled out: dataclasses.asdict deep-copies and is ~10x slower on big traces
        return {"kind": self.kind, "rank": self.rank, "start_s": self.start_s,
                "dur_s": self.dur_s, "block": self.block, "step": self.step,
                "lane": self.lane}

    @classmethod
    def from_dict(cls, data: dict) -> Span:
        try:
            return cls(
                kind=str(data["kind"]), rank=int(data["rank"]),
                start_s=float(data["start_s"]), dur_s=float(data["dur_s"]),
                block=int(data.get("block", NO_BLOCK)), step=int(data.get("step", 0)),
                lane=str(data.get("lane", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ZoError(f"malformed span {data!r}: {exc}") from None


def step_time(spans: Iterable[Span]) -> float:
    """Wall time from the first span's start to the last span's end."""
    spans = list(spans)
    if not spans:
        return 0.0
    return max(s.end_s for s in spans) - min(s.start_s for s in spans)


def write_trace(directory: Path, spans: Iterable[Span], meta: dict) -> None:
    """Write a trace directory: meta.json and one rank{r}.jsonl per rank."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_rank: dict[int, list[Span]] = {}
    for span in spans:
        by_rank.setdefault(span.rank, []).append(span)
    for rank, rank_spans in sorted(by_rank.items()):
        lines = "".join(json.dumps(s.to_dict()) + "\n" for s in rank_spans)
        atomic_write_text(directory / f"rank{rank}.jsonl", lines)
    atomic_write_text(directory / "meta.json",
                  json.dumps({"schema_version": TRACE_SCHEMA_VERSION, **meta}, indent=2))


def read_trace(directory: Path) -> tuple[dict, list[Span]]:
    """Read a trace directory written by write_trace (or by zoexec ranks)."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise ZoError(f"trace directory {directory} has no meta.json")
    meta = load_json(meta_path, what="trace meta")
    spans: list[Span] = []
    files = sorted(directory.glob("rank*.jsonl"))
    if not files:
        raise ZoError(f"trace directory {directory} has no rank*.jsonl files")
    for path in files:
        numbered = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1)
                    if line.strip()]
        try:  # one parse per file; on failure, find the bad line for the message
            rows = json.loads("[" + ",".join(line for _, line in numbered) + "]")
        except json.JSONDecodeError:
            rows = [_parse_line(path, n, line) for n, line in numbered]
        spans.extend(Span.from_dict(row) for row in rows)
    return meta, spans


def _parse_line(path: Path, lineno: int, line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ZoError(f"{path}:{lineno} is not valid JSON: {exc}") from None

