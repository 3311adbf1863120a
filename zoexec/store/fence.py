"""The CPU write-back fence: per-(local rank, block) read stamps in shared memory.

Rule (docs: execution semantics): d2h of block b on any rank of a node may start only
after EVERY local rank of that node finished its h2d (read) of block b in this pass.
On the CPU this is a flag check, not a collective: the node shares an int64 array
`stamps[local_rank, block]` (a shm file made like the block store, same lifetime and
cleanup). After its h2d of block b in pass p (pass p = step p-1, the flush = steps + 1:
one stamp per block pass, strictly increasing, never 0 = the file's initial value), a
rank writes p into its OWN cell (one writer per cell: no atomics); before its d2h of
block b it waits until the whole column b is >= p. A rank waits only for reads its
peers do before their own waits in program order, so the waits cannot form a cycle.

Ordering: the reader's copy has returned (CPU copies are synchronous, OpenMP joins
are full barriers) before its stamp is stored, and the writer loads the stamp before
it stores into the block; x86 (TSO) keeps those orders, as do the locks the Python
runtime takes between the two statements on weaker memory models.

Waiting: spin a few polls, then sleep 50 us doubling to 1 ms; after `timeout_s` raise
a PeerGone (a ZoError) naming the block, the pass and the ranks that have not read it
(a crashed peer normally stops the job sooner: the launchers stop all ranks on a
failure).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from zoexec.runtime.errors import PeerGone
from zoplan.errors import ZoError

SPIN_POLLS = 32
SLEEP_FIRST_S = 50e-6
SLEEP_MAX_S = 1e-3


@dataclass(kw_only=True, eq=False)
class ReadFlags:
    """This rank's handle on the node's read stamps ([local_ranks, num_blocks] int64)."""

    stamps: torch.Tensor        # shared mapping, shape [local_ranks, num_blocks]
    local_rank: int
    first_rank: int = 0         # global rank of local rank 0 (for messages)
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.stamps.dim() != 2 or self.stamps.dtype != torch.int64:
            raise ZoError(f"read stamps must be a 2-d int64 tensor, got "
                          f"{tuple(self.stamps.shape)} {self.stamps.dtype}")
        self._view = self.stamps.numpy()     # shares the mapping; fresh loads per poll

    def mark(self, block: int, stamp: int) -> None:
        """This rank has read `block` in pass `stamp` (call after the copy returned)."""
        self._view[self.local_rank, block] = stamp

    def wait(self, block: int, stamp: int) -> None:
        """Return once every local rank has read `block` in pass `stamp` (or later)."""
        column = self._view[:, block]
        for _ in range(SPIN_POLLS):
            if (column >= stamp).all():
                return
        deadline = time.monotonic() + self.timeout_s
        sleep_s = SLEEP_FIRST_S
        while not (column >= stamp).all():
            if time.monotonic() > deadline:
                raise PeerGone(self._timeout_message(block, stamp, column))
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, SLEEP_MAX_S)

    def _timeout_message(self, block: int, stamp: int, column: np.ndarray) -> str:
        late = [int(r) for r in np.flatnonzero(column < stamp)]
        ranks = ", ".join(f"{self.first_rank + r} (local {r}, stamp {int(column[r])})"
                          for r in late)
        return (f"write-back fence: rank {self.first_rank + self.local_rank} waited "
                f"{self.timeout_s:.0f} s for rank(s) {ranks} to read block {block} of "
                f"pass {stamp}; a peer is stuck or dead")
