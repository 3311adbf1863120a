"""What `zoplan show` draws: the plan with its predicted spans, and the measured step
of a trace when one is given (the panels and the chart read these)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zoplan.plan import Plan
from zoplan.trace import Span, step_time


@dataclass(frozen=True, kw_only=True)
class MeasuredStep:
    """The trace's representative step, shifted to start at 0."""

    step: int
    spans: list[Span]
    steps: list[int]
    median_s: float
    notes: list[str]

    @property
    def step_s(self) -> float:
        return step_time(self.spans)


@dataclass(frozen=True, kw_only=True)
class ShowInput:
    plan: Plan
    path: Path
    predicted: list[Span]
    measured: MeasuredStep | None
    ranks: list[int]
    blocks: list[int] | None
    cells: int
