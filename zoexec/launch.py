"""Starting the ranks of a plan: preflight checks, local spawning, torchrun.

`zoexec run plan.json` on one machine starts the plan's ranks itself (one process per
rank, from a forkserver that has imported torch and transformers once, so starting a
rank costs a fork, not an import). Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK in
the environment) the same command runs one rank in the current process; that is how a
plan of several nodes runs:
    torchrun --nnodes N --nproc-per-node K --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m zoexec.cli run plan.json ...

Before anything starts, `preflight` checks the plan against the machine (world size,
devices, host and GPU memory, model directory, data file) and raises ZoError with the
numbers. A rank that fails reports a one-line reason; the launcher then stops the
other ranks (SIGTERM, then SIGKILL), removes the run's store files and raises
RankFailure naming the first rank that failed.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import uuid
from dataclasses import replace
from pathlib import Path

from zoexec.config import RunConfig
from zoexec.dist import RankPlace, free_port, place_from_env
from zoexec.preflight import preflight
from zoexec.store import remove_run_files
from zoplan.errors import EXIT_USER_ERROR, ZoError
from zoplan.execrules import default_steps
from zoplan.plan import Plan

EXIT_RANK_FAILED = 1
KILL_GRACE_S = 3.0
PRELOAD = ["torch", "transformers", "zoexec.engine"]   # what the forkserver imports once


class RankFailure(Exception):
    """A rank stopped on a runtime error (not bad input); one-line message."""

    exit_code = EXIT_RANK_FAILED


# ---- running ---------------------------------------------------------------------------------
def run(cfg) -> None:
    """Run a plan: under torchrun one rank here, otherwise all local ranks spawned."""
    place = place_from_env()
    if place is not None:
        run_torchrun_rank(cfg, place)
        return
    if cfg.layout.world_size == 1:   # one rank: no process to start, no forkserver
        run_in_process(cfg)
        return
    preflight(cfg)
    spawn_local(cfg)


def run_torchrun_rank(cfg, place) -> None:
    """One rank started by torchrun: preflight, then run; failures leave this process
    with a one-line reason (torchrun stops the others)."""
    from zoexec.engine import failure_reason, rank_main

    try:
        preflight(cfg, world_size=place.world_size, local_world_size=place.local_world_size)
    except ZoError:
        if place.local_rank != 0:          # one line per node, not one per rank
            sys.exit(EXIT_USER_ERROR)
        raise
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # torchrun stopping us: clean up
    try:
        rank_main(cfg, place)
    except ZoError:
        raise
    except Exception as exc:
        _debug_traceback()
        raise RankFailure(f"rank {place.rank} failed: {failure_reason(exc)}") from None


def spawn_local(cfg) -> None:
    """Start the plan's ranks on this machine and wait; the first failure stops all."""
    cfg = replace(cfg, run_id=cfg.run_id if cfg.run_id not in ("", "run") else uuid.uuid4().hex[:12])
    ctx = _context(cfg.plan["model"]["spec"]["family"])
    reasons = ctx.SimpleQueue()
    port, world = free_port(), cfg.layout.world_size
    procs = []
    try:
        for rank in range(world):
            place = RankPlace(rank=rank, local_rank=rank, world_size=world,
                              local_world_size=world, master_port=port)
            proc = ctx.Process(target=_rank_entry, args=(cfg, place, reasons),
                               name=f"zoexec-rank{rank}")
            proc.start()
            procs.append(proc)
        failed = _wait_first_failure(procs)
    finally:
        _stop(procs)
        remove_run_files(cfg.run_id)
    if failed is not None:
        _raise_failure(failed, procs, reasons)


def _context(family: str):
    """The multiprocessing context; a forkserver imports torch, transformers and the
    model family's module once (effective when the server starts, i.e. first use)."""
    method = os.environ.get("ZOEXEC_START_METHOD", "forkserver")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD + [f"transformers.models.{family}.modeling_{family}"])
    return ctx


def _wait_first_failure(procs) -> int | None:
    """Index of the first process that exited non-zero, or None when all succeeded."""
    alive = {proc.sentinel: index for index, proc in enumerate(procs)}
    while alive:
        for sentinel in mp.connection.wait(list(alive)):
            index = alive.pop(sentinel)
            procs[index].join()
            if procs[index].exitcode != 0:
                return index
    return None


def _stop(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(KILL_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _raise_failure(index: int, procs, reasons) -> None:
    """Raise for the first rank that reported a failure (else the first that died)."""
    first = None
    while not reasons.empty():
        report = reasons.get()
        first = first or report
    if first is None:
        rank, code = index, EXIT_RANK_FAILED
        text = f"exited with code {procs[index].exitcode} without a reason (killed?)"
    else:
        rank, code, text = first
    message = f"rank {rank} failed: {text}"
    if code == EXIT_USER_ERROR:
        raise ZoError(message)
    raise RankFailure(message)


def _rank_entry(cfg, place, reasons) -> None:
    """Body of a spawned rank: run, or report a one-line reason and exit non-zero."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from zoexec.engine import failure_reason, rank_main

    def report(exc: BaseException) -> None:
        if not isinstance(exc, SystemExit):
            code = EXIT_USER_ERROR if isinstance(exc, ZoError) else EXIT_RANK_FAILED
            reasons.put((place.rank, code, failure_reason(exc)))

    try:
        rank_main(cfg, place, on_failure=report)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported by `report`, then exit
        _debug_traceback()
        sys.exit(EXIT_USER_ERROR if isinstance(exc, ZoError) else EXIT_RANK_FAILED)


def _debug_traceback() -> None:
    if os.environ.get("ZOEXEC_DEBUG"):
        import traceback

        traceback.print_exc()


# ---- the command line's configuration ------------------------------------------------------


def build_config(*, plan: Path, model_path: Path | None, init: str | None, data: Path | None,
                 steps: int | None, seed: int, lr: float, eps: float, weight_decay: float,
                 out: Path | None, trace: Path | None, threads: int | None, quiet: bool):
    """A checked RunConfig from the command line's values (ZoError on bad input);
    `steps` None: zoplan.execrules.default_steps."""
    loaded = Plan.load(plan)
    if steps is None:
        steps = default_steps(loaded.step_time_s, traced=trace is not None)
    if model_path is not None and init is not None:
        raise ZoError("give either --model-path DIR or --init random, not both")
    if init not in (None, "random"):
        raise ZoError(f"--init accepts only 'random' (got {init!r}); use --model-path DIR "
                      f"for weights from a folder")
    try:
        return RunConfig(plan=loaded.data, plan_path=str(plan),
                         init=str(model_path) if model_path else "random",
                         data=str(data) if data else "synthetic", steps=steps, seed=seed,
                         lr=lr, eps=eps, weight_decay=weight_decay,
                         out_dir=str(out) if out else None,
                         trace_dir=str(trace) if trace else None, threads=threads,
                         progress=not quiet)
    except ValueError as exc:
        raise ZoError(str(exc)) from None


def run_in_process(cfg) -> list:
    """Run a one-rank plan in this process (`zoexec run` of a one-rank plan, tests,
    benchmarks); returns the StepRecords. A failure that is not the user's is a
    RankFailure with its one-line reason, as from a spawned rank."""
    from zoexec.engine import failure_reason, rank_main

    if cfg.layout.world_size != 1:
        raise ZoError(f"run_in_process needs a one-rank plan, not {cfg.layout.label()}")
    preflight(cfg)
    cfg = replace(cfg, run_id=uuid.uuid4().hex[:12])
    place = RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1,
                      master_port=free_port())
    try:
        return rank_main(cfg, place)
    except (ZoError, KeyboardInterrupt):
        raise
    except Exception as exc:
        _debug_traceback()
        raise RankFailure(f"rank 0 failed: {failure_reason(exc)}") from None
    finally:
        remove_run_files(cfg.run_id)
