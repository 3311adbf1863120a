"""The profiler's time budget (`zoplan profile --time-budget`): how long a profile may
take, whatever the machine's load, and what the load did to the samples.

On a machine that other processes keep busy, every sample is disturbed (timing.Guard),
so retaking them only multiplies the time. The budget bounds that:
- each measurement round gets an allowance (the first FIRST_ROUND_SHARE of the budget,
  each later one what is left over the rounds still to run), split over the round's
  stages by STAGE_WEIGHTS (their shares of an idle round); a stage's deadline is the end
  of its share;
- before its deadline a disturbed sample is retaken (timing.Guard); after it, a
  disturbed sample is kept and counted as such, and the forward grid stops its passes
  once MIN_PASSES are timed (blocks.forward_grid);
- a later round runs only when the time left holds another round as long as the last.
The first round always runs whole (a profile needs every figure), so a machine slower
than the budget allows ends late by what its floor takes; `report()` says by how much,
how many samples were disturbed, and which stages were cut, and goes into the profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Shares of a round's time per stage, in order. CPU: from a quick profile on the 2-core
# machine of docs/figures.md under load 7-9 (copies 2 s, forwards 13 s, zo and the speed
# check under 1 s each, the spawned ranks 30 s of 45 s, 14 s of it starting them), the
# full grid's longer forwards weighed in; a GPU round's are estimated.
STAGE_WEIGHTS = {
    "cpu": (("copies", 0.05), ("forwards", 0.45), ("zo", 0.05), ("speed check", 0.05),
            ("ranks", 0.40)),
    "cuda": (("copies", 0.25), ("forwards", 0.45), ("zo", 0.10), ("collectives", 0.20)),
}
FIRST_ROUND_SHARE = 0.55    # the first round's allowance, of the whole budget
MIN_PASSES = 2              # timed passes of the forward grid kept however late
ROUND_MARGIN = 1.05         # a later round runs if the time left is this x the last round's
DEFAULT_BUDGET_S = {"cpu": 120.0, "cuda": 60.0}


def default_budget_s(device: str) -> float:
    """The budget when --time-budget is not given: about 2 minutes for a CPU profile,
    the GPU check's minute for a GPU one."""
    return DEFAULT_BUDGET_S["cuda" if device == "cuda" else "cpu"]


@dataclass(kw_only=True)
class Budget:
    """The budget of one `zoplan profile` (module docstring); times from `clock`."""

    seconds: float
    device: str = "cpu"
    rounds_planned: int = 1
    clock: Callable[[], float] = time.perf_counter
    start: float = field(default=0.0)
    rounds_done: int = 0
    round_start: float = 0.0
    allowance: float = 0.0
    deadline: float | None = None      # the current stage's
    done_weight: float = 0.0           # of the current round's stages finished
    last_round_s: float | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"--time-budget must be > 0 seconds, got {self.seconds:g}")
        self.start = self.clock()

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.start

    @property
    def weights(self) -> tuple[tuple[str, float], ...]:
        return STAGE_WEIGHTS["cuda" if self.device == "cuda" else "cpu"]

    def next_round(self) -> bool:
        """Start the next round if it fits (the first always does); its allowance."""
        now = self.clock()
        if self.rounds_done:
            self.last_round_s = now - self.round_start
            left = self.seconds - (now - self.start)
            if self.rounds_done >= self.rounds_planned or left < ROUND_MARGIN * self.last_round_s:
                return False
            self.allowance = left / (self.rounds_planned - self.rounds_done)
        else:
            share = FIRST_ROUND_SHARE if self.rounds_planned > 1 else 0.9
            self.allowance = share * self.seconds
        self.round_start, self.done_weight = now, 0.0
        self.rounds_done += 1
        return True

    def end_round(self) -> None:
        self.last_round_s = self.clock() - self.round_start

    def stage(self, name: str) -> float:
        """Stage `name` of the round begins ("done": the round's stages are over): its
        deadline (perf_counter seconds, shared by the spawned ranks: CLOCK_MONOTONIC on
        Linux)."""
        if name == "done":
            self.done_weight = 1.0
            return self.round_start + self.allowance
        total, self.done_weight = 0.0, 0.0
        for stage, weight in self.weights:
            total += weight
            if stage == name:
                break
            self.done_weight = total
        else:
            raise KeyError(name)
        self.deadline = self.round_start + self.allowance * total
        return self.deadline

    def eta_s(self) -> float:
        """Seconds until the profile is likely done: the rest of this round, then the
        later rounds that fit. The rest of a round: the last round's length where there
        is one; else, once half the round's weight is done, the pace so far; else what
        its allowance leaves (late stages are cut to their least work)."""
        now = self.clock()
        in_round = now - self.round_start
        if self.last_round_s is not None:
            rest = max(0.0, self.last_round_s - in_round)
        elif self.done_weight >= 0.5:
            rest = (1.0 - self.done_weight) * in_round / self.done_weight
        else:
            rest = 0.0
        if self.done_weight < 1.0 and self.last_round_s is None:
            rest = max(rest, self.round_start + self.allowance - now)
        round_s = self.last_round_s if self.last_round_s is not None else in_round + rest
        left, later = self.seconds - (now - self.start), 0.0
        for _ in range(self.rounds_planned - self.rounds_done):
            if left - rest - later < ROUND_MARGIN * round_s:
                break
            later += round_s
        return rest + later

    def report(self, *, samples: int, retaken: int, disturbed_kept: int,
               cut: list[str]) -> dict[str, object]:
        """What the profile records of its budget and of the load (plain JSON): the
        samples kept, those retaken and those kept although disturbed, the stages whose
        passes were cut short."""
        return {"time_budget_s": round(self.seconds, 1), "elapsed_s": round(self.elapsed_s, 1),
                "rounds": self.rounds_done, "rounds_planned": self.rounds_planned,
                "samples": samples, "retaken": retaken, "disturbed_kept": disturbed_kept,
                "cut": sorted(set(cut))}
