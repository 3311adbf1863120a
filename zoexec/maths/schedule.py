"""Learning-rate schedules (the HF Trainer's names): constant, linear and cosine decay to
zero over the run's steps, after `warmup` steps of linear warm-up from zero. The lr of
every step is logged with its (seed, g), so a replay applies exactly what the run did,
whatever the schedule."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_at(step: int, *, lr: float, schedule: str, warmup: int, total: int) -> float:
    """The learning rate of (0-based) `step` of a run of `total` steps."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if schedule == "constant":
        return lr
    span = max(1, total - warmup)
    done = min(1.0, (step - warmup) / span)
    if schedule == "linear":
        return lr * (1.0 - done)
    return lr * 0.5 * (1.0 + math.cos(math.pi * done))


def lr_from(step: int, *, start: int, lr: float, schedule: str, warmup: int, total: int) -> float:
    """The learning rate of `step` in a schedule that starts at step `start` and ends at
    `total` (a run extended with a new schedule starts one at the step it resumed at,
    without warm-up; the first starts at 0 with the run's warm-up)."""
    return lr_at(step - start, lr=lr, schedule=schedule, warmup=warmup if start == 0 else 0,
                 total=total - start)
