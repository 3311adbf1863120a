"""`zoexec eval MODEL_DIR --data FILE`: a model folder (or a LoRA adapter folder over its
base) evaluated on one rank of a hand-built plan for the model, through the path
training evaluates with (zoexec.run.evaluate): blocks streamed from host memory, so a
model that does not fit on the device is evaluated the way it trains."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from zoexec.config import (
    EvalOptions,
    LoggingOptions,
    ModelOptions,
    OptimOptions,
    RunConfig,
    RuntimeOptions,
)
from zoexec.data.presets import with_preset
from zoexec.data.section import TaskOptions
from zoexec.data.text import TOKENIZER_FILES
from zoexec.fields import option_fields
from zoexec.launch.spawn import one_rank, private_folder
from zoexec.run.evaluate import make_evaluator
from zoexec.run.report import quiet_libraries
from zoexec.run.verify import check_safetensors
from zoexec.runtime import device as zdevice
from zoexec.runtime import groups as zgroups
from zoexec.runtime import lanes as zlanes
from zoexec.store.node import close_store, load_node_model, share_read_flags
from zoexec.train.prefix import trainer_class
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.io import need_folder, need_input
from zoplan.layout import Layout
from zoplan.modeldir import weight_files
from zoplan.models import get_model
from zoplan.workload import Workload

EVAL_SEQ = 512     # zoexec eval: longest row (tokens) when not given, capped by the model's positions


def eval_config(model_dir: Path, data: Path, **values: Any) -> RunConfig:
    """A one-rank RunConfig that evaluates `model_dir` on `data` (a hand-built plan);
    `values`: the options given (zoexec.config.EvalOptions, TaskOptions, --threads).
    `model_dir` is an HF model folder, or a LoRA run's adapter folder (final/, best/,
    a snapshot; any PEFT LoRA folder) evaluated over its base as the run computes it:
    the base streamed, the adapters applied on the fly, no merged copy written."""
    ev = EvalOptions(**{f.name: values.pop(f.name) for f in option_fields(EvalOptions)
                        if f.name in values})
    runtime = RuntimeOptions(threads=values.pop("threads", None))
    task = TaskOptions(data=str(data), eval_data=str(data), **with_preset(values))
    if task.demonstrations and not task.demonstrations_data:
        raise ZoError(f"--demonstrations {task.demonstrations} needs --demonstrations-data "
                      f"FILE, the training file the demonstrations come from (here --data "
                      f"is the evaluated file)")
    model_dir = need_folder(model_dir, what="model folder")
    adapters = _adapters(model_dir, ev.base)
    weights_dir = Path(adapters["base"]) if adapters else model_dir
    _check_model_folder(need_folder(weights_dir, what="base model folder"), task)
    need_input(data, what="data")
    model = get_model(str(weights_dir))
    seq = min(EVAL_SEQ, model.max_positions) if ev.seq is None else ev.seq
    lora = adapters["workload"] if adapters else {}
    workload = Workload(batch=ev.eval_batch, seq=seq, param_dtype=ev.precision,
                        compute_dtype=ev.precision, **lora)
    plan = hand_plan(model=model, layout=Layout(), workload=workload, device_kind=_device_kind(),
                     profile_name="zoexec-eval")
    return RunConfig(plan=plan.data, plan_path="(zoexec eval)",
                     model=ModelOptions(model_path=str(weights_dir)), task=task,
                     optim=OptimOptions(steps=1), logging=LoggingOptions(quiet=True),
                     runtime=runtime, speed_checks=False,
                     load_from=str(model_dir) if adapters else None)


def _adapters(folder: Path, base: str | None) -> dict[str, Any] | None:
    """A PEFT LoRA or prefix-tuning folder's base folder (--base, else its
    adapter_config.json's) and the workload keys of its tuning; None for any other
    folder."""
    from zoexec.model.lora import (
        ADAPTER_CONFIG,
        ADAPTER_WEIGHTS,
        adapter_settings,
        check_adapter_file,
    )
    from zoexec.model.prefix import is_prefix_folder, prefix_settings

    if not (folder / ADAPTER_CONFIG).is_file():
        if base is not None:
            raise ZoError(f"--base {base}: {folder} is not an adapter folder (no "
                          f"{ADAPTER_CONFIG}); --base is the base of LoRA or prefix adapters")
        return None
    if is_prefix_folder(folder):
        settings = prefix_settings(folder)
        workload = {"tuning": "prefix", "prefix_tokens": settings["tokens"]}
    else:
        settings = adapter_settings(folder)
        workload = {"tuning": "lora", "lora_r": settings["r"], "lora_alpha": settings["alpha"],
                    "lora_targets": settings["targets"]}
    given = base or settings["base"]
    if not given or not (Path(given) / "config.json").is_file():
        raise ZoError(f"{folder} holds adapters whose base model folder "
                      f"{given or '(none recorded)'} has no config.json: give --base DIR, "
                      f"the model folder the run trained on")
    check_adapter_file(folder)
    problem = check_safetensors(folder / ADAPTER_WEIGHTS)   # whole (PEFT's: no state.json)
    if problem:
        raise ZoError(problem)
    return {"workload": workload, "base": given}


def _check_model_folder(model_dir: Path, task: TaskOptions) -> None:
    """A model folder with whole weights and (any task but text) a tokenizer."""
    if not (model_dir / "config.json").is_file():
        raise ZoError(f"{model_dir} is not a model folder (no config.json) nor a LoRA "
                      f"adapter folder (no adapter_config.json)")
    for shard in weight_files(model_dir):   # whole shards: a truncated one is one line
        problem = check_safetensors(shard)
        if problem:
            raise ZoError(problem)
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES) and task.name != "text":
        raise ZoError(f"{model_dir} holds no tokenizer (no {', '.join(TOKENIZER_FILES)}): "
                      f"--task {task.name} needs one")


def _device_kind() -> str:
    return "cuda" if zdevice.device_count("cuda") > 0 else "cpu"


def eval_model(cfg: RunConfig) -> dict[str, float]:
    """Evaluate cfg.weights on cfg.task.eval_data on one rank in this process: the metrics."""
    with private_folder() as rendezvous:   # the data library's cache in it too
        return _eval_model(cfg, rendezvous)


def _eval_model(cfg: RunConfig, rendezvous: Path) -> dict[str, float]:
    evaluator = make_evaluator(cfg)   # the data first: a bad file fails before the model loads
    assert evaluator is not None      # eval_config sets --eval-data
    with one_rank(cfg, rendezvous=rendezvous) as (cfg, place):
        env = store = None
        try:
            env = zgroups.init_distributed(place=place, layout=cfg.layout,
                                         device_kind=cfg.device_kind, tf32=cfg.workload.tf32,
                                         runtime=cfg.runtime)
            zgroups.set_threads(cfg.runtime.threads, 1)
            with torch.no_grad(), quiet_libraries(True):
                parts, store = load_node_model(cfg, env, cfg.run_id)
                lora = cfg.workload.frozen_base   # a read-only store: no read stamps
                flags = None if lora else share_read_flags(env, cfg.run_id,
                                                           num_blocks=store.num_blocks)
                trainer = trainer_class(cfg.workload)(
                    cfg=cfg, env=env, parts=parts, store=store, source=None,
                    lanes=zlanes.make_lanes(env, epoch_s=0.0), flags=flags)
                metrics = evaluator.run(trainer)
        finally:
            close_store(store)
            zgroups.shutdown(env)
    if not math.isfinite(metrics.get("eval_loss", math.nan)):
        raise ZoError(f"{cfg.task.eval_data}: no token to score (every label is ignored)")
    return metrics
