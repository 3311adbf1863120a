"""Evaluation: held-out loss, accuracy and F1 through the offloaded block pipeline.

`Evaluator.run(trainer)` scores an EvalSet (zoexec.tasks) with Trainer.evaluate, on the
clean weights (pending updates flushed), in calls of the plan's global batch: every
rank of the job makes the same calls (the slice groups gather each block), each
scores its data shard's rows of every call, and the rank that computes l+ for a data
shard (one per shard) places its rows' (summed CE, labelled tokens) in a [rows, 2]
tensor that is summed over the world, so every rank ends with every row's loss and
the metrics are the same whatever the layout. Rows are padded to the call's longest
row, and the last call with empty rows (no labels, no loss).

`zoexec eval MODEL_DIR --data FILE` (eval_model) runs the same path on one rank of a
hand-built plan for the model: blocks streamed from host memory, so a model that does
not fit on the device is evaluated the way it trains.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from zoexec.tasks import EvalSet, Example, TaskSpec, make_eval_set, pack_examples
from zoplan.errors import ZoError

EVAL_BATCH = 8     # zoexec eval: rows per call (one rank)
EVAL_SEQ = 512     # zoexec eval: longest row (tokens), capped by the model's positions


class Evaluator:
    """Evaluation of `eval_set` every `every` steps (None: at the end only) and after
    the last step; `batch`: rows per call over the whole job (the plan's batch)."""

    def __init__(self, eval_set: EvalSet, *, batch: int, seq: int, every: int | None = None) -> None:
        self.eval_set, self.batch, self.seq, self.every = eval_set, batch, seq, every

    def due(self, step: int, last: int) -> bool:
        """Evaluate after `step` (0-based) of a run whose last step is `last`?"""
        return step == last or (self.every is not None and (step + 1) % self.every == 0)

    def run(self, trainer) -> dict[str, float]:
        """The metrics of the eval set with the trainer's clean weights (collective: every
        rank calls it at the same step)."""
        env = trainer.env
        ddp = env.layout.ddp
        per = max(1, self.batch // ddp)
        call = per * ddp
        rows = self.eval_set.rows
        losses = torch.zeros(len(rows), 2, dtype=torch.float64)
        counts = trainer.signs[0] > 0
        for start in range(0, len(rows), call):
            chunk = rows[start:start + call]
            chunk = chunk + [Example((), ())] * (call - len(chunk))
            batch = pack_examples(chunk, seq=self.seq, pad=self.eval_set.pad, where="eval data")
            lo = trainer.data_shard * per
            out = trainer.evaluate(batch.select(lo, lo + per))
            if counts:
                stop = min(per, len(rows) - start - lo)
                if stop > 0:
                    losses[start + lo:start + lo + stop] = out[:stop]
        if env.place.world_size > 1:
            import torch.distributed as dist

            losses = losses.to(trainer.token.device)
            dist.all_reduce(losses, group=env.world)
            losses = losses.cpu()
        return self.eval_set.metrics(losses)


def make_evaluator(cfg) -> Evaluator | None:
    """The run's Evaluator (None without --eval-data); the eval set is read here."""
    if not cfg.eval_data:
        return None
    wl = cfg.workload
    eval_set = make_eval_set(cfg.eval_data, TaskSpec.from_dict(cfg.task), vocab=cfg.model.vocab,
                             seq=wl.seq, tokenizer_dir=cfg.tokenizer_dir)
    return Evaluator(eval_set, batch=wl.batch, seq=wl.seq, every=cfg.eval_every)


# ---- zoexec eval ------------------------------------------------------------------------------
def eval_config(model_dir: Path, data: Path, spec: TaskSpec, *, batch: int = EVAL_BATCH,
                seq: int | None = None, dtype: str = "fp32", threads: int | None = None):
    """A one-rank RunConfig that evaluates `model_dir` on `data` (a hand-built plan)."""
    from zoexec.config import RunConfig
    from zoexec.data import TOKENIZER_FILES
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.models import get_model
    from zoplan.workload import Workload

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
    from zoexec import dist as zdist

    return "cuda" if zdist.device_count("cuda") > 0 else "cpu"


def eval_model(cfg) -> dict[str, float]:
    """Evaluate cfg.init on cfg.eval_data on one rank in this process: the metrics."""
    from zoexec import dist as zdist
    from zoexec.launch import one_rank
    from zoexec.node import close_store, load_node_model, share_read_flags
    from zoexec.report import quiet_libraries

    evaluator = make_evaluator(cfg)   # the data first: a bad file fails before the model loads
    with one_rank(cfg) as (cfg, place):
        env = store = None
        try:
            env = zdist.init_distributed(place=place, layout=cfg.layout,
                                         device_kind=cfg.device_kind, tf32=cfg.workload.tf32)
            zdist.set_threads(cfg.threads, 1)
            with torch.no_grad(), quiet_libraries(True):
                from zoexec.engine import Trainer

                parts, store = load_node_model(cfg, env, cfg.run_id)
                flags = share_read_flags(env, cfg.run_id, num_blocks=store.num_blocks)
                trainer = Trainer(cfg=cfg, env=env, parts=parts, store=store, source=None,
                                  lanes=zdist.make_lanes(env, epoch_s=0.0), flags=flags)
                metrics = evaluator.run(trainer)
        finally:
            close_store(store)
            zdist.shutdown(env)
    if not math.isfinite(metrics.get("eval_loss", math.nan)):
        raise ZoError(f"{cfg.eval_data}: no token to score (every label is ignored)")
    return metrics
