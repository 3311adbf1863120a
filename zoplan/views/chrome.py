"""Chrome / Perfetto trace export of predicted and measured spans.

Format (the Trace Event Format's JSON object form, loadable in chrome://tracing and
ui.perfetto.dev): {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
- One complete event (ph "X") per span: ts and dur in microseconds, name = the kind
  (with the block when it has one), cat = the kind, args = {block, kind, step, task}.
- pid = rank for the prediction, and measured_pid_offset(world) + rank for the
  measurement (10000 + rank up to 9999 ranks); process_name metadata names them
  "predicted rank N" / "measured rank N", and process_sort_index keeps each predicted
  rank next to its measured twin.
- tid = the lane's index in zoplan.trace.LANES (0 compute, 1 h2d, 2 collective,
  3 d2h), named by thread_name metadata.
Durations are the spans' own, so per (pid, tid) they sum to the lane's busy time in the
plan (or the trace), up to the rounding of each to a nanosecond.
"""

from __future__ import annotations

import json
from typing import NotRequired, TypedDict

from zoplan.trace import LANES, NO_BLOCK, Span

PREDICTED = "predicted"
MEASURED = "measured"


class TraceEvent(TypedDict):
    """One event: a complete one ("X": cat, ts, dur) or metadata ("M")."""

    name: str
    cat: NotRequired[str]
    ph: str
    pid: int
    tid: int
    ts: NotRequired[float]
    dur: NotRequired[float]
    args: dict[str, object]


class ChromeTrace(TypedDict):
    traceEvents: list[TraceEvent]
    displayTimeUnit: str
    otherData: dict[str, object]


def measured_pid_offset(world_size: int) -> int:
    """First pid of the measured ranks: 10000, or the next power of ten above the world."""
    return max(10_000, int(10 ** len(str(world_size))))


def span_event(span: Span, *, pid: int) -> TraceEvent:
    name = span.kind if span.block == NO_BLOCK else f"{span.kind} b{span.block}"
    return {"name": name, "cat": span.kind, "ph": "X", "pid": pid,
            "tid": LANES.index(span.lane) if span.lane in LANES else len(LANES),
            "ts": round(span.start_s * 1e6, 3), "dur": round(span.dur_s * 1e6, 3),
            "args": {"block": span.block, "kind": span.kind, "step": span.step,
                     "task": span.name}}


def metadata_events(*, pid: int, rank: int, source: str, sort_index: int) -> list[TraceEvent]:
    events: list[TraceEvent] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
         "args": {"name": f"{source} rank {rank}"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
         "args": {"sort_index": sort_index}},
    ]
    for tid, lane in enumerate(LANES):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": lane}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    return events


def source_events(spans: list[Span], *, source: str, pid_offset: int) -> list[TraceEvent]:
    """Metadata and complete events of one source (predicted or measured)."""
    events: list[TraceEvent] = []
    for rank in sorted({s.rank for s in spans}):
        sort_index = 2 * rank + (source == MEASURED)
        events += metadata_events(pid=pid_offset + rank, rank=rank, source=source,
                                  sort_index=sort_index)
    ordered = sorted(spans, key=lambda s: (s.rank, LANES.index(s.lane) if s.lane in LANES
                                           else len(LANES), s.start_s))
    events += [span_event(s, pid=pid_offset + s.rank) for s in ordered]
    return events


def chrome_trace(*, predicted: list[Span], measured: list[Span] | None, world_size: int,
                 other: dict[str, object]) -> ChromeTrace:
    events = source_events(predicted, source=PREDICTED, pid_offset=0)
    if measured:
        events += source_events(measured, source=MEASURED,
                                pid_offset=measured_pid_offset(world_size))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def chrome_json(trace: ChromeTrace) -> str:
    return json.dumps(trace, separators=(",", ":")) + "\n"
