"""One rank of `zoexec run`, from joining the job to leaving it: the device and groups,
the data, the run folder (rank 0 owns it), the node's model, the training loop
(zoexec.run.loop) around the engine's steps, and at the end the weights, then the trace,
then rank 0's summary (zoexec.run.report). With --trace each rank writes its spans to
its own file as it goes (bounded memory; nothing is gathered but memory figures)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from zoexec.config import RunConfig
from zoexec.data.sources import make_source
from zoexec.launch.limits import limited, watched
from zoexec.launch.noop import check_noop, warn_line
from zoexec.launch.preflight import check_gpu_memory
from zoexec.maths.history import StepRecord
from zoexec.run.evaluate import make_evaluator
from zoexec.run.folder import RunDir
from zoexec.run.loop import EXIT_CODES, TrainLoop, prepare_rundir
from zoexec.run.report import Reporter, quiet_libraries
from zoexec.run.verify import z_environment, z_problem
from zoexec.run.writes import writing
from zoexec.runtime import groups as zgroups
from zoexec.runtime import lanes as zlanes
from zoexec.runtime import procwatch
from zoexec.runtime.errors import failing
from zoexec.runtime.hostenv import keep_freed_memory
from zoexec.store.node import close_store, host_memory_probe, load_node_model, share_read_flags
from zoexec.train.engine import Trainer
from zoexec.train.prefix import trainer_class
from zoexec.train.speed import SpeedMonitor
from zoexec.train.zokernel import zo_kernel_record
from zoplan.errors import ZoError
from zoplan.io import sha256_json
from zoplan.trace import SpanWriter, write_trace_meta


def rank_main(cfg: RunConfig, place: zgroups.RankPlace, *,
              on_failure: Callable[[BaseException], None] | None = None) -> list[StepRecord]:
    """Run one rank from join to exit; the process group is destroyed on the way out.
    `on_failure(exc)` runs before that, so the first rank to fail reports first (its
    peers fail only once its connections close). SIGINT and SIGTERM stop the run at
    the next step boundary with a snapshot (zoexec.run.loop.RunStopped)."""
    env = None
    with procwatch.stop_signals(None, signals=tuple(EXIT_CODES)) as stop:
        try:
            if cfg.device_kind == "cpu":
                keep_freed_memory()   # activations are reused, not page-faulted in every block
            with limited("joining the process group"), failing("join", rank=place.rank), watched(
                    f"rank {place.rank} was joining the process group", limit_s=cfg.runtime.timeout_s,
                    end=procwatch.end_now):
                env = zgroups.init_distributed(place=place, layout=cfg.layout,
                                             device_kind=cfg.device_kind, tf32=cfg.workload.tf32,
                                               runtime=cfg.runtime)
            threads = zgroups.set_threads(cfg.runtime.threads, cfg.layout.local_ranks)
            # not inference_mode: zo's z threads would not inherit it; -q: transformers quiet too
            with torch.no_grad(), quiet_libraries(not cfg.logging.progress):
                return _run(cfg, env, threads, stop)
        except BaseException as exc:
            if on_failure is not None:
                on_failure(exc)
            raise
        finally:
            zgroups.shutdown(env)


def _run(cfg: RunConfig, env: zgroups.DistEnv, threads: int,
         stop: procwatch.StopRequest) -> list[StepRecord]:
    check_gpu_memory(cfg, env.device.index)
    reporter = Reporter.make(cfg, env)   # its clock starts here: the summary's start-up
    source = _data_source(cfg)
    evaluator = make_evaluator(cfg)   # the held-out data (--eval-data), read before the model
    owned = prepare_rundir(cfg, env, sha256_json(cfg.plan), z=_agreed_z(cfg, env))
    try:
        with failing("run_id", rank=env.rank):
            run_id = zgroups.broadcast_object(env, cfg.run_id if cfg.run_id not in ("", "run")
                                            else uuid.uuid4().hex[:12])
        parts, store = load_node_model(cfg, env, run_id)
        try:
            # an --eps or --lr that would change nothing: before the first step
            check_noop(cfg, store, warn=warn_line if env.rank == 0 else lambda line: None)
            lora = cfg.workload.frozen_base   # a read-only store: no read stamps
            flags = None if lora else share_read_flags(env, run_id, num_blocks=store.num_blocks)
            speed = SpeedMonitor.make(cfg, env, threads)
            speed.check()
            with failing("clock", rank=env.rank):
                epoch_s, clock = zlanes.clock_epoch(env)
            spans = _TraceFile(Path(cfg.logging.trace), env.rank) if cfg.logging.trace else None
            trainer = trainer_class(cfg.workload)(
                cfg=cfg, env=env, parts=parts, store=store, source=source,
                lanes=zlanes.make_lanes(env, epoch_s=epoch_s, spans=spans), flags=flags, speed=speed)
            out = cfg.checkpoint.out
            loop = TrainLoop(trainer, owned or (RunDir(out) if out else None), reporter,
                             evaluator, stop=stop)
            records = loop.run()
            speed.check()
            memory = host_memory_probe(store, env)
            loop.finish()   # the weights first: a full disk for the trace loses no model
            _write_trace(cfg, env, trainer, memory,
                         {"clock": clock, "threads": threads, "start_step": cfg.start_step,
                          "records": records, **speed.meta(),
                          **trainer.rounding.meta()})
            reporter.summary()
            return records
        finally:
            close_store(store)
    finally:
        if owned is not None:
            owned.unlock()


class _TraceFile(SpanWriter):
    """A rank's span file whose refused write (a full disk) is one line naming it."""

    def flush(self) -> None:
        with writing(self.path, what="the trace"):
            super().flush()

    def close(self) -> None:
        with writing(self.path, what="the trace"):
            super().close()


def _agreed_z(cfg: RunConfig, env: zgroups.DistEnv) -> dict[str, Any]:
    """What decides z on this rank's device (zoexec.run.verify.z_environment), the same
    on every rank and, on a resume, the run's: else a ZoError on every rank before
    anything is written."""
    mine = {**z_environment(env.device), **zo_kernel_record(cfg, env.device)}
    every = zgroups.gather_objects(env, mine)
    problem = None
    if env.rank == 0:
        recorded = (cfg.identity or {}).get("z")
        problem = z_problem(cast(list[dict[str, Any]], every), recorded=recorded, resumed=cfg.resumed and cfg.identity is not None,
                            local_ranks=cfg.layout.local_ranks)
    problem = zgroups.broadcast_object(env, problem)
    if problem:
        raise ZoError(problem)
    return mine


def _data_source(cfg: RunConfig) -> Any:
    """The data (read before the model is built, so a bad file fails fast)."""
    return make_source(cfg.task.data, vocab=cfg.model_spec.vocab, seed=cfg.optim.seed,
                       tokenizer_dir=cfg.tokenizer_dir, task=cfg.task, seq=cfg.workload.seq)


def _write_trace(cfg: RunConfig, env: zgroups.DistEnv, trainer: Trainer, memory: dict[str, Any],
                 meta_extra: dict[str, Any]) -> None:
    """Each rank closes its own span file (written as the run went: zoplan.trace.SpanWriter);
    rank 0 gathers the ranks' memory figures and writes meta.json. Without --trace
    nothing was kept and nothing is gathered."""
    if not cfg.logging.trace:
        return
    lanes: Any = trainer.lanes   # CpuLanes or CudaLanes (Trainer.lanes: object)
    lanes.spans.close()
    meta_extra = {**meta_extra, "records": [r.to_dict() for r in meta_extra["records"]]}
    with failing("trace", rank=env.rank):
        memories = zgroups.gather_objects(env, memory)
    if env.rank != 0:
        return
    meta = {"plan_sha256": sha256_json(cfg.plan), "plan_path": str(cfg.plan_path),
            "world_size": env.layout.world_size, "steps": cfg.optim.steps,
            "layout": env.layout.to_dict(), "device_kind": cfg.device_kind,
            "model": cfg.plan["model"]["name"], "workload": cfg.plan["workload"],
            "source": "zoexec", "host_memory": memories, **meta_extra}
    write_trace_meta(Path(cfg.logging.trace), meta)
