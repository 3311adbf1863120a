"""Work: what a GPU task costs, as seconds of the device and seconds of the host thread
that issues it (launches, generator seeds, layer calls: the host lane,
zoplan.pricing.host). CPU ranks run their own tasks: their costs are plain seconds."""

from __future__ import annotations

from typing import NamedTuple


class Work(NamedTuple):
    """A GPU task's work: seconds on the device and seconds its host thread takes to
    issue it."""

    device_s: float
    host_s: float

    def __add__(self, other: Work) -> Work:   # type: ignore[override]
        return Work(self.device_s + other.device_s, self.host_s + other.host_s)

    def __mul__(self, k: float) -> Work:   # type: ignore[override]
        return Work(self.device_s * k, self.host_s * k)


NO_WORK = Work(0.0, 0.0)
