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

from zoplan.errors import EXIT_USER_ERROR, ZoError

EXIT_RANK_FAILED = 1
KILL_GRACE_S = 3.0
PRELOAD = ["torch", "transformers", "zoexec.engine"]


class RankFailure(Exception):
    """A rank stopped on a runtime error (not bad input); one-line message."""

    exit_code = EXIT_RANK_FAILED


# ---- preflight ------------------------------------------------------------------------------
def preflight(cfg, *, world_size: int | None = None, local_world_size: int | None = None) -> None:
    """Raise ZoError if the plan cannot run here as asked."""
    lay = cfg.layout
    if world_size is None and lay.nodes > 1:
        raise ZoError(f"the plan spans {lay.nodes} nodes of {lay.local_ranks} ranks; start it "
                      f"on every node with torchrun --nnodes {lay.nodes} --nproc-per-node "
                      f"{lay.local_ranks} -m zoexec.cli run ...")
    if world_size is not None and world_size != lay.world_size:
        raise ZoError(f"torchrun started {world_size} ranks but the plan's layout "
                      f"{lay.label()} has {lay.world_size}")
    if local_world_size is not None and local_world_size != lay.local_ranks:
        raise ZoError(f"torchrun started {local_world_size} ranks on this node but the plan "
                      f"puts {lay.local_ranks} on each node")
    _check_devices(cfg)
    _check_memory(cfg)
    _check_model(cfg)
    if cfg.data != "synthetic" and not Path(cfg.data).is_file():
        raise ZoError(f"data file {cfg.data} does not exist")
    for what, where in (("--out", cfg.out_dir), ("--trace", cfg.trace_dir)):
        if where and Path(where).exists() and not Path(where).is_dir():
            raise ZoError(f"{what} {where} exists and is not a directory")


def _check_devices(cfg) -> None:
    from zoexec.dist import device_count

    need, have = cfg.layout.local_ranks, device_count(cfg.device_kind)
    if have < need:
        raise ZoError(f"the plan needs {need} CUDA GPU(s) per node but this machine has "
                      f"{have}" + ("" if have else " (plan profile device_kind is 'cuda')"))


def _check_memory(cfg) -> None:
    """Host memory here; GPU memory is checked by each rank on its own GPU
    (check_gpu_memory), so that the launcher never creates a CUDA context."""
    import psutil

    pred, lay = cfg.plan["predicted"], cfg.layout
    host = float(pred.get("host_mem_bytes") or 0)
    if cfg.device_kind == "cpu":
        host += lay.local_ranks * float(pred.get("gpu_mem_bytes") or 0)
    available = psutil.virtual_memory().available
    if host > available:
        raise ZoError(f"the plan needs {host / 2**30:.2f} GiB of host memory per node, "
                      f"{available / 2**30:.2f} GiB is available")


def check_gpu_memory(cfg, local_rank: int) -> None:
    """The plan's predicted memory per GPU fits this rank's GPU (no-op on the CPU)."""
    from zoexec.dist import device_memory_bytes

    need = float(cfg.plan["predicted"].get("gpu_mem_bytes") or 0)
    total = device_memory_bytes(cfg.device_kind, local_rank)
    if total is not None and need > total:
        raise ZoError(f"the plan needs {need / 2**30:.2f} GiB per GPU, GPU {local_rank} has "
                      f"{total / 2**30:.2f} GiB")


def _check_model(cfg) -> None:
    """--model-path: a directory with a config.json whose shape matches the plan's."""
    if cfg.init == "random":
        return
    from zoplan.models import ModelSpec, get_model

    path = Path(cfg.init)
    if not path.is_dir():
        raise ZoError(f"model path {path} is not a directory")
    if not (path / "config.json").is_file():
        raise ZoError(f"model path {path} has no config.json")
    have, want = get_model(str(path)), ModelSpec.from_dict(cfg.plan["model"]["spec"])
    for key in ("family", "num_layers", "hidden", "vocab"):
        if getattr(have, key) != getattr(want, key):
            raise ZoError(f"model in {path} has {key} {getattr(have, key)} but the plan was "
                          f"made for {getattr(want, key)} ({want.name})")


# ---- running ---------------------------------------------------------------------------------
def run(cfg) -> None:
    """Run a plan: under torchrun one rank here, otherwise all local ranks spawned."""
    from zoexec.dist import place_from_env

    place = place_from_env()
    if place is not None:
        run_torchrun_rank(cfg, place)
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
    from zoexec.dist import RankPlace, free_port
    from zoexec.store import remove_run_files

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
DEFAULT_STEPS = 10
# zoplan.calibrate.STEADY_RUN_S (20 s: a traced run this long averages a drifting
# machine's speeds) with a margin, for plans that predict a little slower than they run
TRACE_RUN_S = 25.0


def default_steps(plan, *, traced: bool) -> int:
    """--steps when not given: DEFAULT_STEPS, or with --trace enough of the plan's
    predicted steps for TRACE_RUN_S (and the first, which calibrate skips), at least
    DEFAULT_STEPS: a trace is for `zoplan calibrate`, and a short run's median is the
    speed of one moment of a machine whose speed wanders."""
    from zoplan.calibrate import steps_for_seconds

    if not traced:
        return DEFAULT_STEPS
    return max(DEFAULT_STEPS, steps_for_seconds(plan.step_time_s, TRACE_RUN_S))


def build_config(*, plan: Path, model_path: Path | None, init: str | None, data: Path | None,
                 steps: int | None, seed: int, lr: float, eps: float, weight_decay: float,
                 out: Path | None, trace: Path | None, threads: int | None, quiet: bool):
    """A checked RunConfig from the command line's values (ZoError on bad input);
    `steps` None: default_steps."""
    from zoexec.engine import RunConfig
    from zoplan.plan import Plan

    loaded = Plan.load(plan)
    if steps is None:
        steps = default_steps(loaded, traced=trace is not None)
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
    """Run a one-rank plan in this process (tests, benchmarks); returns the StepRecords."""
    from zoexec.dist import RankPlace, free_port
    from zoexec.engine import rank_main
    from zoexec.store import remove_run_files

    if cfg.layout.world_size != 1:
        raise ZoError(f"run_in_process needs a one-rank plan, not {cfg.layout.label()}")
    preflight(cfg)
    cfg = replace(cfg, run_id=uuid.uuid4().hex[:12])
    place = RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1,
                      master_port=free_port())
    try:
        return rank_main(cfg, place)
    finally:
        remove_run_files(cfg.run_id)
