"""What the training loop watches besides each step: a loss that climbs, and the best
evaluation so far (zoexec.run.loop calls these; every rank sees the same losses and
metrics, so every rank decides alike without a message).

A climbing loss (`--on-divergence stop|warn`, `--divergence-window W`): each step's
loss is the mean of its two perturbed losses (l+ + l-) / 2. The start is the mean of
the first max(1, W // 4) steps this process ran; the current level the mean of the last
W steps (fewer at first: the check begins once W steps are logged). The run is
diverging when the current level exceeds BOTH `FACTOR` x the start and the start +
`MARGIN` (the factor for large losses, the margin for losses near 0, where doubling is
noise: a classification loss from 0.69 must pass 1.69). A climb is therefore reported
at the latest W steps after it lifts the mean that far; a short start window keeps a
climb in the first steps from hiding in the start itself. A resumed run starts its
windows anew. Skipped (non-finite) steps do not count.

The best evaluation (`--save-best METRIC[:max|min]`): after each evaluation the metric
is compared with the best so far (strictly better wins; the first evaluation is the
first best), and the loop writes the weights as OUT/best/ (an HF folder with
state.json naming the step, the metric and its value). A resumed run reads the best so
far back from best/state.json.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from zoexec.maths.history import StepRecord
from zoplan.errors import ZoError
from zoplan.io import loads_strict

FACTOR = 2.0     # the current level above this many times the start ...
MARGIN = 1.0     # ... and this far above it (nats): diverging
BEST = "best"    # the run folder's best weights


class Divergence:
    """The climbing-loss rule of the module docstring over the steps it is shown. It
    keeps the start window and the last W steps only: a run of any length holds the
    same few numbers."""

    def __init__(self, window: int) -> None:
        self.window, self.start_steps = window, max(1, window // 4)
        self.start: list[tuple[int, float]] = []                 # (step, loss), the first ones
        self.recent: deque[tuple[int, float]] = deque(maxlen=window)   # the last W
        self.reported = False

    def add(self, record: StepRecord) -> str | None:
        """The step's loss taken in; a one-line description the first time the run is
        diverging, else None."""
        if record.skipped or not record.finite:
            return None
        point = (record.step + 1, (record.loss_plus + record.loss_minus) / 2)   # steps done
        if len(self.start) < self.start_steps:
            self.start.append(point)
        self.recent.append(point)
        if self.reported or len(self.recent) < self.window:
            return None
        start = sum(loss for _, loss in self.start) / self.start_steps
        now = sum(loss for _, loss in self.recent) / self.window
        if now > FACTOR * start and now > start + MARGIN:
            self.reported = True
            return (f"the loss is climbing: {now:.4g} over steps {self.recent[0][0]}-"
                    f"{self.recent[-1][0]}, from {start:.4g} over steps {self.start[0][0]}-"
                    f"{self.start[-1][0]} (more than {FACTOR:g}x and "
                    f"{MARGIN:g} above)")
        return None


class BestMetric:
    """The best value of `metric` so far (`greater`: higher is better)."""

    def __init__(self, metric: str, greater: bool, folder: Path | None = None) -> None:
        self.metric, self.greater = metric, greater
        self.value: float | None = None
        if folder is not None:
            self.value = _saved_value(folder, metric)

    def improved(self, metrics: dict[str, float]) -> bool:
        """Is `metrics` better than the best so far (then it becomes the best)?"""
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            return False
        if self.value is not None and not (value > self.value if self.greater
                                           else value < self.value):
            return False
        self.value = value
        return True

    def state(self) -> dict[str, object]:
        return {"metric": self.metric, "value": self.value, "greater_is_better": self.greater}


def _saved_value(folder: Path, metric: str) -> float | None:
    """The value best/state.json records for `metric` (None: no best/ yet, or another
    metric: the resumed run's first evaluation becomes the best); a state.json that
    does not say is refused."""
    path = Path(folder) / BEST / "state.json"
    if not path.is_file():
        return None
    try:
        state = loads_strict(path.read_text())
        value = state["value"] if state["metric"] == metric else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ZoError(f"{path}: not the state of a best/ folder ({exc}); move best/ away "
                      f"to resume") from None
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ZoError(f"{path}: the best {metric} is {value!r}, not a number")
    return value
