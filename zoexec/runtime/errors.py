"""Typed failures of a rank, raised where they happen. Torch-free.

A rank's lanes run every task of a step under `failing(kind, rank=, block=, step=)`, and
the rank runs its other collectives (joining the job, the clock, the trace...) the same
way: an exception from inside comes out as a LaneFailure that knows what the rank was
doing (`what`: a task kind of zoplan.trace.KIND_LANE or one of OPERATIONS' other
names), on which block and in which step, and its cause. When `what` is a collective
and its cause is the transport's word that a peer went away or did not answer (gloo:
"Timed out waiting 10000ms for recv operation to complete", "Connection reset by
peer"; NCCL's watchdog: "Timeout(ms)=600000"; monitored_barrier: "Rank 1 failed to pass
monitoredBarrier in 10000 ms"), `peer` says how (PeerLoss), read from the cause there,
where the collective ran. A wait of the rank's own (the node's builder, the write-back
fence's read stamps) that gave up on a peer raises PeerGone, a ZoError.

zoexec.launch.failures turns these fields into the launcher's one line:
    the all-gather of block 2 in step 3 timed out after 10 s
    the loss all-reduce of step 3 lost its connection to a peer (Connection reset by peer)
    the forward of block 1 in step 0 failed: RuntimeError: ... (families.py:120)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zoplan.errors import ZoError, first_line
from zoplan.trace import NO_BLOCK

OPERATIONS = {   # what -> how the line names it ({block}: the block's index)
    "h2d": "the upload (h2d) of block {block}",
    "slice_update": "the slice update of block {block}",
    "allgather": "the all-gather of block {block}",
    "fence": "the write-back fence of block {block}",
    "update": "the update of block {block}",
    "forward": "the forward of block {block}",
    "d2h": "the write-back (d2h) of block {block}",
    "embed": "the embedding",
    "head": "the loss head",
    "allreduce": "the loss all-reduce",
    "join": "joining the job",
    "run_id": "the broadcast of the run id",
    "clock": "agreeing on the clock",
    "speed": "the barrier of a speed check",
    "flush": "the barrier after the last update",
    "shards": "the node's barrier before saving",
    "eval": "the all-reduce of the evaluation losses",
    "trace": "the gather of the trace",
}
COLLECTIVES = frozenset({"allgather", "fence", "allreduce", "join", "run_id", "clock", "speed",
                         "flush", "shards", "eval", "trace"})

_TIMEOUT_MS = (r"Timed out waiting (\d+) ?ms", r"Timeout\(ms\)=(\d+)", r"in (\d+) ?ms",
               r"timed out after (\d+) ?ms", r"timeout of (\d+) ?ms")
_LOST = (r"Connection reset by peer", r"Connection closed by peer", r"Broken pipe",
         r"Connection refused", r"Remote peer closed the connection", r"Socket closed",
         r"NCCL communicator was aborted", r"ncclRemoteError", r"Read error", r"Write error")
_PEER_RANK = r"\bRank (\d+) failed to pass monitoredBarrier"


class PeerGone(ZoError):
    """A wait of this rank for a peer (a message, a barrier, read stamps) gave up: the
    peer, not this rank, is the likely culprit."""


@dataclass(frozen=True, kw_only=True)
class PeerLoss:
    """How a collective lost its peer: timed out (after `timeout_s`, `waiting_for` a
    rank when the transport names it) or lost the connection (`lost`: its words)."""

    timeout_s: float | None = None
    lost: str | None = None
    waiting_for: int | None = None
    text: str = ""

    @classmethod
    def of(cls, cause: BaseException) -> PeerLoss | None:
        """The loss a collective's error reports, None when it reports none."""
        text = first_line(cause)
        millis = next((int(m[1]) for m in (re.search(p, text) for p in _TIMEOUT_MS) if m), None)
        lost = next((m[0] for m in (re.search(p, text, re.IGNORECASE) for p in _LOST) if m),
                    None)
        if millis is None and lost is None and "timed out" not in text.lower():
            return None
        peer = re.search(_PEER_RANK, text)
        return cls(timeout_s=None if millis is None else millis / 1000, lost=lost,
                   waiting_for=int(peer[1]) if peer and millis is not None else None, text=text)

    def __str__(self) -> str:
        if self.timeout_s is not None:
            waiting = f" waiting for rank {self.waiting_for}" if self.waiting_for is not None else ""
            return f"timed out after {self.timeout_s:g} s{waiting}"
        if self.lost is not None:
            return f"lost its connection to a peer ({self.lost})"
        return f"failed: {self.text}"


class LaneFailure(RuntimeError):
    """A task or collective of a rank failed: `what` (OPERATIONS' keys), `block` (None:
    no block), `step` (None: outside a training step: set-up, the flush of updates, an
    evaluation), `rank`, `cause` (the exception caught), `peer` (a PeerLoss for a
    collective whose peer went away, else None) and `where` (file:line of the cause)."""

    def __init__(self, *, what: str, rank: int, cause: BaseException, block: int | None = None,
                 step: int | None = None) -> None:
        if what not in OPERATIONS:
            raise ValueError(f"what must be one of {', '.join(OPERATIONS)}, got {what!r}")
        self.what, self.rank, self.cause, self.step = what, rank, cause, step
        self.block = None if block == NO_BLOCK else block
        self.peer = PeerLoss.of(cause) if what in COLLECTIVES else None
        self.where = where_of(cause)
        super().__init__(self.line())

    def __reduce__(self) -> tuple[Callable[..., LaneFailure], tuple[object, ...]]:
        return _rebuild, (self.what, self.rank, self.cause, self.block, self.step)

    def operation(self) -> str:
        """'the all-gather of block 2 in step 3', 'the loss all-reduce of step 3' (`step`
        is the step's index from 0; the line counts steps from 1, as every line does)."""
        text = OPERATIONS[self.what].format(block="?" if self.block is None else self.block)
        if self.step is not None:
            text += f" in step {self.step + 1}" if "{block}" in OPERATIONS[self.what] \
                else f" of step {self.step + 1}"
        return text

    def line(self) -> str:
        """The one line: the operation and how its peer was lost, or what failed."""
        if self.peer is not None:
            return f"{self.operation()} {self.peer}"
        return f"{self.operation()} failed: {error_line(self.cause)}"

    def renamed(self, what: str) -> LaneFailure:
        """The same failure, of a task that runs as another kind (the CUDA write-back
        fence runs on the all-gather's lane)."""
        return LaneFailure(what=what, rank=self.rank, cause=self.cause, block=self.block,
                           step=self.step)


def _rebuild(what: str, rank: int, cause: BaseException, block: int | None,
             step: int | None) -> LaneFailure:
    return LaneFailure(what=what, rank=rank, cause=cause, block=block, step=step)


@contextmanager
def failing(what: str, *, rank: int, block: int | None = None,
            step: int | None = None) -> Iterator[None]:
    """Run a task or a collective: an exception from inside comes out as a LaneFailure
    naming it; a ZoError (the user's problem, a peer gone) and a LaneFailure already
    named (an inner task) pass as they are, and so do KeyboardInterrupt and SystemExit."""
    try:
        yield
    except (LaneFailure, ZoError):
        raise
    except Exception as exc:
        raise LaneFailure(what=what, rank=rank, cause=exc, block=block, step=step) from exc


def where_of(exc: BaseException) -> str:
    """'file.py:line' of the innermost frame of the exception's traceback ('' if none)."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"


def error_line(exc: BaseException) -> str:
    """'RuntimeError: its first line (file.py:12)' for an error the rank did not expect."""
    name, text = type(exc).__name__, first_line(exc)
    where = where_of(exc)
    head = name if text == name else f"{name}: {text}"
    return f"{head} ({where})" if where else head
