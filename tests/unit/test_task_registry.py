"""The task types' registry (zoexec.data.tasktypes) and the one declaration of the task
settings (zoexec.data.section.TaskOptions): what the CLI, the presets, the metrics
table, run.json and a resume read from them."""

from __future__ import annotations

import pytest

from zoexec.config import KEPT, SETTINGS, TASK_FIELDS, CheckpointOptions, RunConfig
from zoexec.data.presets import PRESETS
from zoexec.data.section import COMMON, TaskOptions, read_by
from zoexec.data.tasktypes import METRICS, TASK_TYPES
from zoexec.fields import FieldError, option_fields
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

CLS = dict(name="classification", template="{sentence} It was", label_words=("bad", "good"))


def test_every_task_option_is_read_by_a_type_and_every_read_one_is_declared():
    declared = {f.name for f in option_fields(TaskOptions)}
    read = {name for t in TASK_TYPES.values() for name in (*read_by(t), *t.extras)}
    assert read <= declared
    assert set(TASK_FIELDS) - {"name", "task_preset"} == read   # none left over, none missing
    assert set(COMMON) | read == declared


def test_the_cli_presets_and_metrics_come_from_the_registry():
    name = next(f for f in option_fields(TaskOptions) if f.name == "name")
    assert name.metadata["choices"] == tuple(TASK_TYPES)
    assert all(f"{t.name} ({t.help})" in name.metadata["help"] for t in TASK_TYPES.values())
    assert {p.values["name"] for p in PRESETS.values()} <= set(TASK_TYPES)
    assert set(METRICS) == {m for t in TASK_TYPES.values() for m in t.metrics}
    assert all(t.metrics[0] == "eval_loss" for t in TASK_TYPES.values())
    assert CheckpointOptions(save_best="eval_accuracy_norm").best == ("eval_accuracy_norm", True)


def test_what_a_resume_keeps_comes_from_the_fields():
    assert set(SETTINGS) == {"seed", "lr", "eps", "weight_decay", "data", "init", "lr_schedule",
                             "warmup_steps", "task"}
    assert KEPT == ("save_every", "save_steps", "keep")
    plan = hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8)).data
    cfg = RunConfig.make(plan=plan, data="d.jsonl", seed=3, lr=1e-4, **CLS)
    settings = cfg.settings()
    assert set(settings) == set(SETTINGS)
    assert (settings["seed"], settings["lr"], settings["data"], settings["init"]) == \
        (3, 1e-4, "d.jsonl", "random")
    assert settings["task"] == cfg.task.record()


def test_an_option_the_task_type_does_not_read_is_refused():
    with pytest.raises(ZoError, match=r"--answer-column a is one of the options of --task "
                                      r"generation, not of --task classification"):
        TaskOptions(**CLS, answer_column="a")
    with pytest.raises(ZoError, match="--label-words a,b is one of the options of --task "
                                      "classification, not of --task completion"):
        TaskOptions(name="completion", label_words=("a", "b"))
    TaskOptions(**CLS, label_column="y", demonstrations=1, eval_samples=4)   # all read


def test_the_record_holds_the_type_s_options_and_what_is_set():
    record = TaskOptions(**CLS, demonstrations=2).record()
    assert record == {"name": "classification", "template": "{sentence} It was",
                      "label_words": ["bad", "good"], "label_column": "label",
                      "classification_loss": "candidates", "demonstrations": 2}
    assert TaskOptions.from_record(record) == TaskOptions(**CLS, demonstrations=2)
    # an older run recorded every demonstration option: the same task
    older = {**record, "demonstrations_in_training": False, "demonstrations_seed": 0,
             "demonstrations_data": None}
    assert TaskOptions.from_record(older) == TaskOptions.from_record(record)


def test_a_resume_with_the_task_given_as_an_older_run_recorded_it(tmp_path):
    """A run recorded by an older zoexec (every demonstration option listed) resumes
    with the same task options given; another demonstrations seed is refused."""
    from zoexec.options import given_settings
    from zoexec.run.folder import RunDir

    plan = hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8))
    rundir = RunDir(tmp_path)
    cfg = RunConfig.make(plan=plan.data, data="d.jsonl", **CLS, demonstrations=2)
    ident = rundir_identity(cfg)
    ident["task"] = {**ident["task"], "demonstrations_in_training": False,
                     "demonstrations_seed": 0, "demonstrations_data": None}
    rundir.write_sealed(ident)
    same = given_settings({**CLS, "demonstrations": 2})["task"]
    assert rundir.resume_plan(plan_sha256="abc", given={"task": same}).settings["task"] == ident["task"]
    other = given_settings({**CLS, "demonstrations": 2, "demonstrations_seed": 5})["task"]
    with pytest.raises(ZoError, match="differs from the run being resumed"):
        rundir.resume_plan(plan_sha256="abc", given={"task": other})


def rundir_identity(cfg: RunConfig) -> dict:
    from zoexec.run.folder import identity_of

    return identity_of(cfg, "abc", z=None)


def test_field_checks_and_type_checks_are_one_each():
    """A value outside a field's set is the field's FieldError (named by the CLI as the
    option); options that do not go together are the type's ZoError."""
    with pytest.raises(FieldError, match="choice_score must be one of mean, sum"):
        TaskOptions(name="multiple-choice", template="{q}", choices=("a", "b"), choice_score="max")
    with pytest.raises(ZoError, match="two or more templates"):
        TaskOptions(name="multiple-choice", template="{q}", choices=("a",))
