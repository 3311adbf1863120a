"""An allocation tracker for tests and benchmarks: the bytes of live tensor storages
that torch operators create while it is active, and their peak (overall and per phase).

`AllocationTracker` is a TorchDispatchMode: after each operator it looks at the
operator's outputs, and a storage that none of the inputs shares (a factory, a new
result, a copy; not a view, not an `out=` or in-place result) is counted with its size
until the storage dies (a weakref finalizer on the storage, which torch keeps alive as
long as the storage exists). So the count is what the operators themselves allocated
and still hold, at every moment, independent of the allocator's caching.

What it does not see, by construction:
- memory that operators allocate and free inside one kernel (e.g. a TensorIterator's
  cast buffer, sdpa's per-thread blocks): one kernel's scratch, not a live tensor;
- operators run on other threads (dispatch modes are thread-local): zoexec.maths.zo's z
  threads only fill `out` in place, so nothing is missed there;
- `torch.from_file` (the node's shared block store: host memory on every device);
- storages made before `start` unless handed to `adopt`.
It is a measuring instrument (slow: every operator passes through Python), not
something a run uses.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

EXCLUDED_OPS = (torch.ops.aten.from_file.default,)

if TYPE_CHECKING:
    from typing import Self

    class _DispatchMode:
        """What the tracker takes from torch's TorchDispatchMode, as the type checker
        sees it (torch is not analysed: its class is Any, and a class cannot be typed
        on an Any base): a context manager whose __torch_dispatch__ runs every operator."""

        def __enter__(self) -> Self: ...

        def __exit__(self, *exc: object) -> None: ...
else:
    _DispatchMode = TorchDispatchMode


class AllocationTracker(_DispatchMode):
    """Live bytes of the storages created under it; `peak_bytes`, `phase_peaks`."""

    def __init__(self, *, counting: bool = True) -> None:
        super().__init__()
        self.counting = counting
        self.live: dict[int, int] = {}       # storage key -> bytes
        self.current_bytes = 0
        self.peak_bytes = 0
        self.phase_name = "-"
        self.phase_peaks: dict[str, int] = {}

    # ---- the window -----------------------------------------------------------------
    def start(self) -> None:
        """Count from now on (what is live stays counted)."""
        self.counting = True

    def stop(self) -> None:
        """Stop counting new storages (frees of counted ones still count)."""
        self.counting = False

    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count existing tensors' storages as if allocated now (each storage once)."""
        for tensor in tensors:
            self._add(tensor.untyped_storage())

    @contextmanager
    def phase(self, name: str) -> Iterator[AllocationTracker]:
        """Attribute the peaks reached inside to `name` (phases may nest)."""
        outer, self.phase_name = self.phase_name, name
        self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), self.current_bytes)
        try:
            yield self
        finally:
            self.phase_name = outer

    # ---- counting -------------------------------------------------------------------
    def _add(self, storage: torch.UntypedStorage) -> None:
        key, size = storage._cdata, storage.nbytes()
        if key in self.live:
            self._resize(key, size)
            return
        if size == 0 or storage.device.type == "meta":
            return
        self.live[key] = size
        weakref.finalize(storage, self._free, key)
        self._grow(size)

    def _resize(self, key: int, size: int) -> None:
        delta = size - self.live[key]
        if delta:
            self.live[key] = size
            self._grow(delta)

    def _grow(self, delta: int) -> None:
        self.current_bytes += delta
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
        if self.current_bytes > self.phase_peaks.get(self.phase_name, 0):
            self.phase_peaks[self.phase_name] = self.current_bytes

    def _free(self, key: int) -> None:
        self.current_bytes -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func: Callable[..., Any], types: Collection[type],
                           args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:   # any operator's
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in EXCLUDED_OPS:
            return out
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self.live:
                self._resize(key, storage.nbytes())
            elif self.counting and key not in inputs:
                self._add(storage)
        return out


def kernel_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes the CPU allocator handed out while `fn()` ran, kernel scratch
    included (what AllocationTracker cannot see): the running sum of torch.profiler's
    allocation events of this thread. Frees of memory allocated before are not
    reported, so `fn` should free only what it allocated."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            sizes.append((event.start_time_ns, event.extra_fields.alloc_size))
        stack.extend(event.children)
    current = peak = 0
    for _, size in sorted(sizes):
        current += size
        peak = max(peak, current)
    return peak
