"""Every stop signal a clean stop (issue 41): SIGHUP stops a one-rank run as SIGTERM
does (a snapshot, a line naming SIGHUP, exit 129, no `error:`); a signal before the
run takes its signals ends the command at once with what it made removed; nothing is
left in the temporary folder that `zoexec clean` does not find."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.runtime import procwatch
from zoexec.store import shmfiles
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

STEPS = 400   # a bound: a run that does not stop ends by itself


@pytest.fixture
def plan(tmp_path) -> Path:
    path = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=Layout(),
              workload=Workload(batch=1, seq=8, param_dtype="fp32", compute_dtype="fp32")).save(path)
    return path


def _when_logged(out: Path, steps: int, then) -> threading.Thread:
    """`then()` from a thread once the run in `out` has logged `steps` steps."""
    def watch() -> None:
        log = out / "losses.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and len(log.read_text().splitlines()) >= steps:
                then()
                return
            time.sleep(0.02)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sighup_stops_a_one_rank_run_like_sigterm_and_names_itself(plan, tmp_path):
    """Before: a one-rank run died at once on SIGHUP (no snapshot, no line; here the
    test's own handler takes it and the run goes on to its end)."""
    got: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, _: got.append(signum))
    out = tmp_path / "run"
    try:
        _when_logged(out, 2, lambda: os.kill(os.getpid(), signal.SIGHUP))
        result = CliRunner().invoke(app, ["run", str(plan), "--init", "random", "--steps", str(STEPS),
                                          "--out", str(out), "--threads", "1", "-q"])
    finally:
        signal.signal(signal.SIGHUP, previous)
    shown = f"exit {result.exit_code}: {result.stderr} {result.exception!r}"
    assert result.exit_code == 129 and got == [], shown
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("zoexec: stopped by SIGHUP after step "), shown
    step = int(lines[0].split("after step ")[1].split(";")[0])
    assert (out / "snapshots" / f"checkpoint-{step}" / "state.json").is_file(), shown
    assert "--resume" in lines[0] and "error" not in result.stderr, shown


def _child(undo_dir: str, signum: int) -> None:
    """In a forked child: a command that made `undo_dir`, stopped by `signum`."""
    signal.signal(signum, procwatch.stop_at_once)
    with procwatch.undone_on_stop(lambda: os.rmdir(undo_dir)):
        os.kill(os.getpid(), signum)
        time.sleep(30)
    os._exit(0)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_before_the_run_ends_the_command_at_once_and_removes_what_it_made(tmp_path, signum):
    made = tmp_path / "made"
    made.mkdir()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        sys.stderr = os.fdopen(write, "w")   # where procwatch.say writes
        _child(str(made), signum)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    said = os.read(read, 4096).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 128 + signum
    assert not made.exists()
    name = signal.Signals(signum).name
    assert said == ("" if signum == signal.SIGINT else f"zoexec: stopped by {name}\n")


def test_a_launch_s_temporary_files_live_in_its_own_folder(plan, tmp_path, monkeypatch):
    """The data library's cache (a zoexec-data-* folder) is made in the launch's
    private folder, which `zoexec clean` removes when the launch is dead; an older
    run's zoexec-data-* folder in the temporary folder is listed by it."""
    from zoexec.launch import spawn

    seen = []
    real = spawn.run_in_process
    monkeypatch.setattr(spawn, "run_in_process", lambda cfg, **kw: seen.append(
        (tempfile.gettempdir(), kw["rendezvous"])) or real(cfg, **kw))
    result = CliRunner().invoke(app, ["run", str(plan), "--init", "random", "--steps", "1", "-q",
                                      "--threads", "1"])
    assert result.exit_code == 0, result.stderr
    (inside, rendezvous), = seen
    assert inside == str(rendezvous) and rendezvous.name.startswith(shmfiles.RDZV_PREFIX)
    assert not rendezvous.exists() and tempfile.gettempdir() != inside
    monkeypatch.setattr(shmfiles, "RDZV_DIR", tmp_path)
    older = tmp_path / "zoexec-data-abc123"
    (older / "cache").mkdir(parents=True)
    found = {item.path: item.state for item in shmfiles.sweep()}
    assert found == {older: shmfiles.UNOWNED} and older.is_dir()
