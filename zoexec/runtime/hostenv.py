"""Host settings of a CPU rank (and of `zoplan profile`, which must see what a rank sees).

Two settings matter on small machines (measured figures: docs/measurements.md):
OpenMP workers that sleep instead of spinning when a parallel region ends, and a glibc
allocator that keeps freed memory for the next block's activations.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3   # glibc mallopt parameters


def keep_freed_memory() -> bool:
    """glibc only: serve allocations up to 32 MiB from the heap (a fixed mmap threshold)
    and return freed heap memory to the OS only beyond 128 MiB, so the activations a
    CPU rank allocates and frees on every block (tens of MB) are reused instead of
    page-faulted in again. It costs a rank up to that much retained memory. False where
    there is no glibc (the setting is simply not applied)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in
               ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 128 << 20),
                (_M_TOP_PAD, 16 << 20)))


def quiet_openmp() -> None:
    """OMP_WAIT_POLICY=PASSIVE for this process and the ranks it starts, unless the user
    chose a policy: torch's OpenMP workers then sleep when a parallel region ends
    instead of spinning on the cores that zoexec's z threads need next. Takes effect
    only if torch (libgomp) is not loaded yet: call it before importing torch."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
