"""`zoexec run`'s options turned into a checked RunConfig: defaults, the run folder
(a new run, --overwrite, or --resume with its snapshot and the log to replay), and
checkpoint intervals. Every problem is a ZoError before anything is written."""

from __future__ import annotations

import os
import re
from pathlib import Path

from zoexec.config import RunConfig
from zoexec.data.tasks import TaskSpec, parse_label_words
from zoexec.model.export import MAX_SHARD_BYTES, parse_size
from zoexec.run.folder import RunDir
from zoexec.run.report import check_report_to
from zoplan.errors import ZoError
from zoplan.execrules import default_steps
from zoplan.io import sha256_json
from zoplan.plan import Plan

DEFAULTS = {"seed": 0, "lr": 1e-6, "eps": 1e-3, "weight_decay": 0.0, "lr_schedule": "constant",
            "warmup_steps": 0}
SAVE_EVERY_S = 1800.0   # snapshots by default: every 30 minutes of training
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h)")


def parse_every(text: str | None) -> tuple[int | None, float | None]:
    """--save-every: N steps ("500") or a duration ("30m", "900s", "2h"); default 30m."""
    if text is None:
        return None, SAVE_EVERY_S
    text = text.strip().lower()
    if text.isdigit() and int(text) >= 1:
        return int(text), None
    match = _DURATION.fullmatch(text)
    if match and float(match[1]) > 0:
        return None, float(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]
    raise ZoError(f"--save-every {text!r}: give a number of steps (500) or a duration "
                  f"(30m, 900s, 2h)")


def build_config(*, plan: Path, model_path: Path | None = None, init: str | None = None,
                 data: Path | None = None, steps: int | None = None, seed: int | None = None,
                 lr: float | None = None, eps: float | None = None,
                 weight_decay: float | None = None, out: Path | None = None,
                 trace: Path | None = None, threads: int | None = None, quiet: bool = False,
                 resume: Path | None = None, overwrite: bool = False,
                 save_every: str | None = None, keep: int = 2, on_nonfinite: str = "stop",
                 lr_schedule: str | None = None, warmup_steps: int | None = None,
                 report_to: str = "none", log_every: int | None = None,
                 max_shard_size: str | None = None, task: dict | None = None,
                 eval_data: Path | None = None, eval_every: int | None = None) -> RunConfig:
    """A checked RunConfig from the command line's values (None: not given); `task`:
    the task options given (task_options), None when none was."""
    loaded = Plan.load(plan)
    if model_path is not None and init is not None:
        raise ZoError("give either --model-path DIR or --init random, not both")
    if init not in (None, "random"):
        raise ZoError(f"--init accepts only 'random' (got {init!r}); use --model-path DIR "
                      f"for weights from a folder")
    if resume is not None and out is not None and Path(out) != Path(resume):
        raise ZoError("--resume DIR continues the run in DIR: give no other --out")
    given = {"seed": seed, "lr": lr, "eps": eps, "weight_decay": weight_decay,
             "lr_schedule": lr_schedule, "warmup_steps": warmup_steps,
             "data": str(data) if data else None,
             "init": str(model_path) if model_path else init,
             "task": TaskSpec.from_dict(task).to_dict() if task is not None else None}
    every, every_s = parse_every(save_every)
    common = dict(plan=loaded.data, plan_path=str(plan), trace_dir=str(trace) if trace else None,
                  threads=threads, progress=not quiet, save_every=every, save_every_s=every_s,
                  keep=keep, on_nonfinite=on_nonfinite, report_to=report_to, log_every=log_every,
                  max_shard_bytes=MAX_SHARD_BYTES if max_shard_size is None
                  else parse_size(max_shard_size),
                  eval_data=str(eval_data) if eval_data else None, eval_every=eval_every)
    if eval_every is not None and eval_data is None:
        raise ZoError("--eval-every needs --eval-data FILE (the held-out data to evaluate)")
    if eval_every is not None and eval_every < 1:
        raise ZoError(f"--eval-every {eval_every}: give a number of steps >= 1")
    if eval_data is not None and not Path(eval_data).exists():
        raise ZoError(f"--eval-data {eval_data}: no such file or folder")
    if log_every is not None and log_every < 1:
        raise ZoError(f"--log-every {log_every}: give a number of steps >= 1")
    check_report_to(report_to, out or resume)
    try:
        if resume is not None or _restarted_by_torchrun(out, loaded):
            return _resumed(Path(resume or out), loaded, given, steps, common)
        _claim(out, overwrite)
        settings = {k: DEFAULTS[k] if v is None else v for k, v in given.items()
                    if k in DEFAULTS}
        start = str(model_path) if model_path else "random"
        spec = given["task"] or TaskSpec().to_dict()
        if data is None and spec["name"] != "text":
            raise ZoError(f"--task {spec['name']} needs --data FILE (the built-in synthetic "
                          f"task is text)")
        if data is None and eval_data is not None:
            raise ZoError("--eval-data needs --data FILE (the built-in synthetic task has no "
                          "held-out set)")
        return RunConfig(**common, **settings, init=start,
                         data=str(data) if data else "synthetic",
                         steps=steps or default_steps(loaded.step_time_s,
                                                      traced=trace is not None),
                         out_dir=str(out) if out else None,
                         source_dir=start if start != "random" else None, task=spec)
    except ValueError as exc:
        raise ZoError(str(exc)) from None


def _claim(out: Path | None, overwrite: bool) -> None:
    """A new run's folder: free, or emptied with --overwrite."""
    if out is None:
        if overwrite:
            raise ZoError("--overwrite needs --out DIR")
        return
    rundir = RunDir(out)
    if not rundir.holds_a_run:
        return
    rundir.check_free()
    if not overwrite:
        done = rundir.records()
        what = f"step {done[-1].step + 1} logged" if done else "no step logged"
        raise ZoError(f"{out} holds a run ({what}); resume it with --resume {out}, or give "
                      f"--overwrite to replace it")
    rundir.clear()


def _resumed(folder: Path, plan: Plan, given: dict, steps: int | None, common: dict) -> RunConfig:
    rundir = RunDir(folder)
    rundir.check_free()
    start = rundir.resume_plan(plan_sha256=sha256_json(plan.data), given=given)
    settings = start.settings
    total = steps or settings["steps"]
    final = rundir.final()
    if start.start_step > total or (start.start_step == total and final and final[0] >= total - 1):
        raise ZoError(f"{folder} has run all {start.start_step} steps; give --steps N (more "
                      f"than {start.start_step}) to train further")
    # start_step == total without a whole final/: killed while saving it; the resume
    # replays the log and writes final/
    source = settings["init"] if settings["init"] != "random" else None
    return RunConfig(**common, **{k: settings[k] for k in DEFAULTS}, data=settings["data"],
                     init=start.init, steps=total, out_dir=str(folder),
                     start_step=start.start_step, replay=start.replay, resumed=True,
                     source_dir=source, task=settings["task"])


def _restarted_by_torchrun(out: Path | None, plan: Plan) -> bool:
    """Under `torchrun --max-restarts`, a restarted job (TORCHELASTIC_RESTART_COUNT > 0)
    resumes its run folder by itself when it holds a run of this plan."""
    if out is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) < 1:
        return False
    rundir = RunDir(out)
    try:
        return rundir.read_identity()["plan_sha256"] == sha256_json(plan.data)
    except ZoError:
        return False


def task_options(*, task: str | None = None, text_column: str | None = None,
                 prompt_column: str | None = None, completion_column: str | None = None,
                 label_column: str | None = None, template: str | None = None,
                 label_words: str | None = None) -> dict | None:
    """The task options given on the command line as a TaskSpec dict (checked), None
    when none was given (a resume keeps its run's task)."""
    given = {"name": task, "text_column": text_column, "prompt_column": prompt_column,
             "completion_column": completion_column, "label_column": label_column,
             "template": template,
             "label_words": parse_label_words(label_words) if label_words is not None else None}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    return TaskSpec(**given).to_dict()
