"""The process limits a run meets (ulimit -v, -n, -u), named before anything starts,
and a watchdog over the start-up phases that may hang on them. Torch-free.

Under a low address-space limit torch does not fail cleanly: importing it fails half
way (a MemoryError in the middle of an import), a thread it starts aborts the process
(rc 134, "terminate called without an active exception"), or gloo's
init_process_group waits forever, deaf to SIGTERM (its wait is in native code, where
Python's handlers do not run). So:

- `check_limits`, in `zoexec run` before torch is imported: the open-files limit is
  raised to its hard limit (as any process may), then each limit is compared with
  what a rank needs, and a run that would not fit is refused in one line naming every
  limit that is short, with the figure it needs. The address space a one-rank run
  reaches (VmPeak, as `benchmarks/executor/bench_limits.py` measures it) is
  NEED_AS_BASE with one torch thread and NEED_AS_PER_THREAD more for each further
  thread (glibc gives each thread that allocates its own 64 MiB arena, and a stack);
  the threads a rank starts are --threads (default: the cores over the local ranks)
  and the runtime's own. The process limit (ulimit -u) counts the user's processes and
  threads together; the kernel does not apply it to root.
- `watched(phase, limit_s)`: a watchdog thread over one start-up phase (joining the
  process group): if the phase outlasts `limit_s` (--timeout-s), or a stop signal
  comes while it runs (seen through signal.set_wakeup_fd, which the interpreter writes
  to even while the main thread waits in native code), it says in one line which phase,
  which signal or limit, and the process limits in force, removes what the command made
  (procwatch.stop_at_once's list) and ends the process: exit 128 + the signal, or 1.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from zoplan.errors import ZoError

GIB = 2**30
# measured on a 2-core VM (docs/failures.md, "Process limits"): VmPeak of a one-rank run
# of a tiny model from a checkpoint with a data file, --threads 1: 1,164,444 kB; --threads
# 2: 1,458,768 kB (benchmarks/executor/bench_limits.py, random init: 1,172,656 and 1,395,392)
NEED_AS_BASE = 1_164_444 * 1024
NEED_AS_PER_THREAD = (1_458_768 - 1_164_444) * 1024
NEED_FILES = 64          # open files a rank may hold at once (the data library, shards, sockets)
RUNTIME_THREADS = 8      # threads a rank starts besides torch's (gloo, the watchdogs, loaders)
UNLIMITED = resource.RLIM_INFINITY


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The soft limits of this process (UNLIMITED: none), and whether it is root."""

    address_space: int
    open_files: int
    processes: int
    root: bool

    @classmethod
    def now(cls) -> Limits:
        return cls(address_space=resource.getrlimit(resource.RLIMIT_AS)[0],
                   open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                   processes=resource.getrlimit(resource.RLIMIT_NPROC)[0],
                   root=os.geteuid() == 0)

    def words(self) -> str:
        """'address space 0.95 GiB (ulimit -v), open files 16 (ulimit -n)': the finite ones."""
        out = []
        if self.address_space != UNLIMITED:
            out.append(f"address space {self.address_space / GIB:.2f} GiB (ulimit -v)")
        if self.open_files != UNLIMITED:
            out.append(f"open files {self.open_files} (ulimit -n)")
        if self.processes != UNLIMITED and not self.root:
            out.append(f"processes and threads {self.processes} (ulimit -u)")
        return ", ".join(out) or "none"


def raise_open_files() -> None:
    """The open-files soft limit raised to the hard limit (any process may)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != UNLIMITED and (hard == UNLIMITED or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def user_processes(uid: int | None = None) -> int:
    """Threads of `uid`'s processes now (what RLIMIT_NPROC counts)."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def shortfalls(limits: Limits, *, threads: int, ranks: int, used: int = 0) -> list[str]:
    """What each limit too low for `ranks` local ranks of `threads` torch threads lacks
    ([]: they fit). `used`: the user's threads already running (ulimit -u counts them)."""
    short = []
    need_as = NEED_AS_BASE + NEED_AS_PER_THREAD * max(0, threads - 1)
    if limits.address_space != UNLIMITED and limits.address_space < need_as:
        short.append(f"the address-space limit (ulimit -v) is {limits.address_space / GIB:.2f} GiB, "
                     f"a rank with {threads} torch thread{'s' if threads > 1 else ''} needs about "
                     f"{need_as / GIB:.2f} GiB")
    if limits.open_files != UNLIMITED and limits.open_files < NEED_FILES:
        short.append(f"the open-files limit (ulimit -n) is {limits.open_files}, a rank needs "
                     f"{NEED_FILES}")
    need_threads = used + ranks * (threads + RUNTIME_THREADS) + 1
    if limits.processes != UNLIMITED and not limits.root and limits.processes < need_threads:
        short.append(f"the process limit (ulimit -u) is {limits.processes}, the run needs "
                     f"{need_threads} (your {used} threads running now, and {ranks} "
                     f"rank{'s' if ranks > 1 else ''} of {threads + RUNTIME_THREADS})")
    return short


def check_limits(*, threads: int | None, ranks: int, limits: Limits | None = None) -> None:
    """ZoError naming every process limit too low for the run (see the module docstring),
    before torch is imported; `threads`: --threads (None: the cores over the ranks)."""
    raise_open_files()
    limits = limits or Limits.now()
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, ranks))
    used = user_processes() if limits.processes != UNLIMITED and not limits.root else 0
    short = shortfalls(limits, threads=threads, ranks=ranks, used=used)
    if short:
        raise ZoError("; ".join(short) + ": raise " + ("it" if len(short) == 1 else "them")
                      + " (ulimit, or the job scheduler's limits) before starting zoexec run")


@contextmanager
def limited(phase: str) -> Iterator[None]:
    """A start-up phase that fails for want of a resource (no memory, no thread, no file:
    MemoryError, or an OS or runtime error of torch's) while a process limit is set: one
    ZoError naming the phase, the error and the limits in force (they are the likely
    cause: the user's to raise)."""
    try:
        yield
    except (MemoryError, OSError, RuntimeError) as exc:
        limits = Limits.now().words()
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if limits == "none" or not _for_want_of_resources(cause):
            raise
        what = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise ZoError(f"{phase} failed ({type(cause).__name__}: {what}) under the process limits "
                      f"{limits}: raise them (ulimit)") from None


SHORT_OF = (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
# torch relays a failed thread or allocation as a RuntimeError carrying the C library's
# words for it (no errno, no type of its own): those words are all there is to go by
SHORT_OF_WORDS = (*(os.strerror(code) for code in SHORT_OF), "can't start new thread",
                  "std::bad_alloc")


def _for_want_of_resources(exc: BaseException) -> bool:
    """A failure for want of memory, threads or files (see SHORT_OF_WORDS)."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in SHORT_OF
    return any(words in str(exc) for words in SHORT_OF_WORDS)


# ---- the start-up phases' watchdog ---------------------------------------------------------------
@contextmanager
def watched(phase: str, *, limit_s: float, end: Callable[[int, str], None],
            grace_s: float = 2.0) -> Iterator[None]:
    """Run the block under a watchdog (module docstring); `end(code, line)` ends the
    process (procwatch.end_now: the command's files removed, the line said); a stop
    signal the block has not ended on within `grace_s` ends it. Main thread only
    (elsewhere the block runs unwatched)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done = threading.Event()
    started = time.monotonic()

    def watch() -> None:
        while not done.is_set():
            left = limit_s - (time.monotonic() - started)
            ready, _, _ = select.select([read], [], [], max(0.0, min(left, 0.5)))
            if done.is_set():
                return
            if ready:
                got = os.read(read, 64)
                stops = [b for b in got if b in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
                if stops and not done.wait(grace_s):   # the main thread did not act on it
                    end(128 + stops[0], f"stopped by {signal.Signals(stops[0]).name} while "
                                        f"{phase}")
                continue
            if time.monotonic() - started >= limit_s:
                end(1, f"{phase} did not finish within {limit_s:g} s (--timeout-s); the process "
                       f"limits in force: {Limits.now().words()}")

    thread = threading.Thread(target=watch, name="zoexec-phase-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        try:                  # wake the watchdog now, not at its next half-second poll
            os.write(write, b"\0")
        except BlockingIOError:   # the pipe is full: it is awake already
            pass
        thread.join(1.0)
        os.close(read)
        os.close(write)

