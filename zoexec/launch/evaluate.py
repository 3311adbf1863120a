"""`zoexec eval MODEL_DIR --data FILE`: a model folder evaluated on one rank of a
hand-built plan for the model, through the path training evaluates with
(zoexec.run.evaluate): blocks streamed from host memory, so a model that does not fit on
the device is evaluated the way it trains."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from zoexec.config import RunConfig
from zoexec.data.tasks import TaskSpec
from zoexec.data.text import TOKENIZER_FILES
from zoexec.launch.spawn import one_rank
from zoexec.run.evaluate import make_evaluator
from zoexec.run.report import quiet_libraries
from zoexec.runtime import device as zdevice
from zoexec.runtime import groups as zgroups
from zoexec.runtime import lanes as zlanes
from zoexec.store.node import close_store, load_node_model, share_read_flags
from zoexec.train.engine import Trainer
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

EVAL_BATCH = 8     # zoexec eval: rows per call (one rank)
EVAL_SEQ = 512     # zoexec eval: longest row (tokens), capped by the model's positions


def eval_config(model_dir: Path, data: Path, spec: TaskSpec, *, batch: int = EVAL_BATCH,
                seq: int | None = None, dtype: str = "fp32", threads: int | None = None):
    """A one-rank RunConfig that evaluates `model_dir` on `data` (a hand-built plan)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ZoError(f"{model_dir} is not a model folder (no config.json)")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES) and spec.name != "text":
        raise ZoError(f"{model_dir} holds no tokenizer (no {', '.join(TOKENIZER_FILES)}): "
                      f"--task {spec.name} needs one")
    if not Path(data).exists():
        raise ZoError(f"data file {data} does not exist")
    if batch < 1:
        raise ZoError(f"--batch {batch}: give 1 or more rows")
    model = get_model(str(model_dir))
    seq = seq or min(EVAL_SEQ, model.max_positions)
    if seq < 2:
        raise ZoError(f"--seq {seq}: give 2 or more tokens")
    workload = Workload(batch=batch, seq=seq, param_dtype=dtype, compute_dtype=dtype)
    plan = hand_plan(model=model, layout=Layout(), workload=workload, device_kind=_device_kind(),
                     profile_name="zoexec-eval")
    return RunConfig(plan=plan.data, plan_path="(zoexec eval)", init=str(model_dir),
                     data=str(data), steps=1, task=spec.to_dict(), eval_data=str(data),
                     source_dir=str(model_dir), progress=False, speed_checks=False,
                     threads=threads)


def _device_kind() -> str:
    return "cuda" if zdevice.device_count("cuda") > 0 else "cpu"


def eval_model(cfg) -> dict[str, float]:
    """Evaluate cfg.init on cfg.eval_data on one rank in this process: the metrics."""
    evaluator = make_evaluator(cfg)   # the data first: a bad file fails before the model loads
    with one_rank(cfg) as (cfg, place):
        env = store = None
        try:
            env = zgroups.init_distributed(place=place, layout=cfg.layout,
                                           device_kind=cfg.device_kind, tf32=cfg.workload.tf32)
            zgroups.set_threads(cfg.threads, 1)
            with torch.no_grad(), quiet_libraries(True):
                parts, store = load_node_model(cfg, env, cfg.run_id)
                flags = share_read_flags(env, cfg.run_id, num_blocks=store.num_blocks)
                trainer = Trainer(cfg=cfg, env=env, parts=parts, store=store, source=None,
                                  lanes=zlanes.make_lanes(env, epoch_s=0.0), flags=flags)
                metrics = evaluator.run(trainer)
        finally:
            close_store(store)
            zgroups.shutdown(env)
    if not math.isfinite(metrics.get("eval_loss", math.nan)):
        raise ZoError(f"{cfg.eval_data}: no token to score (every label is ignored)")
    return metrics
