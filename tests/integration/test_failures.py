"""A job that goes wrong ends with one line naming the rank that failed first and what
happened, and leaves no process and nothing in /dev/shm:
a killed rank, a stopped (SIGSTOP) rank, a stop signal to the launcher, a SIGKILLed
launcher (its ranks die with it), a kill during start-up (the next start or `zoexec
clean` removes what it left). Plus the failure lines and the launcher's signal
handling on stand-in processes, without torch.

No test asserts a window of wall time (a loaded machine misses any): each waits on
events (a signal handled, a process seen stopped, a step logged) and tells what
happened from the outcome itself (why the launcher killed a rank, whether a rank's wait
timed out). The only times compared are lower bounds (a grace period waited out) and
the long waits the code must not have made (60 s), each a consequence of the rule
tested, never of the machine's speed."""

from __future__ import annotations

import glob
import inspect
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.config import RunConfig
from zoexec.launch import failures
from zoexec.launch.failures import Report, failure_kind, failure_reason, job_failure
from zoexec.launch.spawn import RankFailure, Stopped, spawn_local, sweep_stale_files
from zoexec.runtime import lanes as zlanes
from zoexec.runtime import procwatch
from zoexec.runtime.errors import LaneFailure, PeerGone, failing
from zoexec.runtime.procwatch import Outcome, ProcessId
from zoexec.store import shmfiles
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

# Not `serial`: it kills only its own runs (the ranks under this process or a launcher
# it started), and every run here keeps its files in the module's own folders
# (private_run_dirs: the block stores, the rendezvous and data folders; its globs and
# sweeps look there, through shmfiles' patched defaults), so no run of a test beside it
# sweeps what a kill here left, and its sweeps and checks see no one else's files.


@pytest.fixture(scope="module", autouse=True)
def _own_folders(private_run_dirs):
    return private_run_dirs

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32")
LAYOUT = Layout(pertp=2, slices=2)     # 2 ranks whose every block passes an all-gather
TIMEOUT_S = 4.0


# ---- the lines, from synthetic failures -------------------------------------------------------
def _caught(what: str, message: str, **fields) -> LaneFailure:
    """The LaneFailure a rank raises when `message` comes out of the task or collective
    `what` (as zoexec.runtime.errors.failing wraps it where it runs)."""
    try:
        with failing(what, rank=0, **fields):
            raise RuntimeError(message)
    except LaneFailure as exc:
        return exc
    raise AssertionError("did not raise")


def _raised(message: str) -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


GLOO_TIMEOUT = ("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 4000ms for "
                "recv operation to complete")
GLOO_RESET = ("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1234: Connection "
              "reset by peer. This is typically caused by a remote worker hanging")
HERE = Path(__file__).name


def test_a_collective_failure_says_which_collective_of_which_step():
    timeout = _caught("allreduce", GLOO_TIMEOUT, step=3)
    assert failure_reason(timeout) == "the loss all-reduce of step 4 timed out after 4 s"   # index 3
    assert failure_kind(timeout) == failures.PEER
    reset = _caught("allgather", GLOO_RESET, block=2)
    assert failure_reason(reset) == "the all-gather of block 2 lost its connection to a peer (Connection reset by peer)"
    fence = _caught("allgather", GLOO_RESET, block=2, step=5).renamed("fence")
    assert failure_reason(fence) == ("the write-back fence of block 2 in step 6 lost its "
                                     "connection to a peer (Connection reset by peer)")
    barrier = _caught("clock", "Rank 1 failed to pass monitoredBarrier in 4000 ms")
    assert failure_reason(barrier) == "agreeing on the clock timed out after 4 s waiting for rank 1"
    own = _raised("injected fault at step 1")
    assert failure_reason(own) == f"RuntimeError: injected fault at step 1 ({HERE}:{own.__traceback__.tb_lineno})"
    assert failure_kind(own) == failures.ERROR


def test_a_task_that_fails_by_itself_is_the_ranks_own_error():
    forward = _caught("forward", "shapes cannot be multiplied", block=1, step=0)
    lines, first = inspect.getsourcelines(_caught)
    raised = first + next(i for i, text in enumerate(lines) if "raise RuntimeError" in text)
    assert failure_reason(forward) == ("the forward of block 1 in step 1 failed: RuntimeError: "
                                       f"shapes cannot be multiplied ({HERE}:{raised})")
    assert failure_kind(forward) == failures.ERROR
    bad_call = _caught("allgather", "output tensor size must be equal to world_size times input size", block=0)
    assert failure_kind(bad_call) == failures.ERROR and "failed: RuntimeError: output tensor" in failure_reason(bad_call)
    # a wait that gave up on a peer is typed so; the same words in a user's error are not
    assert failure_kind(PeerGone("rank 1 waited for rank 0 and gave up")) == failures.PEER
    assert failure_kind(ZoError("rank 1 waited for rank 0 and gave up")) == failures.ERROR


def test_the_lanes_name_the_task_that_failed():
    lanes = zlanes.CpuLanes(rank=1, spans=[])    # a list keeps what the lanes append
    lanes.begin_step(7)
    with pytest.raises(LaneFailure) as caught, lanes.task("allgather", 4):
        raise RuntimeError(GLOO_TIMEOUT)
    failure = caught.value
    assert (failure.what, failure.block, failure.step, failure.rank) == ("allgather", 4, 7, 1)
    assert failure.__cause__ is failure.cause and str(failure) == "the all-gather of block 4 in step 8 timed out after 4 s"
    lanes.begin_step(8, record=False)     # the flush of the updates, an evaluation: no step
    with pytest.raises(LaneFailure) as caught, lanes.task("embed"):
        raise ValueError("bad value")
    assert (caught.value.what, caught.value.block, caught.value.step) == ("embed", None, None)
    with pytest.raises(ZoError, match="^the user's$"), lanes.task("head"):    # as it is
        raise ZoError("the user's")
    assert lanes.spans == []     # a task that failed leaves no span


def _outcome(exitcodes, *, first=None, killed=None, signum=None):
    return Outcome(first=first, signum=signum, exitcodes=list(exitcodes), killed=killed or {},
                   grace_s=120)


PEER = Report(rank=0, code=1, text="the loss all-reduce of step 3 lost its connection", kind="peer")


@pytest.mark.parametrize("outcome,reports,line,kind,code", [
    (_outcome([1, 1], first=1),
     [PEER, Report(rank=1, code=1, text="ValueError: bad (x.py:1)")],
     "rank 1 failed: ValueError: bad (x.py:1)", failures.RANK, 1),
    (_outcome([1, -9], first=1), [PEER],
     "rank 1 was killed by signal 9 (SIGKILL: kill -9 or the out-of-memory killer); then "
     "rank 0 failed: the loss all-reduce of step 3 lost its connection", failures.RANK, 1),
    (_outcome([1, -9], first=0, killed={1: "stopped"}), [PEER],
     "rank 1 was stopped (SIGSTOP or a debugger) and was killed; rank 0 failed: the loss "
     "all-reduce of step 3 lost its connection", failures.RANK, 1),
    (_outcome([1, -9], first=0, killed={1: "hung"}), [PEER],
     "rank 0 failed: the loss all-reduce of step 3 lost its connection; rank 1 did not exit "
     "within a few seconds of being told to (hung?) and was killed", failures.RANK, 1),
    (_outcome([0, 3], first=1), [], "rank 1 exited with code 3 without saying why", failures.RANK, 1),
    (_outcome([2, 1], first=0), [Report(rank=0, code=2, text="data file x does not exist")],
     "rank 0 failed: data file x does not exist", failures.USER, 2),
    (_outcome([143, 143], first=1), [Report(rank=1, code=143, text="stopped by SIGTERM after step 4", kind="halt")],
     "stopped by SIGTERM after step 4", failures.STOPPED, 143),
    (_outcome([-15, -9], signum=signal.SIGTERM, killed={1: "grace"}), [],
     "stopped by SIGTERM; rank 1 did not exit within 120 s and was killed", failures.STOPPED, 143),
    (_outcome([-9, -9], signum=signal.SIGINT, killed={0: "forced", 1: "forced"}), [],
     "stopped by a second signal: ranks 0, 1 killed at once", failures.STOPPED, 130),
    (_outcome([0, 0]), [], None, None, None),
])
def test_the_job_line_names_the_rank_that_failed_first(outcome, reports, line, kind, code):
    assert job_failure(outcome, reports) == (None if line is None else (line, kind, code))


# ---- the launcher's signals, on stand-in ranks -------------------------------------------------
def _stubborn(ready=None) -> None:
    """A stand-in rank that ignores stop signals (a rank busy saving a snapshot); sets
    `ready` once it does."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    if ready is not None:
        ready.set()
    time.sleep(60)


def _stop(pid: int) -> None:
    """SIGSTOP, and wait until the process shows as stopped: the signal lands when the
    kernel next schedules it, which on a busy machine is later than the next line."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while procwatch.run_state(pid) not in procwatch.STOPPED_STATES:
        assert time.monotonic() < deadline, f"process {pid} never showed as stopped"
        time.sleep(0.005)


def _supervised(signals: list[int], *, grace_s: float) -> tuple[Outcome, float]:
    """The launcher's supervision of two stubborn stand-in ranks, sent `signals` (one or
    two), the second once the handler has taken the first (two signals of one kind sent
    before Python runs its handler arrive as one); (the outcome, seconds from the first
    signal to the end of the supervision)."""
    ctx = mp.get_context("fork")
    ready = [ctx.Event() for _ in range(2)]
    procs = [ctx.Process(target=_stubborn, args=(event,)) for event in ready]
    for proc in procs:
        proc.start()
    for event in ready:     # both ignore stop signals before the first is sent
        assert event.wait(60), "a stand-in rank never started"
    sent: list[float] = []

    def send(stop) -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signals[0])
        for signum in signals[1:]:
            while stop.signum is None:        # the handler has not taken the first yet
                time.sleep(0.005)
            os.kill(os.getpid(), signum)

    try:
        with procwatch.stop_signals(procs, grace_s=grace_s) as stop:
            threading.Thread(target=send, args=(stop,), daemon=True).start()
            outcome = procwatch.supervise(procs, stop)
    finally:
        procwatch.end_all(procs)
    assert all(proc.exitcode is not None for proc in procs)
    return outcome, time.monotonic() - sent[0]


def test_a_stop_signal_waits_out_the_grace_period_then_kills():
    outcome, took = _supervised([signal.SIGTERM], grace_s=1.0)
    assert outcome.signum == signal.SIGTERM and outcome.killed == {0: "grace", 1: "grace"}
    assert took >= 1.0                    # the grace period waited out (a lower bound)
    line, kind, code = job_failure(outcome, [])
    assert (kind, code) == (failures.STOPPED, 143) and "did not exit within 1 s" in line


def test_a_second_stop_signal_kills_at_once():
    outcome, took = _supervised([signal.SIGINT, signal.SIGINT], grace_s=60)
    assert outcome.signum == signal.SIGINT and set(outcome.killed.values()) == {"forced"}
    assert took < 60                      # the 60 s grace period not waited out


def test_a_ranks_stop_request_waits_for_the_step_boundary_and_a_second_ctrl_c_interrupts():
    stop = procwatch.StopRequest()                # a rank's: no processes to forward to
    stop.handle(signal.SIGTERM)
    stop.handle(signal.SIGINT)                    # remembered once: the first one counts
    assert stop.signum == signal.SIGTERM and stop.forced is None
    ctrl_c = procwatch.StopRequest()
    ctrl_c.handle(signal.SIGINT)
    ctrl_c.handle(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        ctrl_c.handle(signal.SIGINT)
    before = signal.getsignal(signal.SIGINT)     # the default, or SIG_IGN in a background job
    with procwatch.stop_signals(None, signals=(signal.SIGINT,)) as installed:
        assert signal.getsignal(signal.SIGINT) == installed.handle
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while installed.signum is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert installed.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before    # restored as it was


def test_a_stopped_rank_is_killed_at_once_when_another_fails():
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=sys.exit, args=(1,)), ctx.Process(target=_stubborn)]
    for proc in procs:
        proc.start()
    _stop(procs[1].pid)
    start = time.monotonic()
    try:
        with procwatch.stop_signals(procs, grace_s=60) as stop:
            outcome = procwatch.supervise(procs, stop)
    finally:
        procwatch.end_all(procs)
    assert outcome.first == 0 and outcome.killed == {1: "stopped"}
    assert time.monotonic() - start < 60     # not SIGTERM and the grace: SIGTERM stays pending
    assert job_failure(outcome, [])[0] == "rank 1 was stopped (SIGSTOP or a debugger) and was killed"


# ---- real ranks: spawned from this process -----------------------------------------------------
def _config(tmp_path, **kw) -> RunConfig:
    plan = hand_plan(model="tiny-opt", layout=LAYOUT, workload=WORKLOAD)
    return RunConfig.make(plan=plan.data, steps=100_000, seed=0, lr=1e-3, eps=1e-3, threads=1,
                     quiet=True, out=str(tmp_path / "out"), shm_dir=str(shmfiles.SHM_DIR),
                     run_id=f"t{uuid.uuid4().hex[:10]}", **kw)


def _ranks(parent: int) -> dict[int, psutil.Process]:
    """The zoexec ranks among the descendants of `parent`, by rank."""
    found = {}
    try:
        for proc in psutil.Process(parent).children(recursive=True):
            try:
                name = proc.name()
            except psutil.Error:
                continue
            if name.startswith("zoexec-rank"):
                found[int(name.removeprefix("zoexec-rank"))] = proc
    except psutil.Error:
        pass
    return found


def _training(parent: int, out: Path, *, timeout_s: float = 60) -> dict[int, psutil.Process]:
    """Both ranks of `parent`, once a step has been logged; {} after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ranks = _ranks(parent)
        if len(ranks) == 2 and _logged(out):
            return ranks
        time.sleep(0.05)
    return {}


def _logged(out: Path) -> bool:
    """Whether the run's loss log (losses.jsonl, whatever its folder or temporary name)
    has a step."""
    for folder, _, names in os.walk(out):
        for name in names:
            if "losses.jsonl" in name and "\n" in (Path(folder) / name).read_text():
                return True
    return False


def _spawn_and(tmp_path, act, *, timeout_s: float = TIMEOUT_S) -> tuple[BaseException | None, float]:
    """spawn_local here (the main thread: its signal handlers), `act(ranks)` from a
    helper thread once the ranks train; (what spawn_local raised, seconds since act).
    `timeout_s`: the ranks' waits (--timeout-s)."""
    cfg = _config(tmp_path, timeout_s=timeout_s)
    acted, done = {}, threading.Event()

    def helper() -> None:
        ranks = _training(os.getpid(), tmp_path / "out")
        acted["at"] = time.monotonic()
        if ranks:
            act(ranks)
        if not ranks or not done.wait(timeout_s + 60):   # never trained, or never ended:
            for proc in _ranks(os.getpid()).values():    # end the run (the test fails)
                proc.kill()

    threading.Thread(target=helper, daemon=True).start()
    caught = None
    try:
        spawn_local(cfg)
    except (RankFailure, Stopped) as exc:
        caught = exc
    finally:
        done.set()
    took = time.monotonic() - acted.get("at", time.monotonic())
    assert _ranks(os.getpid()) == {}
    assert glob.glob(f"{shmfiles.SHM_DIR}/zoexec-{cfg.run_id}*") == []
    return caught, took


def test_a_killed_rank_ends_the_job_at_once_naming_it(tmp_path):
    """At once: the launcher ends the job on seeing rank 1 gone, not rank 0's wait on
    its peer timing out (60 s here; `took` says so too)."""
    caught, took = _spawn_and(tmp_path, lambda ranks: ranks[1].send_signal(signal.SIGKILL),
                              timeout_s=60.0)
    assert isinstance(caught, RankFailure) and "\n" not in str(caught)
    assert str(caught).startswith("rank 1 was killed by signal 9 (SIGKILL"), str(caught)
    assert "timed out" not in str(caught) and took < 60, (str(caught), took)


def test_a_stopped_rank_ends_the_job_after_the_timeout(tmp_path):
    caught, took = _spawn_and(tmp_path, lambda ranks: ranks[1].send_signal(signal.SIGSTOP))
    assert isinstance(caught, RankFailure) and "\n" not in str(caught)
    assert str(caught).startswith("rank 1 was stopped (SIGSTOP or a debugger) and was killed; "
                                  "rank 0 failed: "), str(caught)
    assert f"timed out after {TIMEOUT_S:g} s" in str(caught)   # rank 0's wait, not the launcher


def test_sigterm_to_the_launcher_stops_the_ranks(tmp_path):
    received = []

    def unhandled(*_):     # the launcher did not take the signal: end the run, fail the test
        received.append(True)
        for proc in _ranks(os.getpid()).values():
            proc.kill()

    forkserver = []

    def group_sigterm(ranks) -> None:     # as `timeout` or kill -TERM -PGID: the forkserver too
        forkserver.append(ranks[0].parent())
        forkserver[0].send_signal(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        caught, took = _spawn_and(tmp_path, group_sigterm)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == []
    assert forkserver[0].status() != psutil.STATUS_ZOMBIE     # it ignored the signal
    assert isinstance(caught, Stopped) and caught.exit_code == 143, caught
    assert str(caught).startswith("stopped by SIGTERM") and "\n" not in str(caught)
    assert "did not exit" not in str(caught)      # at a step's end, not killed after the grace


# ---- real ranks: `zoexec run` in a process of its own ------------------------------------------
def _zoexec_run(tmp_path, own, plan, *extra) -> subprocess.Popen:
    path = tmp_path / "plan.json"
    plan.save(path)
    return subprocess.Popen([sys.executable, "-m", "zoexec.cli", "run", str(path), "--threads", "1",
                             "--quiet", *extra], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**own.env, "PYTHONPATH": str(ROOT)})


def _running(procs: list, *, within_s: float) -> list:
    """Those of `procs` still running after `within_s` (a zombie has exited)."""
    deadline = time.monotonic() + within_s
    while True:
        running = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    running.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def _kill_all(launcher: subprocess.Popen, ranks) -> None:
    for proc in ranks:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if launcher.poll() is None:
        launcher.kill()
    _running(list(ranks), within_s=5)
    launcher.communicate()


def test_killing_the_launcher_leaves_no_rank_running(tmp_path, private_run_dirs):
    plan = hand_plan(model="tiny-opt", layout=LAYOUT, workload=WORKLOAD)
    launcher = _zoexec_run(tmp_path, private_run_dirs, plan, "--steps", "100000", "--out", str(tmp_path / "out"))
    owner = ProcessId.of(launcher.pid)
    ranks = _training(launcher.pid, tmp_path / "out")
    try:
        assert len(ranks) == 2, launcher.stderr.read() if launcher.poll() is not None else "no ranks"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _running(list(ranks.values()), within_s=60) == []   # they die with it (a timeout, not a window)
        _, err = launcher.communicate()          # the ranks held its pipes: read once they are gone
        # local rank 0's watchdog says so when it sees the launcher gone first; when local
        # rank 1's (silent) sees it first, rank 0 may die of its peer's death before its
        # own watchdog looks: nothing else may be said either way
        said = [line for line in err.splitlines() if line.strip()]
        assert all(re.fullmatch(r"zoexec: rank 0: its launcher \(pid \d+\) has exited; "
                                r"stopping now", line) for line in said), err
        tag = shmfiles.owner_tag(owner)
        assert glob.glob(f"{shmfiles.SHM_DIR}/zoexec-*-{tag}-*") == []
        assert glob.glob(f"{shmfiles.RDZV_DIR}/zoexec-rdzv-{tag}-*") == []
    finally:
        _kill_all(launcher, ranks.values())


def test_a_kill_during_start_up_leaves_what_the_next_start_removes(tmp_path, capsys,
                                                                   private_run_dirs):
    """The node's builder holds inside its fill (held_start.py): the store file is there
    until the kill, whatever the machine's speed."""
    own = private_run_dirs
    plan = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=LAYOUT, workload=WORKLOAD).save(plan)
    launcher = subprocess.Popen([sys.executable, str(Path(__file__).with_name("held_start.py")),
                                 str(plan), "--steps", "1", "--threads", "1", "--quiet"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**own.env, "PYTHONPATH": str(ROOT)})
    owner = ProcessId.of(launcher.pid)
    pattern = f"{shmfiles.SHM_DIR}/zoexec-*-{shmfiles.owner_tag(owner)}-n0"
    deadline, left = time.monotonic() + 120, []
    while not left and launcher.poll() is None and time.monotonic() < deadline:
        left = glob.glob(pattern)
        time.sleep(0.01)
    ranks = list(_ranks(launcher.pid).values())
    _kill_all(launcher, ranks)                    # SIGKILL: the ranks, then the launcher
    live = shmfiles.store_path(f"t{uuid.uuid4().hex[:8]}", 0)   # a live run's (ours)
    live.write_bytes(b"x")
    try:
        assert left and Path(left[0]).exists(), "the store file was not seen during start-up"
        result = CliRunner().invoke(app, ["clean", "--dry-run", *own.args])
        assert f"would remove {left[0]}" in " ".join(result.output.split()), result.output
        assert Path(left[0]).exists()
        assert glob.glob(f"{shmfiles.RDZV_DIR}/zoexec-rdzv-{shmfiles.owner_tag(owner)}-*")
        sweep_stale_files()                       # what every start does first
        assert not glob.glob(pattern) and live.exists()
        assert not glob.glob(f"{shmfiles.RDZV_DIR}/zoexec-rdzv-{shmfiles.owner_tag(owner)}-*")
        assert "stale file" in capsys.readouterr().err
    finally:
        live.unlink(missing_ok=True)
        shmfiles.remove_owner_files(owner)
