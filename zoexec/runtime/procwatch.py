"""The processes of a run: who they are, whether they live, how they stop. Torch-free.

- ProcessId: a process named by its pid AND its start time (/proc/<pid>/stat), so that
  a pid the kernel has given to another process since does not pass for the one that
  exited. zoexec.store.shmfiles writes it into the names of a run's shared-memory files.
- become_rank / die_with, in a spawned rank: its own process group (a terminal's Ctrl-C
  reaches the launcher only, which forwards it exactly once), a process name
  `zoexec-rank<N>` (ps -o comm, pgrep), and a watchdog thread that polls the launcher
  about once a second and, when it has gone (even SIGKILLed), removes the run's files
  and kills the rank: no orphan trains on and writes outputs later. prctl's
  PR_SET_PDEATHSIG would not do: a forkserver child's parent is the forkserver.
- start_forkserver: the forkserver outlives a SIGTERM to the launcher's process group.
- StopRequest / stop_signals: a process's stop signals. In a rank: remembered until
  the next step boundary (zoexec.run.loop). supervise, in the launcher: SIGINT, SIGTERM
  and SIGHUP (a closed terminal: a stop as SIGTERM's, exit 129) are forwarded to the ranks once, with one line on stderr; the launcher then waits for
  them up to a grace period (--stop-grace-s, 120 s: the engine saves a snapshot
  at the next step boundary and exits 130, 143 or 129) and kills what is left; a second
  signal kills at once. Without a stop, the first rank that exits non-zero ends the
  job: a stopped rank (SIGSTOP, a debugger) is SIGKILLed at once (a SIGTERM would stay
  pending), the others get a second to exit on their own (they report why), then
  SIGTERM, then SIGKILL after KILL_GRACE_S.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import cast

from zoexec.config import RuntimeOptions

KILL_GRACE_S = 3.0          # a rank told to stop after a failure: SIGTERM, then SIGKILL
SETTLE_S = 1.0              # after a failure, the others' time to exit on their own first
POLL_S = 0.2                # the launcher's wait between looks at a stop request
WATCH_PERIOD_S = 1.0        # a rank's look at its launcher
FORWARD: dict[int, signal.Signals] = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
           signal.SIGHUP: signal.SIGHUP}   # a rank stops on SIGHUP as on SIGTERM, and says which
SHIELDED = {signal.SIGTERM, signal.SIGHUP}   # blocked in the forkserver (start_forkserver)
STOPPED_STATES = ("T", "t")  # /proc/<pid>/stat: stopped by a signal, stopped by a tracer


# ---- who a process is ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ProcessId:
    """A process of this machine: its pid and its start time (clock ticks after boot)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The process that has `pid` now, None when there is none."""
        fields = _stat(pid)
        return None if fields is None else cls(pid=pid, start=int(fields[19]))

    @classmethod
    def me(cls) -> ProcessId:
        me = cls.of(os.getpid())
        assert me is not None, "/proc/self/stat is unreadable"
        return me

    def alive(self) -> bool:
        """Whether this very process still runs (a zombie has exited)."""
        fields = _stat(self.pid)
        return fields is not None and int(fields[19]) == self.start and fields[0] not in ("Z", "X")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text[text.rindex(")") + 2:].split()


def run_state(pid: int) -> str | None:
    """The state letter of a process (R, S, D, T stopped, t traced, Z zombie), or None."""
    fields = _stat(pid)
    return fields[0] if fields else None


# ---- a spawned rank ---------------------------------------------------------------------------
def become_rank(rank: int) -> None:
    """First thing in a spawned rank: its own process group (Ctrl-C in a terminal goes
    to the launcher alone, which forwards it once), the default dispositions of the
    stop signals (the engine installs its own; with the fork start method the launcher's
    handlers would be inherited), writes to a terminal allowed from the background
    (stty tostop), and the name zoexec-rank<N>."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)     # blocked in the forkserver
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    set_process_name(f"zoexec-rank{rank}")


def set_process_name(name: str) -> None:
    """The kernel's name of this process (ps -o comm, pgrep; 15 bytes at most)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def die_with(owner: ProcessId, *, what: str | None, cleanup: Callable[[], object] = lambda: None,
             period_s: float = WATCH_PERIOD_S) -> threading.Thread:
    """Watch `owner` from a daemon thread; once it has gone, run `cleanup`, say so in
    one line (naming `what`; None: silently) and SIGKILL this process (nothing after
    that runs: no output is written)."""
    def watch() -> None:
        while owner.alive():
            time.sleep(period_s)
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - dying anyway; the next run's sweep clears it
            pass
        if what:
            say(f"zoexec: {what}: its launcher (pid {owner.pid}) has exited; stopping now")
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="zoexec-watchdog", daemon=True)
    thread.start()
    return thread


def say(line: str) -> None:
    """One line on stderr, unbuffered (safe in a signal handler); nothing if it is gone."""
    try:
        os.write(sys.stderr.fileno(), (line + "\n").encode())
    except (OSError, ValueError, AttributeError):
        pass


# ---- the launcher ------------------------------------------------------------------------------
def start_forkserver() -> None:
    """Start multiprocessing's forkserver (if it is not running) with SIGTERM and SIGHUP
    blocked, a mask it keeps: a signal to the launcher's whole process group (GNU
    timeout, kill -TERM -PGID) then leaves it alone. Were it to die, its ranks would
    look exited (code 255) to the launcher while they still save their snapshot. The
    ranks unblock them (become_rank); a signal sent meanwhile waits, it is not lost."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()    # first: starting it unblocks SIGTERM again
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# ---- a stop before a run takes its signals -------------------------------------------------------
_ON_STOP: list[Callable[[], object]] = []    # what stop_at_once removes, newest first


@contextmanager
def undone_on_stop(undo: Callable[[], object]) -> Iterator[None]:
    """While the block runs, `undo` (the removal of what it made: a rendezvous folder, a
    new run's folder) runs if a stop signal ends the process at once (stop_at_once)."""
    _ON_STOP.append(undo)
    try:
        yield
    finally:
        _ON_STOP.remove(undo)


def end_now(code: int, line: str) -> None:
    """End this process at once from any thread: what the command made removed
    (undone_on_stop), `line` said ("zoexec: <line>"), exit `code`."""
    for undo in reversed(list(_ON_STOP)):
        try:
            undo()
        except Exception:  # noqa: BLE001 - the others still go; `zoexec clean` finds the rest
            pass
    say(f"zoexec: {line}")
    os._exit(code)


def stop_at_once(signum: int, _frame: object = None) -> None:
    """The handler of SIGINT, SIGTERM and SIGHUP while a command starts or ends (nothing
    to save: no step ran, or the run is over): what the command made so far is removed
    (undone_on_stop), one line names the signal (none for Ctrl-C) and the process exits
    128 + the signal, at once. Nothing is raised: an exception thrown into whatever was
    running (an import, a library's own handler) could be caught and go on, or leave a
    module half imported for the code after it."""
    for undo in reversed(list(_ON_STOP)):
        try:
            undo()
        except Exception:  # noqa: BLE001 - the others still go; `zoexec clean` finds the rest
            pass
    if signum != signal.SIGINT:
        say(f"zoexec: stopped by {signal.Signals(signum).name}")
    os._exit(128 + signum)


@dataclass(kw_only=True, eq=False)
class StopRequest:
    """The stop signals this process got (installed by `stop_signals`). In the launcher
    (`procs`: its ranks, shared with the caller) the first is forwarded to the ranks
    started so far and starts the grace period; a second one kills them at once. In a
    rank (`procs` None) the first is remembered and acted on at the next step boundary
    (zoexec.run.loop); a SIGINT after a SIGINT interrupts at once (KeyboardInterrupt)."""

    procs: list[BaseProcess] | None = None
    grace_s: float = math.inf
    signum: int | None = None
    forced: list[int] | None = None    # the indexes a second signal killed
    deadline: float = math.inf
    told: int = 0                      # procs[:told] got the forwarded signal

    def started(self, proc: BaseProcess) -> None:
        """Add a rank just started; it gets the forwarded signal if one came first."""
        assert self.procs is not None   # the launcher's (a rank has no procs)
        self.procs.append(proc)
        if self.signum is not None:
            signal_all(self.procs[self.told:], FORWARD[self.signum])
            self.told = len(self.procs)

    def handle(self, signum: int, _frame: FrameType | None = None) -> None:
        if self.signum is None:
            self.signum, self.deadline = signum, time.monotonic() + self.grace_s
            if self.procs is not None:
                say(f"zoexec: stopping: the ranks save a snapshot (up to {self.grace_s:g} s)")
                signal_all(self.procs, FORWARD[signum])
                self.told = len(self.procs)
        elif self.procs is None:
            if self.signum == signal.SIGINT and signum == signal.SIGINT:
                raise KeyboardInterrupt
        elif self.forced is None:
            self.forced = [i for i, proc in enumerate(self.procs)
                           if proc.pid is not None and proc.exitcode is None]
            signal_all(self.procs, signal.SIGKILL)

    @property
    def over(self) -> bool:
        return self.forced is not None or time.monotonic() >= self.deadline


@contextmanager
def stop_signals(procs: list[BaseProcess] | None, *, grace_s: float = math.inf,
                 signals: tuple[int, ...] = tuple(FORWARD)) -> Iterator[StopRequest]:
    """Handle `signals` (the launcher's: SIGINT, SIGTERM and SIGHUP) with a StopRequest
    while the block runs (main thread only: elsewhere signals stay as they are); the
    handlers from before come back at the end (a run inside another program)."""
    stop = StopRequest(procs=procs, grace_s=grace_s)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {signum: signal.signal(signum, stop.handle) for signum in signals}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def signal_all(procs: list[BaseProcess], signum: int) -> None:
    for proc in procs:
        if proc.pid is not None and proc.exitcode is None:
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass


@dataclass(kw_only=True)
class Outcome:
    """How the ranks ended. `first`: the index of the first that exited non-zero
    outside a stop; `signum`: the stop signal received (None: none); `killed`: the
    indexes this launcher had to kill, with why ("stopped": found stopped, "hung": did
    not exit when told, "grace": did not exit within the stop's grace period,
    "forced": a second stop signal)."""

    first: int | None = None
    signum: int | None = None
    grace_s: float = RuntimeOptions.stop_grace_s   # --stop-grace-s
    exitcodes: list[int | None] = field(default_factory=list)
    killed: dict[int, str] = field(default_factory=dict)


def supervise(procs: list[BaseProcess], stop: StopRequest) -> Outcome:
    """Wait for the ranks: all exit, or one fails, or a stop runs its course; then end
    the ones still running (see the module docstring). Every process is joined."""
    outcome = Outcome(grace_s=stop.grace_s)
    outcome.first = _wait_first_failure(procs, stop)
    if stop.signum is not None:
        outcome.signum = stop.signum
        outcome.killed.update({index: "forced" for index in stop.forced or ()})
        for index, proc in enumerate(procs):
            if proc.exitcode is None:
                outcome.killed.setdefault(index, "grace")
        signal_all(procs, signal.SIGKILL)
    end_all(procs, outcome)
    outcome.exitcodes = [proc.exitcode for proc in procs]
    return outcome


def _wait_first_failure(procs: list[BaseProcess], stop: StopRequest) -> int | None:
    """Index of the first process that exited non-zero (None: all exited with 0, or a
    stop ended the wait: every rank exited, its grace ran out, or a second signal)."""
    alive = {proc.sentinel: index for index, proc in enumerate(procs)}
    while alive:
        for sentinel in cast(list[int], multiprocessing.connection.wait(list(alive), timeout=POLL_S)):
            index = alive.pop(sentinel)
            procs[index].join()
            if procs[index].exitcode != 0 and stop.signum is None:
                return index
        if stop.signum is not None and stop.over:
            return None
    return None


def end_all(procs: list[BaseProcess], outcome: Outcome | None = None) -> None:
    """Stop every rank still running: stopped ones SIGKILLed at once, the others given
    SETTLE_S to exit by themselves, then SIGTERM, then SIGKILL after KILL_GRACE_S.
    Records what it had to kill in `outcome.killed`."""
    killed = outcome.killed if outcome is not None else {}
    running = [i for i, proc in enumerate(procs) if proc.pid is not None and proc.exitcode is None]
    for index in running:
        if run_state(cast(int, procs[index].pid)) in STOPPED_STATES:   # started (pid set)
            killed.setdefault(index, "stopped")
            _kill(procs[index], signal.SIGKILL)
    _join_all(procs, SETTLE_S)
    for proc in procs:
        if proc.pid is not None and proc.exitcode is None:
            _kill(proc, signal.SIGTERM)
    _join_all(procs, KILL_GRACE_S)
    for index, proc in enumerate(procs):
        if proc.pid is not None and proc.exitcode is None:
            killed.setdefault(index, "hung")
            _kill(proc, signal.SIGKILL)
            proc.join()


def _kill(proc: BaseProcess, signum: int) -> None:
    try:
        os.kill(cast(int, proc.pid), signum)   # end_all's: started ones
    except ProcessLookupError:
        pass


def _join_all(procs: list[BaseProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(0.0, deadline - time.monotonic()))
