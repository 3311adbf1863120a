"""A rank's lanes and clock: the engines its tasks run on (compute, h2d, collective,
d2h; zoplan.trace.LANES) and the run's common time origin.

On CUDA each lane is a stream; a task waits on the events of the tasks it depends on
and is timed with CUDA events, converted to host time at the end of the step. On the
CPU a task runs at once, in program order, timed with the host clock (CLOCK_MONOTONIC,
which all processes of one host share).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from zoexec.runtime.errors import failing
from zoexec.runtime.groups import DistEnv, broadcast_object, gather_objects, host_barrier
from zoplan.trace import KIND_LANE, LANE_COMPUTE, LANES, NO_BLOCK, NoSpans, Span


class SpanSink(Protocol):
    """Where the lanes' spans go: zoplan.trace.SpanWriter (--trace), NoSpans, a list."""

    def append(self, span: Span, /) -> None: ...


def clock_epoch(env: DistEnv) -> tuple[float, str]:
    """The run's time origin on this rank's CLOCK_MONOTONIC, and how it was found.

    One host: every process reads the same CLOCK_MONOTONIC, so rank 0's reading is the
    epoch of all. Several hosts: each rank takes its own reading as it leaves a barrier
    (three rounds, the last kept); the offset error is one barrier's exit skew."""
    hosts = gather_objects(env, socket.gethostname())
    one_host = broadcast_object(env, hosts is not None and len(set(hosts)) == 1)
    if one_host:
        host_barrier(env)
        return float(broadcast_object(env, time.monotonic())), "common CLOCK_MONOTONIC"
    for _ in range(3):
        host_barrier(env)
        local = time.monotonic()
    return local, "barrier exit (per-host offset estimate)"


# ---- lanes ------------------------------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Task:
    """A task handle: `done` is what later tasks wait on (a CUDA event, or None)."""

    kind: str
    block: int
    done: torch.cuda.Event | None = None
    start: torch.cuda.Event | None = None


@dataclass(kw_only=True, eq=False)
class CpuLanes:
    """Tasks run at once in program order; timed with the host clock."""

    rank: int
    epoch_s: float = 0.0
    spans: SpanSink = field(default_factory=NoSpans)
    _step: int = 0
    _record: bool = True

    def begin_step(self, step: int, *, record: bool = True) -> None:
        self._step, self._record = step, record

    @contextmanager
    def task(self, kind: str, block: int = NO_BLOCK, *,
             after: tuple[torch.cuda.Event | None, ...] = (),
             record: bool = True) -> Iterator[Task]:
        handle = Task(kind=kind, block=block)
        start = time.monotonic()
        with failing(kind, rank=self.rank, block=block, step=self._step if self._record else None):
            yield handle
        end = time.monotonic()
        if record and self._record:
            self.spans.append(Span(kind=kind, rank=self.rank, start_s=start - self.epoch_s,
                                   dur_s=end - start, block=block, step=self._step))

    def end_step(self) -> None:
        """Nothing is in flight on the CPU."""


@dataclass(kw_only=True, eq=False)
class CudaLanes:
    """One CUDA stream per lane; tasks ordered by events, timed by events."""

    rank: int
    device: torch.device
    epoch_s: float = 0.0
    spans: SpanSink = field(default_factory=NoSpans)
    streams: dict[str, torch.cuda.Stream] = field(default_factory=dict)
    _pending: list[tuple[Task, torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    _step: int = 0
    _record: bool = True
    _ref: torch.cuda.Event | None = None
    _ref_host_s: float = 0.0

    def __post_init__(self) -> None:
        self.streams = {lane: torch.cuda.Stream(device=self.device) for lane in LANES}
        torch.cuda.set_stream(self.streams[LANE_COMPUTE])

    def begin_step(self, step: int, *, record: bool = True) -> None:
        """Anchor CUDA event time to host time: the device is idle here."""
        self._step, self._record = step, record
        torch.cuda.synchronize(self.device)
        self._ref = torch.cuda.Event(enable_timing=True)
        self._ref.record(self.streams[LANE_COMPUTE])
        self._ref.synchronize()
        self._ref_host_s = time.monotonic()

    @contextmanager
    def task(self, kind: str, block: int = NO_BLOCK, *,
             after: tuple[torch.cuda.Event | None, ...] = (),
             record: bool = True) -> Iterator[Task]:
        stream = self.streams[KIND_LANE[kind]]
        for event in after:
            if event is not None:
                stream.wait_event(event)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        handle = Task(kind=kind, block=block, done=end, start=start)
        with torch.cuda.stream(stream):
            start.record(stream)
            with failing(kind, rank=self.rank, block=block,
                         step=self._step if self._record else None):
                yield handle
            end.record(stream)
        if record and self._record:
            self._pending.append((handle, start, end))

    def end_step(self) -> None:
        """Wait for the step's work and turn its events into spans (host time)."""
        torch.cuda.synchronize(self.device)
        base = self._ref_host_s - self.epoch_s
        for handle, start, end in self._pending:
            assert self._ref is not None, "a task recorded before begin_step"
            start_s = base + self._ref.elapsed_time(start) / 1e3
            dur_s = max(0.0, start.elapsed_time(end) / 1e3)
            self.spans.append(Span(kind=handle.kind, rank=self.rank, start_s=start_s,
                                   dur_s=dur_s, block=handle.block, step=self._step))
        self._pending.clear()


Lanes = CpuLanes | CudaLanes   # a rank's lanes, of its device


def make_lanes(env: DistEnv, *, epoch_s: float, spans: SpanSink | None = None) -> Lanes:
    """The lanes of this rank's device; `spans`: where their spans go (an object with
    `append`: zoplan.trace.SpanWriter with --trace; None: nowhere, nothing kept)."""
    spans = spans if spans is not None else NoSpans()
    if env.is_cuda:
        return CudaLanes(rank=env.rank, device=env.device, epoch_s=epoch_s, spans=spans)
    return CpuLanes(rank=env.rank, epoch_s=epoch_s, spans=spans)
