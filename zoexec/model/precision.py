"""What the stored precision does to the updates of a run (docs/precision.md).

Update "plain" rounds every update to the nearest 16-bit value, so MeZO updates far
below half a unit in the last place are lost. `LostUpdates` measures, on rank 0 over the
first elements of block 0, what share of the weights the first update changed and what
share of the weights it should have moved kept their stored value; the run's trace
records it for every mode (with fp32 masters nothing is lost; with stochastic rounding
many weights keep their value on a given step but their expected value moves exactly),
and for "plain" it warns once: that share, not a guess, is what its user needs to see.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from zoplan.memory import LOST_UPDATE_SAMPLE as SAMPLE  # elements of block 0 the check looks at


@dataclass(kw_only=True, eq=False)
class LostUpdates:
    """What one update did to the stored weights (rank 0 only; warns for "plain")."""

    enabled: bool
    update: str
    lr: float
    dtype: torch.dtype
    quiet: bool = False
    result: dict[str, object] | None = None
    _counts: tuple[int, float, torch.Tensor] | None = None   # elements, g, [lost, moved, changed]

    def before(self, theta: torch.Tensor, block: int) -> torch.Tensor | None:
        """A copy of what the check compares against, when this update is checked."""
        if not self.enabled or self.result is not None or block != 0:
            return None
        return theta[:SAMPLE].clone()

    def after(self, theta: torch.Tensor, z: torch.Tensor, before: torch.Tensor | None, *,
              g: float) -> None:
        """Count, on the device, the elements whose exact update (lr * g * z) was
        nonzero but whose stored value did not change; `settle` reads the counts once
        the step is done (a read here would make a GPU's host wait mid-step)."""
        if before is None or not g:
            return
        count = before.numel()
        moved = z[:count] != 0
        self._counts = (count, g, torch.stack([((theta[:count] == before) & moved).sum(),
                                               moved.sum(), (theta[:count] != before).sum()]))
        self.result = {}        # checked: no later update is looked at

    def settle(self) -> None:
        """After the step (the device idle): the shares, and for "plain" the warning."""
        if self._counts is None:
            return
        count, g, counts = self._counts
        lost, moved, changed = counts.tolist()
        self._counts = None
        share = lost / max(1, moved)
        self.result = {"update": self.update, "block": 0, "elements": count,
                       "lost_share": round(share, 6), "changed_share": round(changed / max(1, count), 6),
                       "lr": self.lr, "g": g}
        if self.update == "plain" and not self.quiet:
            name = str(self.dtype).removeprefix("torch.")
            print(f"zoexec: warning: update plain (round to nearest in {name}) lost "
                  f"{share:.0%} of the first update of block 0 ({count:,} weights, lr "
                  f"{self.lr:g}, |g| {abs(g):.3g}); --update stochastic or master keeps "
                  f"it", file=sys.stderr, flush=True)

    def meta(self) -> dict[str, object]:
        return {"first_update": self.result} if self.result else {}
