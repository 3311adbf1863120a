"""Page-locking of host memory a rank copies from and to (cudaHostRegister & friends),
and the pinned staging path its copies take where page-locking failed.

- `pin_host_memory` page-locks byte spans of a host tensor this process mapped (the
  whole tensor, or the spans `copy_spans` gives: a rank locks only the pieces of the
  node's store it copies, not the whole store). Spans are merged, widened to whole
  pages, and registered at most PIN_CALL_BYTES per cudaHostRegister call: drivers
  reject one call of 512 GiB or more. If any call fails, those already made are
  undone, CUDA's last error is cleared (or the next kernel launch would raise it), the
  rank says so on stderr, and the copies take the staging path.
- `Staging` (used where the store is not page-locked): an h2d copies the store's piece
  into a small pinned slot on the host, then the slot to the device asynchronously on
  the copy stream; a d2h copies the device into a slot asynchronously and the slot's
  bytes reach the store when the slot is next needed or at `drain` (the end of a step).
  Prefetch is kept: the host waits only for a slot's own earlier copy, never for the
  compute, so blocks still overlap (a pageable copy would be synchronous).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from zoexec.runtime import numa
from zoexec.runtime.hostmem import filesystem_type, mapped_file

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from zoexec.runtime.groups import DistEnv

Span = tuple[int, int]   # (start address, length in bytes)

CUDA_HOST_REGISTER_PORTABLE = 1
PIN_CALL_BYTES = 64 << 30     # largest span one cudaHostRegister call is given
STAGE_SLOT_BYTES = 64 << 20   # one pinned staging slot
STAGE_SLOTS = 8               # slots of the staging ring (512 MiB of pinned memory)

_pinned: dict[int, list[int]] = {}   # tensor data_ptr -> registered page starts


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """(start, length) byte spans widened to whole pages, sorted, overlapping or
    touching ones merged: what can be registered once each."""
    out: list[list[int]] = []
    for start, length in sorted(numa.page_span(s, n) for s, n in spans if n > 0):
        if out and start <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], start + length - out[-1][0])
        else:
            out.append([start, length])
    return [(s, n) for s, n in out]


def register_calls(spans: Iterable[Span], *, limit: int = PIN_CALL_BYTES) -> list[Span]:
    """The spans cut into cudaHostRegister calls of at most `limit` bytes."""
    calls: list[Span] = []
    for start, length in spans:
        for offset in range(0, length, limit):
            calls.append((start + offset, min(limit, length - offset)))
    return calls


def copy_spans(base: int, item: int, *, stride: int, blocks: Iterable[int],
               reads: tuple[int, int], writes: tuple[int, int],
               written_blocks: Iterable[int]) -> list[Span]:
    """Byte spans (start, length) of a store at address `base` (elements of `item`
    bytes, one block every `stride` elements) that a rank copies: piece reads[0] of
    reads[1] of every block in `blocks` (its h2d slices and resident shards) and piece
    writes[0] of writes[1] of every block in `written_blocks` (its d2h write-back)."""
    spans: list[Span] = []
    for (index, parts), chosen in ((reads, blocks), (writes, written_blocks)):
        size = stride // parts
        spans += [(base + (b * stride + index * size) * item, size * item) for b in chosen]
    return spans


def pin_host_memory(env: DistEnv, tensor: torch.Tensor,
                    spans: Iterable[Span] | None = None) -> bool:
    """Page-lock `tensor` (or only its byte `spans`) when the rank runs on CUDA, so
    H2D/D2H copies are asynchronous DMA (see the module docstring). False on the CPU
    and where registering fails. A store that is a regular file rather than tmpfs may
    be refused: Linux 6.5+ does not let long-term pins hold shared file pages that need
    writeback."""
    if not env.is_cuda:
        return False
    return pin_tensor(tensor, spans, who=f"rank {env.rank} (local {env.local_rank})")


def pin_tensor(tensor: torch.Tensor, spans: Iterable[Span] | None = None, *,
               who: str = "zoexec") -> bool:
    """cudaHostRegister of `tensor`'s pages (or of its byte `spans`), at most
    PIN_CALL_BYTES a call; False (nothing left registered, CUDA's error cleared, a
    warning naming `who`) where a call fails."""
    if tensor.numel() == 0:
        return False
    nbytes = tensor.numel() * tensor.element_size()
    spans = [(tensor.data_ptr(), nbytes)] if spans is None else spans
    calls = register_calls(merge_spans(spans))
    cudart = torch.cuda.cudart()
    done: list[int] = []
    for start, length in calls:
        err = cudart.cudaHostRegister(start, length, CUDA_HOST_REGISTER_PORTABLE)
        if int(err) != 0:
            _clear_cuda_error(cudart)
            _unregister(cudart, done)
            total = sum(n for _, n in calls)
            print(f"zoexec: warning: {who}: cudaHostRegister of {length} bytes (call "
                  f"{len(done) + 1} of {len(calls)}, {total} bytes in all) failed with "
                  f"{_cuda_error_text(cudart, err)}{_backing_note(start)}; transfers go "
                  f"through pinned staging slots", file=sys.stderr)
            return False
        done.append(start)
    _pinned[tensor.data_ptr()] = done
    return True


def unpin_host_memory(tensor: torch.Tensor) -> bool:
    """Undo pin_host_memory for this tensor; nothing (False) if it was not pinned."""
    starts = _pinned.pop(tensor.data_ptr(), None)
    if starts is None:
        return False
    return _unregister(torch.cuda.cudart(), starts)


def _unregister(cudart: Any, starts: list[int]) -> bool:   # cudart: torch's module
    ok = True
    for start in starts:
        err = cudart.cudaHostUnregister(start)
        if int(err) != 0:
            _clear_cuda_error(cudart)
            print(f"zoexec: warning: cudaHostUnregister failed with "
                  f"{_cuda_error_text(cudart, err)}", file=sys.stderr)
            ok = False
    return ok


def _cuda_error_text(cudart: Any, err: Any) -> str:
    try:
        return f"cudaError {int(err)} ({cudart.cudaGetErrorString(err)})"
    except (AttributeError, TypeError, RuntimeError):
        return f"cudaError {int(err)}"


def _backing_note(addr: int) -> str:
    path = mapped_file(addr)
    kind = filesystem_type(path) if path is not None else None
    if kind in (None, "tmpfs"):
        return ""
    return (f" (it maps {path}, a file on {kind}, not tmpfs: give a --shm-dir on a "
            f"tmpfs with room to page-lock it)")


def _clear_cuda_error(cudart: Any) -> int:
    """Read (and so reset) the CUDA runtime's last error of this thread. torch's cudart
    module binds no cudaGetLastError (up to 2.x); then the runtime library this process
    loaded is asked through ctypes. Returns the error read, -1 if none could be."""
    get = getattr(cudart, "cudaGetLastError", None) or _runtime_get_last_error()
    if get is None:
        print("zoexec: warning: cannot reach cudaGetLastError; the next CUDA launch may "
              "report the failed registration", file=sys.stderr)
        return -1
    return int(get())


def _runtime_get_last_error() -> Callable[[], int] | None:
    """cudaGetLastError of the libcudart already loaded in this process, or None."""
    candidates: list[str | None] = [None]   # the global namespace first
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            name = line.split(maxsplit=5)[-1]
            if "/libcudart" in name and name not in candidates:
                candidates.append(name)
    except OSError:
        pass
    for lib in candidates:
        try:
            return ctypes.CDLL(lib).cudaGetLastError
        except (OSError, AttributeError):
            continue
    return None


# ---- the staging path -------------------------------------------------------------------------
class _Event(Protocol):
    """What a slot waits on: a recorded CUDA event (or a test's fake)."""

    def synchronize(self) -> None: ...


class _Recorded(_Event, Protocol):
    def record(self) -> None: ...


@dataclass(kw_only=True, eq=False)
class _Slot:
    buf: torch.Tensor
    done: _Event | None = None           # event of the slot's last device copy
    out: torch.Tensor | None = None      # store range its bytes still owe (a d2h)


@dataclass(kw_only=True, eq=False)
class Staging:
    """A ring of pinned host slots the copies of an unpinned store go through (the
    module docstring). `event` makes the event recorded after a device copy on the
    current stream (a CUDA event; tests pass a fake); `pin` page-locks the slots."""

    dtype: torch.dtype
    slot_bytes: int = STAGE_SLOT_BYTES
    num_slots: int = STAGE_SLOTS
    pin: bool = True
    event: Callable[[], _Event] = field(default=lambda: _recorded(torch.cuda.Event()))
    slots: list[_Slot] = field(default_factory=list)
    _next: int = 0

    def __post_init__(self) -> None:
        item = torch.empty(0, dtype=self.dtype).element_size()
        numel = max(1, self.slot_bytes // item)
        self.slots = [_Slot(buf=torch.empty(numel, dtype=self.dtype, pin_memory=self.pin))
                      for _ in range(self.num_slots)]

    def _take(self) -> _Slot:
        """The next slot, free: its last device copy done, a d2h's bytes in the store."""
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        self._settle(slot)
        return slot

    @staticmethod
    def _settle(slot: _Slot) -> None:
        if slot.done is not None:
            slot.done.synchronize()
            slot.done = None
        if slot.out is not None:
            slot.out.copy_(slot.buf[:slot.out.numel()])
            slot.out = None

    def h2d(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst (device) <- src (pageable host), through the slots, on the current stream."""
        for lo, hi in self._chunks(src.numel()):
            slot = self._take()
            slot.buf[:hi - lo].copy_(src[lo:hi])
            dst[lo:hi].copy_(slot.buf[:hi - lo], non_blocking=True)
            slot.done = self.event()

    def d2h(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst (pageable host) <- src (device): queued on the current stream; the bytes
        reach dst when the slot is next taken or at drain()."""
        for lo, hi in self._chunks(src.numel()):
            slot = self._take()
            slot.buf[:hi - lo].copy_(src[lo:hi], non_blocking=True)
            slot.done, slot.out = self.event(), dst[lo:hi]

    def drain(self) -> None:
        """Every queued d2h's bytes in the store (the end of a step, before a save)."""
        for slot in self.slots:
            self._settle(slot)

    def _chunks(self, numel: int) -> list[tuple[int, int]]:
        size = self.slots[0].buf.numel()
        return [(lo, min(numel, lo + size)) for lo in range(0, numel, size)]


def _recorded(event: _Recorded) -> _Recorded:
    event.record()
    return event
