"""Why a job stopped, in one line. Torch-free.

A rank that fails says why (`failure_reason`), with what exit code (`exit_code`), and
whether it failed by itself (ERROR), because a peer went away or stopped answering
(PEER: a collective that timed out or lost its connection, a wait that gave up) or
stopped on purpose (HALT: an exception with exit_code 129, 130 or 143, the engine's answer
to SIGHUP / SIGINT / SIGTERM, whose message names the snapshot). The launcher then names the
rank that failed FIRST (`job_failure`), from what it saw of every rank:

1. a rank's own error (an exception, a user error):
     rank 1 failed: RuntimeError: injected fault at step 1 (engine.py:233)
2. a rank killed by a signal it did not get from the launcher:
     rank 1 was killed by signal 9 (SIGKILL: kill -9 or the out-of-memory killer); then
     rank 0 failed: the loss all-reduce of step 3 lost its connection to a peer
     (Connection reset by peer)
3. a rank found stopped (SIGSTOP, a debugger), which the launcher killed:
     rank 1 was stopped (SIGSTOP or a debugger) and was killed; rank 0 failed: the
     all-gather of block 2 in step 3 timed out after 10 s
4. a rank that exited non-zero without saying why;
5. ranks that stopped on purpose: the engine's line (stopped by SIGTERM after step 3;
   snapshot ...);
6. else the first peer failure, with the ranks that then had to be killed.
A job the launcher stopped (a signal to it) says so: the engine's line, else "stopped
by SIGINT", with the ranks that did not exit within the grace period.

A rank's failure comes typed from where it happened (zoexec.runtime.errors): a
LaneFailure names the task or collective (what, block, step) and, for a collective
whose peer went away, how (timed out, lost its connection); a PeerGone is a wait for a
peer that gave up. Nothing here reads an exception's text or its frames' variables;
any other exception is quoted with its type, first line and where it was raised.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from zoexec.run.writes import is_disk_full
from zoexec.runtime.errors import LaneFailure, PeerGone, error_line
from zoplan.errors import EXIT_USER_ERROR, ZoError, first_line

if TYPE_CHECKING:
    from zoexec.runtime.procwatch import Outcome

ERROR, PEER, HALT = "error", "peer", "halt"      # what a rank's failure was (HALT: on purpose)
USER, RANK, STOPPED = "user", "rank", "stopped"    # what job_failure's line is
EXIT_RANK_FAILED = 1
HALT_CODES = (129, 130, 143)                       # a rank that stopped on SIGHUP / SIGINT / SIGTERM
SIGNAL_HINTS: dict[int, str] = {signal.SIGKILL: "kill -9 or the out-of-memory killer",
                signal.SIGSEGV: "a crash in native code", signal.SIGABRT: "an abort in native code",
                signal.SIGBUS: "shared memory ran out? see df /dev/shm",
                signal.SIGTERM: "kill or a job scheduler", signal.SIGINT: "Ctrl-C"}


# ---- a rank's side -------------------------------------------------------------------------
def failure_reason(exc: BaseException) -> str:
    """One line saying why a rank stopped (a full disk where no writer named its file:
    the error, after "no space left on a device")."""
    if isinstance(exc, ZoError) or _exit_code(exc) is not None:
        return first_line(exc)
    if is_disk_full(exc):
        return f"no space left on a device: {error_line(exc)}"
    if isinstance(exc, LaneFailure):
        return exc.line()
    return error_line(exc)


def failure_kind(exc: BaseException) -> str:
    """PEER when the failure is a peer's absence (a collective that timed out or lost
    its connection, a wait that gave up), HALT for a run stopped on purpose by a signal
    or on purpose (zoexec.run.loop.RunStopped: a signal, a non-finite step), else ERROR."""
    if _exit_code(exc) in HALT_CODES or getattr(exc, "on_purpose", False):
        return HALT
    if isinstance(exc, PeerGone) or (isinstance(exc, LaneFailure) and exc.peer is not None):
        return PEER
    return ERROR


def exit_code(exc: BaseException) -> int:
    """The exit code of a rank that raised `exc`: the exception's own exit_code (a run
    stopped on purpose), 2 for a user's error, else 1."""
    own = _exit_code(exc)
    if own is not None:
        return own
    return EXIT_USER_ERROR if isinstance(exc, ZoError) or is_disk_full(exc) else EXIT_RANK_FAILED


def _exit_code(exc: BaseException) -> int | None:
    code = getattr(exc, "exit_code", None)
    return code if isinstance(code, int) and not isinstance(exc, SystemExit) else None


# ---- the launcher's side ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Report:
    """What a failing rank told the launcher."""

    rank: int
    code: int
    text: str
    kind: str = ERROR


def job_failure(outcome: Outcome, reports: list[Report]) -> tuple[str, str, int] | None:
    """(one line, USER | RANK | STOPPED, exit code) for a job that did not end well,
    None for one that did. `outcome`: procwatch.Outcome (index = rank); `reports` in
    arrival order."""
    if outcome.signum is not None:
        return _stopped_line(outcome, reports), STOPPED, 128 + outcome.signum
    if outcome.first is None:
        return None
    errors = [r for r in reports if r.kind == ERROR]
    if errors:
        first = errors[0]
        if first.code == EXIT_USER_ERROR:
            return f"rank {first.rank} failed: {first.text}", USER, EXIT_USER_ERROR
        return f"rank {first.rank} failed: {first.text}", RANK, first.code or EXIT_RANK_FAILED
    halts = sorted((r for r in reports if r.kind == HALT), key=lambda r: r.rank)
    told = {r.rank for r in reports}
    if halts:    # the ranks stopped together (one got a signal): exiting 130 / 143 is no culprit
        told |= {i for i, code in enumerate(outcome.exitcodes) if code in HALT_CODES}
    culprit = _culprit(outcome, told)
    if culprit is not None:
        rank, what, joint = culprit
        then = next((r for r in reports if r.rank != rank and r.kind != HALT), None)
        tail = f"; {joint}rank {then.rank} failed: {then.text}" if then else ""
        return f"rank {rank} {what}{tail}", RANK, EXIT_RANK_FAILED
    if halts:
        return halts[0].text, STOPPED, halts[0].code
    if reports:
        first = reports[0]
        line = f"rank {first.rank} failed: {first.text}{_killed_tail(outcome, told)}"
        return line, RANK, EXIT_RANK_FAILED
    code = outcome.exitcodes[outcome.first]
    return f"rank {outcome.first} exited with code {code} without saying why", RANK, EXIT_RANK_FAILED


def _culprit(outcome: Outcome, told: set[int]) -> tuple[int, str, str] | None:
    """(rank, what happened, how a peer's report follows) for the rank that stopped the
    job by going away: killed by a signal the launcher did not send (the first to fail
    first), else found stopped, else gone without a word."""
    first = cast(int, outcome.first)   # job_failure asks once a rank has failed
    order = [first] + [i for i in range(len(outcome.exitcodes)) if i != first]
    for index in order:
        code = outcome.exitcodes[index]
        if code is not None and code < 0 and index not in outcome.killed:
            return index, f"was killed by {signal_text(-code)}", "then "
    for index in order:
        if outcome.killed.get(index) == "stopped":
            return index, "was stopped (SIGSTOP or a debugger) and was killed", ""
    for index in order:
        code = outcome.exitcodes[index]
        if code is not None and code > 0 and index not in outcome.killed and index not in told:
            return index, f"exited with code {code}{_exit_note(code)} without saying why", "then "
    return None


def _exit_note(code: int) -> str:
    """' (after SIGTERM)' for the exit code a stopped rank gives (128 + the signal)."""
    try:
        return f" (after {signal.Signals(code - 128).name})" if code > 128 else ""
    except ValueError:
        return ""


def _killed_tail(outcome: Outcome, told: set[int]) -> str:
    hung = [i for i, why in outcome.killed.items() if why == "hung" and i not in told]
    if not hung:
        return ""
    return (f"; {_ranks(hung)} did not exit within a few seconds of being told to "
            f"(hung?) and {'was' if len(hung) == 1 else 'were'} killed")


def _stopped_line(outcome: Outcome, reports: list[Report]) -> str:
    """The engine's own line when a rank gave one ('stopped by SIGINT after step 3;
    snapshot ...; resume with: ...'), else what the launcher saw."""
    name = signal.Signals(cast(int, outcome.signum)).name   # job_failure asks on a stop
    forced = sorted(i for i, why in outcome.killed.items() if why == "forced")
    late = sorted(i for i, why in outcome.killed.items() if why == "grace")
    halts = sorted((r for r in reports if r.kind == HALT), key=lambda r: r.rank)
    if forced:
        line = f"stopped by a second signal: {_ranks(forced)} killed at once"
    else:
        line = halts[0].text if halts else f"stopped by {name}"
        if late:
            line += (f"; {_ranks(late)} did not exit within {outcome.grace_s:g} s and "
                     f"{'was' if len(late) == 1 else 'were'} killed")
    errors = [r for r in reports if r.kind == ERROR]
    if errors:
        line += f"; rank {errors[0].rank} failed: {errors[0].text}"
    return line


def signal_text(signum: int) -> str:
    """'signal 9 (SIGKILL: kill -9 or the out-of-memory killer)'."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    hint = SIGNAL_HINTS.get(signum)
    return f"signal {signum} ({name}: {hint})" if hint else f"signal {signum} ({name})"


def _ranks(indexes: list[int]) -> str:
    if len(indexes) == 1:
        return f"rank {indexes[0]}"
    return "ranks " + ", ".join(str(i) for i in indexes)
