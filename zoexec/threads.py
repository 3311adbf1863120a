"""How many torch threads a rank uses: the one rule shared by zoexec and `zoplan profile`.

Torch-free on purpose, so the planner side can import it without loading torch.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(cores: int, local_ranks: int) -> int:
    """The host's cores shared by its local ranks, at least one each."""
    return max(1, cores // local_ranks)


# ---- how z's chunks are spread over a rank's threads (zoexec.zo; the planner prices it) ----
Z_CHUNK = 1 << 20   # elements per independently seeded chunk (part of the z definition)


def chunk_bounds(numel: int, chunk: int | None = None) -> list[tuple[int, int]]:
    """[start, stop) of each z chunk (Z_CHUNK elements) of a tensor of `numel` elements."""
    chunk = chunk or Z_CHUNK
    return [(start, min(start + chunk, numel)) for start in range(0, numel, chunk)]


def balance(sizes: list[int], parts: int) -> list[list[int]]:
    """Indices of `sizes` per thread: largest first onto the least loaded thread (ties:
    the earlier item, then the lower thread), so a block's z work is spread the same way
    on every rank and the planner can compute its longest thread."""
    loads, groups = [0] * parts, [[] for _ in range(parts)]
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = loads.index(min(loads))
        groups[k].append(index)
        loads[k] += sizes[index]
    return groups


def z_makespan(tensor_numels: list[int], threads: int) -> tuple[int, int]:
    """(elements, chunks) of the busiest thread when a block's z is drawn with
    `threads` threads (zoexec.zo.z_block's rule)."""
    sizes = [stop - start for numel in tensor_numels for start, stop in chunk_bounds(numel)]
    threads = max(1, min(threads, len(sizes)))
    groups = balance(sizes, threads)
    busiest = max(groups, key=lambda g: sum(sizes[i] for i in g))
    return sum(sizes[i] for i in busiest), len(busiest)


# ---- the host allocator of a CPU rank -------------------------------------------------------
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3   # glibc mallopt parameters


def keep_freed_memory() -> bool:
    """glibc only: serve allocations up to 32 MiB from the heap (a fixed mmap threshold)
    and return freed heap memory to the OS only beyond 128 MiB, so the activations a
    CPU rank allocates and frees on every block (tens of MB) are reused instead of
    page-faulted in again: a tiny-opt block forward over 8192 tokens took 8,160 page
    faults and 58-62 ms without, 0 and 44-50 ms with (2-core VM). It costs a rank up to
    that much retained memory (opt-125m, 2 ranks: 554-611 MiB private on the rank that
    did not build the model against 556 MiB of buffers; keeping everything, no
    trimming at all, cost 790-851 MiB; the rank that built the model keeps up to 855).
    False where there is no glibc (the setting is simply not applied)."""
    import ctypes
    import ctypes.util

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
    instead of spinning on the cores that zoexec's z threads need next (a z draw of an
    OPT h=512 block right after a torch op took 16-20 ms spinning, 10 ms passive, on a
    2-core VM; block forwards were no slower). Takes effect only if torch (libgomp) is
    not loaded yet: call it before importing torch."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
