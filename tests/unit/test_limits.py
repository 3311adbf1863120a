"""Process limits named before a run starts, and the start-up phases' watchdog
(zoexec.launch.limits; issue 41: under ulimit -v a run hung in init_process_group,
deaf to --timeout-s and SIGTERM)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zoexec.launch.limits import GIB, UNLIMITED, Limits, shortfalls, watched
from zoexec.runtime import procwatch

FREE = dict(address_space=UNLIMITED, open_files=UNLIMITED, processes=UNLIMITED, root=False)


def test_each_short_limit_is_named_with_what_a_rank_needs():
    assert shortfalls(Limits(**FREE), threads=2, ranks=2) == []
    low = Limits(**{**FREE, "address_space": GIB, "open_files": 16, "processes": 20})
    short = shortfalls(low, threads=2, ranks=2, used=5)
    assert short[0].startswith("the address-space limit (ulimit -v) is 1.00 GiB, a rank with 2 "
                               "torch threads needs about 1.39 GiB")
    assert short[1] == "the open-files limit (ulimit -n) is 16, a rank needs 64"
    assert short[2].startswith("the process limit (ulimit -u) is 20, the run needs 26")
    assert len(shortfalls(Limits(**{**FREE, "processes": 20, "root": True}), threads=2, ranks=2)) == 0
    assert shortfalls(Limits(**{**FREE, "address_space": 2 * GIB}), threads=2, ranks=1) == []


def _limited(limit: int, value: int):
    return lambda: resource.setrlimit(limit, (value, value))


@pytest.mark.parametrize("limit,value,says", [
    (resource.RLIMIT_AS, 10**9, "the address-space limit (ulimit -v) is 0.93 GiB"),
    (resource.RLIMIT_NOFILE, 16, "the open-files limit (ulimit -n) is 16, a rank needs 64")])
def test_zoexec_run_under_a_low_limit_is_one_line(tmp_path, limit, value, says):
    """Refused before torch is imported (which fails half way under ulimit -v)."""
    plan = Path(__file__).resolve().parents[1] / "fixtures" / "no-such-plan.json"
    done = subprocess.run([sys.executable, "-m", "zoexec.cli", "run", str(plan), "--threads", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limited(limit, value))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {says}") and "Traceback" not in done.stderr, done.stderr


def _child(body) -> tuple[int, str]:
    """`body()` in a forked child whose stderr is read back: (exit code, what it said)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        sys.stderr = os.fdopen(write, "w")
        try:
            body()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        said = handle.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said


def test_a_phase_that_outlasts_its_limit_ends_the_process_in_one_line():
    def body() -> None:
        with watched("joining the process group", limit_s=0.3, end=procwatch.end_now):
            time.sleep(60)
    code, said = _child(body)
    assert code == 1
    assert said.startswith("zoexec: joining the process group did not finish within 0.3 s "
                           "(--timeout-s); the process limits in force: "), said


def test_a_stop_signal_in_a_phase_that_does_not_return_ends_it():
    """A rank's handler only notes the signal (for the next step boundary); a phase
    waiting in native code never gets there: the watchdog ends it."""
    def body() -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)   # noted, nothing more
        with watched("joining the process group", limit_s=60, end=procwatch.end_now, grace_s=0.2):
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
    code, said = _child(body)
    assert code == 143 and said == "zoexec: stopped by SIGTERM while joining the process group\n"


def test_a_phase_short_of_threads_under_a_limit_names_the_limits(monkeypatch):
    from zoexec.launch import limits
    from zoplan.errors import ZoError

    monkeypatch.setattr(limits.Limits, "now", classmethod(lambda cls: Limits(
        **{**FREE, "address_space": GIB})))
    with pytest.raises(ZoError, match=r"joining the process group failed \(RuntimeError: Resource "
                                      r"temporarily unavailable\) under the process limits address "
                                      r"space 1.00 GiB \(ulimit -v\)"):
        with limits.limited("joining the process group"):
            raise RuntimeError(os.strerror(11))
    with pytest.raises(RuntimeError, match="connection reset"):   # not for want of resources
        with limits.limited("joining the process group"):
            raise RuntimeError("connection reset")


NOBODY = 65534


def test_a_thread_limit_without_roots_exemption_is_one_line():
    """ulimit -u binds every user but root: a forked child becomes nobody (when run as
    root) under a process limit of the threads it has, so that a new thread is really
    refused; the run's check names the limit, a phase that meets it says so in one line
    (no hang, no native backtrace)."""
    from zoexec.launch import limits
    from zoplan.errors import ZoError

    def body() -> None:
        uid = NOBODY if os.geteuid() == 0 else os.getuid()
        held = limits.user_processes(uid)
        resource.setrlimit(resource.RLIMIT_NPROC, (max(1, held), max(1, held)))
        if uid == NOBODY:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        try:
            limits.check_limits(threads=2, ranks=1)
        except ZoError as exc:
            print(f"check: {exc}", file=sys.stderr, flush=True)
        try:
            with limits.limited("starting the data loaders"):
                import threading

                thread = threading.Thread(target=lambda: None)
                thread.start()
                thread.join()
        except ZoError as exc:
            print(f"phase: {exc}", file=sys.stderr, flush=True)

    code, said = _child(body)
    lines = said.splitlines()
    assert code == 0 and len(lines) == 2, said
    assert lines[0].startswith("check: the process limit (ulimit -u) is "), said
    assert lines[1].startswith("phase: starting the data loaders failed (RuntimeError: can't start "
                               "new thread) under the process limits "), said
    assert "(ulimit -u): raise them (ulimit)" in lines[1], said
