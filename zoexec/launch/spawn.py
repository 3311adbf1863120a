"""Starting the ranks of a plan: preflight checks, local spawning, torchrun.

`zoexec run plan.json` on one machine starts the plan's ranks itself (one process per
rank, from a forkserver that has imported torch and transformers once, so starting a
rank costs a fork, not an import). Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK in
the environment) the same command runs one rank in the current process; that is how a
plan of several nodes runs:
    torchrun --nnodes N --nproc-per-node K --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m zoexec.cli run plan.json ...

Before anything starts, the stale shared-memory files of dead runs are removed
(zoexec.store.shmfiles; one dim line) and `preflight` checks the plan against the machine
(world size, devices, host and GPU memory, model directory, data file) and raises
ZoError with the numbers.

A local launch's ranks meet through a file in a private temporary folder and talk over
the loopback interface only (zoexec.runtime.groups.rendezvous). Each runs in its own process
group and dies with the launcher, even a SIGKILLed one (zoexec.runtime.procwatch). The launcher
forwards SIGINT / SIGTERM / SIGHUP to them once and waits up to --stop-grace-s while they
save a snapshot; a second signal kills them. A rank that fails reports a one-line
reason; the launcher stops the others, removes the run's files and raises one line
naming the rank that failed first and what happened (zoexec.launch.failures.job_failure):
RankFailure, ZoError for a user's error, Stopped for a stop.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoexec.launch import failures
from zoexec.launch.preflight import preflight
from zoexec.run.folder import undone_on_failure
from zoexec.runtime import procwatch
from zoexec.runtime.groups import RankPlace, place_from_env
from zoexec.runtime.procwatch import ProcessId
from zoexec.store import shmfiles
from zoexec.store.blocks import remove_run_files
from zoplan.errors import EXIT_USER_ERROR, ZoError

if TYPE_CHECKING:
    from zoexec.config import RunConfig
    from zoexec.maths.history import StepRecord

EXIT_RANK_FAILED = 1
EXIT_SIGINT = 130
PRELOAD = ["torch", "transformers", "zoexec.train.engine", "zoexec.launch.rank"]   # the forkserver's imports


class RankFailure(Exception):
    """A rank stopped on a runtime error (not bad input); one-line message."""

    exit_code = EXIT_RANK_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Stopped(RankFailure):
    """The run was stopped on purpose (SIGINT, SIGTERM, SIGHUP): exit 130, 143 or 129."""


# ---- running ---------------------------------------------------------------------------------
def run(cfg: RunConfig, *, checked: Callable[[], None] | None = None) -> None:
    """Run a plan: under torchrun one rank here, otherwise all local ranks spawned.
    `checked()` runs once the plan passed preflight (the CLI's notes)."""
    place = place_from_env()
    if place is not None:
        with undone_on_failure(cfg if place.rank == 0 else None):
            run_torchrun_rank(cfg, place)
        return
    sweep_stale_files(cfg.runtime.shm_dir)   # before preflight: stale files hold memory it counts as used
    with private_folder() as rendezvous:
        if cfg.layout.world_size == 1:   # one rank: no process to start, no forkserver
            run_in_process(cfg, checked=checked, rendezvous=rendezvous)
            return
        preflight(cfg)
        if checked:
            checked()
        with undone_on_failure(cfg):   # a new run that failed before a step: its folder goes
            spawn_local(cfg, rendezvous=rendezvous)


@contextmanager
def private_folder() -> Iterator[Path]:
    """A local launch's private temporary folder (shmfiles.rendezvous_dir: named after
    this process, so that `zoexec clean` finds it if the launch is killed): the ranks'
    rendezvous file, and every temporary file or folder the launch and its ranks make
    (the data library's cache: tempfile's folder is this one while the block runs);
    removed at the end, or by a stop signal (procwatch.stop_at_once)."""
    from multiprocessing import util

    util.get_temp_dir()   # multiprocessing's own (the forkserver's socket) stays where it was
    rendezvous = shmfiles.rendezvous_dir()
    try:
        with temp_folder(rendezvous), \
                procwatch.undone_on_stop(lambda: shutil.rmtree(rendezvous, ignore_errors=True)):
            yield rendezvous
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


@contextmanager
def temp_folder(folder: Path) -> Iterator[None]:
    """tempfile's folder is `folder` while the block runs (what this process and the
    data library make there: a launch's or a torchrun node's shared folder)."""
    previous = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = previous


def sweep_stale_files(directory: Path | str | None = None) -> None:
    """Remove the shared-memory files of dead runs in `directory` (--shm-dir), with one
    dim line if there were any."""
    line = shmfiles.freed_line(shmfiles.sweep(directory=directory))
    if line:
        from rich.console import Console

        Console(stderr=True).print(line, style="dim", highlight=False, soft_wrap=True)


def run_torchrun_rank(cfg: RunConfig, place: RankPlace) -> None:
    """One rank started by torchrun: preflight, then run; failures leave this process
    with a one-line reason (torchrun stops the others). The node's files are named after
    torchrun's agent (this process's parent), and the rank dies with it; its temporary
    files (the packed text's chunks, made once for the node) are in the folder the
    agent's ranks share (node_folder)."""
    from zoexec.launch.rank import rank_main

    agent = ProcessId.of(os.getppid())
    shmfiles.set_owner(agent)
    with ExitStack() as inside:
        try:
            inside.enter_context(node_folder(agent))
            if place.local_rank == 0:
                sweep_stale_files(cfg.runtime.shm_dir)
            preflight(cfg, world_size=place.world_size, local_world_size=place.local_world_size)
        except ZoError:
            if place.local_rank != 0:          # one line per node, not one per rank
                sys.exit(EXIT_USER_ERROR)
            raise
        if agent is not None and agent.pid != 1:
            procwatch.die_with(agent, what=f"rank {place.rank}",
                               cleanup=lambda: shmfiles.remove_owner_files(agent, directory=cfg.runtime.shm_dir))
        try:
            rank_main(cfg, place)
        except ZoError:
            raise
        except Exception as exc:
            raise _one_line(exc, place.rank, debug=cfg.runtime.debug) from None


@contextmanager
def node_folder(agent: ProcessId | None) -> Iterator[None]:
    """A torchrun rank inside the folder its agent's ranks share on the node
    (shmfiles.node_folder: the last rank out removes it), tempfile's folder while the
    block runs, as a local launch's private folder is its ranks'; none when the agent
    is not known (this process's parent gone: the rank is about to go too)."""
    if agent is None or agent.pid == 1:
        yield
        return
    with shmfiles.node_folder(agent) as folder, temp_folder(folder):
        yield


def _one_line(exc: Exception, rank: int, *, debug: bool) -> RankFailure:
    """The exception a rank's failure leaves the command line with (`debug`: its
    traceback printed first)."""
    _debug_traceback(debug)
    code = failures.exit_code(exc)
    if failures.failure_kind(exc) == failures.HALT:
        return Stopped(failures.failure_reason(exc), code)
    return RankFailure(f"rank {rank} failed: {failures.failure_reason(exc)}", code)


@dataclass(frozen=True, kw_only=True)
class RankLink:
    """What a spawned rank takes from its launcher besides its config and place."""

    launcher: ProcessId


def spawn_local(cfg: RunConfig, *, rendezvous: Path | None = None) -> None:
    """Start the plan's ranks on this machine and wait; the first failure stops all.
    `rendezvous`: the launch's private folder (private_folder; None: one of its own)."""
    if rendezvous is None:
        with private_folder() as rendezvous:
            return spawn_local(cfg, rendezvous=rendezvous)
    cfg = replace(cfg, run_id=cfg.run_id if cfg.run_id not in ("", "run") else uuid.uuid4().hex[:12])
    sweep_stale_files(cfg.runtime.shm_dir)
    ctx = _context(cfg.plan["model"]["spec"]["family"], cfg.runtime.start_method)
    world = cfg.layout.world_size
    link = RankLink(launcher=ProcessId.me())
    procs: list[BaseProcess] = []
    reasons: list[Connection] = []   # one pipe per rank (a queue's semaphores would outlive a SIGKILL)
    try:
        with procwatch.undone_on_stop(lambda: _remove(cfg)), \
                procwatch.stop_signals(procs, grace_s=cfg.runtime.stop_grace_s) as stop:
            for rank in range(world):
                if stop.signum is not None:
                    break
                place = RankPlace(rank=rank, local_rank=rank, world_size=world,
                                  local_world_size=world, init_file=f"{rendezvous}/store")
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_rank_entry, args=(cfg, place, writer, link),
                                   name=f"zoexec-rank{rank}")
                proc.start()
                writer.close()
                reasons.append(reader)
                stop.started(proc)
            outcome = procwatch.supervise(procs, stop)
    finally:
        procwatch.end_all(procs)
        _remove(cfg)
    _raise_failure(outcome, _reports(reasons))


def _remove(cfg: RunConfig) -> None:
    """A run's shared-memory files (its rendezvous folder: private_folder's)."""
    remove_run_files(cfg.run_id, directory=cfg.runtime.shm_dir)


def _context(family: str, method: str) -> Any:   # typeshed's BaseContext has no Process
    """The multiprocessing context of `method` (--start-method); a forkserver imports
    torch, transformers and the model family's module once (effective when the server
    starts, here if it is not running: procwatch.start_forkserver)."""
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD + [f"transformers.models.{family}.modeling_{family}"])
        procwatch.start_forkserver()
    return ctx


def _reports(readers: list[Connection]) -> list[failures.Report]:
    """The ranks' reports, in the order they were made (one clock for the host)."""
    reports: list[dict[str, Any]] = []
    for reader in readers:
        try:
            while reader.poll():
                reports.append(reader.recv())
        except (EOFError, OSError):
            pass
        reader.close()
    return [failures.Report(**r) for r in sorted(reports, key=lambda r: r.pop("at"))]


def _raise_failure(outcome: procwatch.Outcome, reports: list[failures.Report]) -> None:
    """Raise the one line of a job that did not end well (zoexec.launch.failures.job_failure)."""
    verdict = failures.job_failure(outcome, reports)
    if verdict is None:
        return
    line, kind, code = verdict
    if kind == failures.USER:
        raise ZoError(line)
    raise (Stopped if kind == failures.STOPPED else RankFailure)(line, code)


def _rank_entry(cfg: RunConfig, place: RankPlace, reasons: Connection, link: RankLink) -> None:
    """Body of a spawned rank: run, or report a one-line reason and exit non-zero. The
    engine handles SIGINT / SIGTERM / SIGHUP (rank_main); the rank dies with its launcher."""
    procwatch.become_rank(place.rank)
    shmfiles.set_owner(link.launcher)
    tempfile.tempdir = str(Path(place.init_file).parent)   # the launch's private folder

    procwatch.die_with(link.launcher, what=f"rank {place.rank}" if place.local_rank == 0 else None,
                       cleanup=lambda: shmfiles.remove_owner_files(link.launcher,
                                                                   directory=cfg.runtime.shm_dir))
    sent: list[BaseException] = []

    def report(exc: BaseException) -> None:
        if not isinstance(exc, (SystemExit, KeyboardInterrupt)) and not sent:
            sent.append(exc)
            reasons.send(dict(rank=place.rank, code=failures.exit_code(exc),
                              text=failures.failure_reason(exc), kind=failures.failure_kind(exc),
                              at=time.monotonic()))

    try:
        from zoexec.launch.rank import rank_main

        rank_main(cfg, place, on_failure=report)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(EXIT_SIGINT)      # interrupted before the engine took over its signals
    except BaseException as exc:  # noqa: BLE001 - reported (once), then exit
        _debug_traceback(cfg.runtime.debug)
        report(exc)
        sys.exit(failures.exit_code(exc))


def _debug_traceback(debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()


# ---- the command line's configuration ------------------------------------------------------


def run_in_process(cfg: RunConfig, *, checked: Callable[[], None] | None = None,
                   rendezvous: Path | None = None) -> list[StepRecord]:
    """Run a one-rank plan in this process (`zoexec run` of a one-rank plan, tests,
    benchmarks); returns the StepRecords. A failure that is not the user's is a
    RankFailure with its one-line reason, as from a spawned rank; a stop is Stopped.
    `rendezvous`: the launch's private folder (None: one of its own)."""
    from zoexec.launch.rank import rank_main

    if cfg.layout.world_size != 1:
        raise ZoError(f"run_in_process needs a one-rank plan, not {cfg.layout.label()}")
    sweep_stale_files(cfg.runtime.shm_dir)
    preflight(cfg)
    if checked:
        checked()
    with undone_on_failure(cfg), one_rank(cfg, rendezvous=rendezvous) as (cfg, place):
        try:
            return rank_main(cfg, place)
        except (ZoError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise _one_line(exc, 0, debug=cfg.runtime.debug) from None


@contextmanager
def one_rank(cfg: RunConfig, *, rendezvous: Path | None = None) -> Iterator[tuple[RunConfig, RankPlace]]:
    """A one-rank job in this process: (cfg with a fresh run id, its RankPlace on a
    private file rendezvous in `rendezvous`, private_folder's: None, one of its own);
    the run's shared-memory files and the rendezvous folder are removed on the way out."""
    if rendezvous is None:
        with private_folder() as rendezvous, one_rank(cfg, rendezvous=rendezvous) as made:
            yield made
        return
    cfg = replace(cfg, run_id=uuid.uuid4().hex[:12])
    place = RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1,
                      init_file=f"{rendezvous}/store")
    try:
        with procwatch.undone_on_stop(lambda: _remove(cfg)):
            yield cfg, place
    finally:
        _remove(cfg)
