"""Where host memory and a rank's threads live on a machine of several NUMA nodes (Linux).

- `interleave`: the block store's pages spread round-robin over the memory nodes
  (mbind MPOL_INTERLEAVE on the fresh mapping, before any page exists), so that no
  socket's memory bandwidth bounds the node's uploads and every GPU reads half its
  blocks locally on a two-socket server. On a tmpfs (/dev/shm) the policy is the
  file's own: it holds for every rank that maps it and for the pages fallocate makes.
- `bind_near_pci`: the calling process's threads moved to the CPUs of a PCI device's
  socket (sysfs local_cpulist), within the CPUs it was allowed.
- `page_placement`: how many bytes of a buffer lie on each node (move_pages, query).

`interleave` and `bind_near_pci` change nothing on a machine of one memory node, nor
where the syscalls or the sysfs lists are missing or refused (said once per process):
nothing here changes what a run computes, only where pages and threads sit. The syscalls go through libc's syscall(2) (`_syscall`, replaceable in tests).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SYSFS = Path("/sys")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MPOL_INTERLEAVE = 3
_SYSCALL_NUMBERS = {   # Linux syscall numbers (arch/x86/entry/syscalls, asm-generic/unistd.h)
    "x86_64": {"mbind": 237, "move_pages": 279},
    "aarch64": {"mbind": 235, "move_pages": 239},
}
_said: set[str] = set()


def say_once(key: str, message: str) -> None:
    """One `zoexec: note:` line on stderr per process and key."""
    if key not in _said:
        _said.add(key)
        print(f"zoexec: note: {message}", file=sys.stderr)


def page_span(addr: int, nbytes: int) -> tuple[int, int]:
    """(start, length) of the whole pages that hold bytes [addr, addr + nbytes)."""
    start = addr - addr % PAGE_BYTES
    end = -(-(addr + nbytes) // PAGE_BYTES) * PAGE_BYTES
    return start, end - start


# ---- lists and nodes --------------------------------------------------------------------------
def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's list format) -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpulist: sorted, runs joined ('0-3,8')."""
    ordered, runs = sorted(set(cpus)), list[list[int]]()
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def _read_list(path: Path) -> list[int] | None:
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return None


def memory_nodes(sysfs: Path = SYSFS) -> list[int]:
    """The NUMA nodes with both memory and CPUs (GPU memory shown as a node, as on
    Grace Hopper, and CPU-less memory expanders are left out); [0] where sysfs has no
    NUMA information."""
    base = sysfs / "devices/system/node"
    memory, cpus = _read_list(base / "has_memory"), _read_list(base / "has_cpu")
    if memory is None:
        return _read_list(base / "online") or [0]
    return sorted(set(memory) & set(cpus)) if cpus is not None else memory


# ---- syscalls ---------------------------------------------------------------------------------
def _syscall(name: str, *args: object) -> int:
    """libc syscall(2) of `name`; OSError when it fails or this architecture is unknown."""
    number = _SYSCALL_NUMBERS.get(platform.machine(), {}).get(name)
    if number is None or not sys.platform.startswith("linux"):
        raise OSError(0, f"{name} is not available on {platform.machine()} {sys.platform}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return int(result)


def _node_mask(nodes: list[int]) -> tuple[ctypes.Array[ctypes.c_ulong], int]:
    """(bitmask words, maxnode) in mbind's format (the kernel reads maxnode - 1 bits)."""
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    words = (ctypes.c_ulong * (max(nodes) // bits + 1))()
    for node in nodes:
        words[node // bits] |= 1 << (node % bits)
    return words, len(words) * bits + 1


def interleave(addr: int, nbytes: int, *, what: str = "the block store",
               sysfs: Path = SYSFS) -> bool:
    """Interleave the pages of a fresh mapping over the memory nodes; True if the policy
    was set. Pages that already exist stay where they are (no migration)."""
    nodes = memory_nodes(sysfs)
    if len(nodes) < 2 or nbytes <= 0:
        return False
    start, length = page_span(addr, nbytes)
    mask, maxnode = _node_mask(nodes)
    try:
        _syscall("mbind", ctypes.c_void_p(start), ctypes.c_ulong(length),
                 ctypes.c_int(MPOL_INTERLEAVE), mask, ctypes.c_ulong(maxnode), ctypes.c_uint(0))
    except OSError as exc:
        say_once("interleave", f"{what} is not interleaved over NUMA nodes "
                 f"{format_cpulist(nodes)} ({exc.strerror}); its pages sit where they "
                 f"are first touched")
        return False
    return True


# ---- threads near a device --------------------------------------------------------------------
def pci_address(domain: int | None, bus: int | None, device: int | None) -> str | None:
    """sysfs name of PCI function 0 of a device ('0000:18:00.0'), None if unknown."""
    if domain is None or bus is None or device is None:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def _thread_ids() -> list[int]:
    """The threads of this process (0: the calling one, where /proc is missing)."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def bind_near_pci(address: str, *, sysfs: Path = SYSFS) -> str:
    """Move this process's threads to the CPUs local to PCI device `address` that it
    may use; threads it starts later inherit them. Returns the CPU list bound to, or ''
    where nothing changed (unknown locality, no overlap, already there, no affinity)."""
    if not hasattr(os, "sched_setaffinity"):
        return ""
    local = _read_list(sysfs / "bus/pci/devices" / address / "local_cpulist")
    if not local:
        say_once("bind", f"no CPU list for PCI device {address} in {sysfs}; threads stay "
                 f"on all allowed CPUs")
        return ""
    allowed = os.sched_getaffinity(0)
    near = allowed & set(local)
    if not near:
        say_once("bind", f"none of the CPUs {format_cpulist(allowed)} this process may "
                 f"use is near PCI device {address} ({format_cpulist(local)}); threads "
                 f"stay where they are")
        return ""
    if near == allowed:
        return ""
    for tid in _thread_ids():
        try:
            os.sched_setaffinity(tid, near)
        except ProcessLookupError:   # a thread that has just exited
            continue
    return format_cpulist(near)


# ---- where pages are --------------------------------------------------------------------------
def page_placement(tensor: Any, *, max_pages: int = 1 << 16) -> dict[str, Any]:   # tensor: torch-free here
    """Where the pages of a host tensor are: {"bytes", "page_bytes", "pages_queried",
    "node_bytes": {"<node>": bytes}, "not_present_bytes", "source"}. Only pages this
    process has mapped are seen: a page never touched through this mapping counts as
    not present, even where another rank has it (ask local rank 0 after the fill, or
    any rank after a step). Past `max_pages` pages, that many evenly spread pages are
    queried and the bytes scaled (an estimate). `source` is "move_pages", or
    "unavailable: <why>" with empty counts. Plain types only (JSON-ready)."""
    nbytes = tensor.numel() * tensor.element_size()
    out: dict[str, Any] = {"bytes": nbytes, "page_bytes": PAGE_BYTES, "pages_queried": 0, "node_bytes": {},
           "not_present_bytes": 0, "source": "move_pages"}
    if nbytes == 0:
        return out
    start, length = page_span(tensor.data_ptr(), nbytes)
    total = length // PAGE_BYTES
    count = min(total, max_pages)
    pages = (ctypes.c_void_p * count)(*(start + (i * total // count) * PAGE_BYTES
                                        for i in range(count)))
    status = (ctypes.c_int * count)()
    try:
        _syscall("move_pages", ctypes.c_int(0), ctypes.c_ulong(count), pages, None, status,
                 ctypes.c_int(0))
    except OSError as exc:
        return {**out, "source": f"unavailable: {exc.strerror}"}
    counts: dict[int, int] = {}
    for node in status:              # a node, or -errno (ENOENT: never touched)
        counts[max(node, -1)] = counts.get(max(node, -1), 0) + 1
    scale = nbytes / count
    out["node_bytes"] = {str(node): round(n * scale) for node, n in sorted(counts.items())
                         if node >= 0}
    out["not_present_bytes"] = round(counts.get(-1, 0) * scale)
    out["pages_queried"] = count
    return out
