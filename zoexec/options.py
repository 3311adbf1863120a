"""`zoexec run`'s options turned into a checked RunConfig: what is derived when the
config is built, in one place. The names, defaults and checks are the fields'
(zoexec.config); here: --model-path vs --init, the environment defaults of the runtime
options, the trace's default steps, the run folder (a new run, --overwrite, or --resume
with its snapshot and the log to replay). Every problem is a ZoError before anything
is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zoexec.config import (
    KEPT,
    RUN_KEPT,
    SETTINGS,
    TASK_FIELDS,
    FieldError,
    Json,
    RunConfig,
    TaskOptions,
    Values,
    check_given,
    env_defaults,
    option_error,
    parse_best,
    section_of,
)
from zoexec.data.presets import with_preset
from zoexec.flags import repeated, resume_command
from zoexec.run.extension import extend
from zoexec.run.folder import RunDir
from zoexec.run.report import METRICS, check_report_to
from zoexec.run.verify import fingerprints
from zoexec.run.watch import BestMetric
from zoplan.errors import ZoError
from zoplan.execrules import default_steps
from zoplan.hubcache import model_folder
from zoplan.io import need_input, sha256_json, sha256_path
from zoplan.plan import Plan


def build_config(*, plan: Path | str, **values: Any) -> RunConfig:
    """A checked RunConfig from the options given ({field: value}; None, False: not
    given). A field's bad value is one line naming its --option."""
    given = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()
             if v is not None and v is not False}
    unknown = [k for k in given if section_of(k) is None]
    if unknown:
        raise TypeError(f"build_config: no option field {', '.join(unknown)}")
    loaded = Plan.load(plan)
    repeat = repeated(given)   # as given: not the environment's defaults
    if "model_path" in given:   # a folder, or a Hub id in the local cache (zoplan.hubcache)
        given["model_path"] = str(model_folder(given["model_path"]))
    given = with_preset({**env_defaults(given), **given})
    try:
        check_given(given)
        _check_together(given)
        if "save_steps" in given:   # HF Trainer's name: --save-every N, steps only
            given["save_every"] = str(given.pop("save_steps"))
        check_report_to(given.get("report_to", "none"), given.get("out") or given.get("resume"))
        if "resume" in given or _restarted_by_torchrun(given.get("out"), loaded):
            return _resumed(Path(given.get("resume") or given["out"]), loaded, given,
                            plan_path=str(plan), repeat=repeat)
        _check_new_run(given)
        _claim(given.get("out"), given.get("overwrite", False),
               resume=resume_command(plan, given.get("out") or "DIR", repeat))
        if "steps" not in given and "trace" in given:
            given["steps"] = default_steps(loaded.step_time_s, traced=True)
        inputs = _fingerprints(given) if "out" in given else None
        return RunConfig.make(plan=loaded.data, plan_path=str(plan), **given, inputs=inputs,
                              notes=_lengths_note(loaded, given, inputs),
                              resume_cmd=resume_command(plan, given.get("out") or "DIR", repeat))
    except FieldError as exc:
        raise ZoError(option_error(exc)) from None
    except ValueError as exc:
        raise ZoError(str(exc)) from None
    except OSError as exc:   # a path the OS refuses (a name too long, a loop of links)
        raise ZoError(f"{exc.filename or 'a path given'}: {exc.strerror or exc}") from None


def _fingerprints(given: Values) -> Json | None:
    """run.json's inputs of a new run (None where an input is missing: preflight says so)."""
    try:
        return fingerprints(data=given.get("data", "synthetic"),
                            model=given.get("model_path") or "random")
    except OSError:
        return None


def _lengths_note(plan: Plan, given: Values, inputs: Json | None) -> tuple[str, ...]:
    """A line when the plan's step was priced from row lengths measured on other data
    than the run's (`zoplan optimize --lengths`): its prediction is then not this run's."""
    lengths = plan.workload.lengths
    data = given.get("data", "synthetic")
    if lengths is None or data == "synthetic" or not Path(data).exists():
        return ()
    have = inputs["data"]["sha256"] if inputs and inputs.get("data") else sha256_path(data)
    if have == lengths.data_sha256:
        return ()
    return (f"note: the plan prices rows measured on other data than {data} (lengths "
            f"sha256 {lengths.data_sha256[:12]}..., this file {have[:12]}...): its predicted "
            f"step is not this run's; measure this data with `zoexec lengths` and plan again",)


def _check_together(given: Values) -> None:
    """The options given that do not go together."""
    if "model_path" in given and "init" in given:
        raise ZoError("give either --model-path DIR or --init random, not both")
    if "resume" in given and given.get("overwrite"):
        raise ZoError("give either --resume DIR (continue the run) or --overwrite (replace it "
                      "with a new one), not both")
    if "resume" in given and "out" in given and Path(given["out"]) != Path(given["resume"]):
        raise ZoError("--resume DIR continues the run in DIR: give no other --out")
    if "save_steps" in given and "save_every" in given:
        raise ZoError("give either --save-every or --save-steps, not both")
    if "resume" not in given:   # a resume: with the run's own (_resumed)
        _check_eval(given)
    if "save_best" in given and "out" not in given and "resume" not in given:
        raise ZoError("--save-best writes OUT/best/: give --out DIR")
    if "eval_data" in given:
        need_input(given["eval_data"], what="--eval-data")


def _check_eval(given: Values) -> None:
    for name in ("eval_every", "eval_samples", "save_best"):
        if given.get(name) is not None and given.get("eval_data") is None:
            raise ZoError(f"--{name.replace('_', '-')} needs --eval-data FILE (the held-out "
                          f"data to evaluate)")


def _check_new_run(given: Values) -> None:
    for name in ("new_schedule", "accept_moved_inputs"):
        if name in given:
            raise ZoError(f"--{name.replace('_', '-')} changes a run being resumed: it needs "
                          f"--resume DIR")
    name = given.get("name", "text")
    if "data" not in given and name != "text":
        raise ZoError(f"--task {name} needs --data FILE (the built-in synthetic task is text)")
    task = TaskOptions(**{k: given[k] for k in TASK_FIELDS if k in given})
    best = given.get("save_best")
    reports = task.type.reports(task)
    if best and parse_best(best)[0] not in reports:
        raise ZoError(f"--save-best {best}: --task {task.name} reports {', '.join(reports)}")
    if "data" not in given and "eval_data" in given:
        raise ZoError("--eval-data needs --data FILE (the built-in synthetic task has no "
                      "held-out set)")


def _claim(out: str | None, overwrite: bool, *, resume: str) -> None:
    """A new run's folder: free, or emptied with --overwrite."""
    if out is None:
        if overwrite:
            raise ZoError("--overwrite needs --out DIR")
        return
    rundir = RunDir(out)
    rundir.check_own()
    if not rundir.holds_a_run:
        return
    rundir.check_free()
    if not overwrite:
        try:
            done = rundir.records()
            what = f"step {done[-1].step + 1} logged" if done else "no step logged"
        except ZoError:
            what = "its log is damaged"
        raise ZoError(f"{out} holds a run ({what}); resume it with: {resume}; or give "
                      f"--overwrite to replace it")
    rundir.clear()


def given_settings(given: Values) -> Values:
    """The settings run.json records (zoexec.run.folder.SETTINGS) as given: None where
    not given."""
    out = {key: given.get(key) for key in SETTINGS}
    out["init"] = given.get("model_path") or given.get("init")
    task = {k: given[k] for k in TASK_FIELDS if k in given}
    out["task"] = TaskOptions(**task).record() if task else None
    return out


def run_options_of(values: Values) -> Values:
    """RUN_KEPT's values of `values` as run.json records them (a path made absolute)."""
    out = {k: values[k] for k in RUN_KEPT if k in values}
    if out.get("eval_data") is not None:
        out["eval_data"] = str(Path(out["eval_data"]).resolve())
    return out


def _run_options(ident: Json, given: Values) -> tuple[Values, Values, str | None]:
    """A resume's evaluation, reporting and other run options (RUN_KEPT): run.json's
    (one it lacks, written before it was recorded: not recorded), those given instead;
    returns (the values in use, run.json's record of them, the line saying what changed)."""
    recorded = {k: ident[k] for k in RUN_KEPT if k in ident}
    wanted = run_options_of(given)
    use = {**{k: v for k, v in recorded.items() if v is not None}, **wanted}
    changed = [f"--{k.replace('_', '-')} {_shown(recorded[k])} -> {_shown(v)}"
               for k, v in wanted.items() if k in recorded and recorded[k] != v]
    line = (f"zoexec: this resume changes the run's {', '.join(changed)} (run.json records "
            f"the new values)" if changed else None)
    return use, {**recorded, **run_options_of(use)}, line


def _evaluation_missed(folder: Path, options: Values, start: int, total: int) -> bool:
    """A resume after the step `start - 1`, which evaluates (--eval-every, or the last),
    whose evaluation metrics.jsonl lacks (the run was killed before it): the resumed run
    evaluates first, as the uninterrupted one did."""
    every = options.get("eval_every")
    if options.get("eval_data") is None or start < 1 or not (
            start == total or (every is not None and start % every == 0)):
        return False
    try:
        lines = (folder / METRICS).read_text().splitlines()
    except OSError:
        return True
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            break   # a torn last line: the reporter cuts it
        if isinstance(row, dict) and row.get("step") == start and any(
                k.startswith("eval_") for k in row):
            return False
    return True


def _shown(value: object) -> str:
    return "none" if value is None else str(value)


def _resumed(folder: Path, plan: Plan, given: Values, *, plan_path: str,
             repeat: tuple[str, ...] = ()) -> RunConfig:
    """The config of a resume: every check of the run folder first (zoexec.run.folder),
    then the run's settings, inputs and checkpoint options, the steps (an extension:
    zoexec.run.extension.extend) and where it starts."""
    rundir = RunDir(folder)
    if not rundir.path.is_dir():
        raise ZoError(f"--resume {folder}: no such folder")
    rundir.check_free()
    start = rundir.resume_plan(plan_sha256=sha256_json(plan.data), given=given_settings(given),
                               accept_moved=given.get("accept_moved_inputs", False))
    ident = start.identity
    total = given.get("steps", ident["steps"])
    final = rundir.final()
    if start.start_step > total or (start.start_step == total and final and final[0] >= total):
        raise ZoError(f"{folder} has run all {start.start_step} steps; give --steps N (more "
                      f"than {start.start_step}) to train further")
    # start_step == total without a whole final/: killed while saving it; the resume
    # replays the log and writes final/
    ident, extended = extend(ident, steps=total, start_step=start.start_step,
                             new_schedule=given.get("new_schedule", False))
    options, record, changed = _run_options(ident, given)
    _check_eval(options)
    if options.get("eval_data") is not None and "eval_data" not in given:
        need_input(options["eval_data"], what="the run's --eval-data")
    check_report_to(options.get("report_to", "none"), folder)
    if options.get("save_best"):   # best/state.json read (and checked) before any rank starts
        BestMetric(*parse_best(options["save_best"]), folder)
    ident = {**ident, **record}
    first = _evaluation_missed(folder, options, start.start_step, total)
    kept = {k: ident[k] for k in SETTINGS if k not in ("init", "task")}
    kept.update(TaskOptions.record_fields(ident["task"]))
    if ident["init"] != "random":
        kept["model_path"] = ident["init"]
    if not {"save_every", "save_steps", "keep"} & given.keys():
        kept.update({k: ident[k] for k in KEPT if ident[k] is not None})
    elif "keep" not in given:
        kept["keep"] = ident["keep"]
    others = {k: v for k, v in given.items()
              if k not in (*SETTINGS, *TASK_FIELDS, *RUN_KEPT, "model_path", "init", "resume",
                           "out", "steps", "new_schedule", "accept_moved_inputs")}
    kept.update(options)
    return RunConfig.make(plan=plan.data, plan_path=plan_path, **{**others, **kept},
                          steps=total, out=str(folder), load_from=start.init,
                          start_step=start.start_step, replay=start.replay, resumed=True,
                          inputs=ident["inputs"], identity=ident, log_bytes=start.log_bytes,
                          history=start.history,
                          schedule=tuple(tuple(s) for s in ident["schedule"]),
                          extensions=tuple(ident["extensions"]),
                          resume_cmd=resume_command(plan_path, folder, repeat), evaluate_first=first, notes=(*start.notes, *([extended] if extended else []),
                                                *([changed] if changed else [])))


def _restarted_by_torchrun(out: str | None, plan: Plan) -> bool:
    """Under `torchrun --max-restarts`, a restarted job (TORCHELASTIC_RESTART_COUNT > 0)
    resumes its run folder by itself when it holds a run of this plan."""
    if out is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) < 1:
        return False
    rundir = RunDir(out)
    try:
        recorded: object = rundir.read_identity()["plan_sha256"]
        return recorded == sha256_json(plan.data)
    except ZoError:
        return False
