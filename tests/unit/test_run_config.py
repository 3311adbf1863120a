"""One declaration per option: `zoexec run`'s options, defaults, help and checks come
from zoexec.config's fields (the generated command is compared with them), HF
Trainer's names give the same RunConfig, and bad values are one `error:` line."""

from __future__ import annotations

import pickle
import typing

import pytest
import typer
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.config import (
    SECTIONS,
    EvalOptions,
    FieldError,
    OptimOptions,
    RunConfig,
    field_named,
    flag_of,
    option_fields,
)
from zoexec.flags import given, shown_default
from zoexec.options import build_config
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

runner = CliRunner()
WORKLOAD = Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32")
PANELS = ("Model", "Data and task", "Optimisation", "Run folder and checkpoints",
          "Logging and evaluation", "Runtime")
ENV_OPTIONS = {"--timeout-s": "ZOEXEC_TIMEOUT_S", "--stop-grace-s": "ZOEXEC_STOP_GRACE_S",
               "--shm-dir": "ZOEXEC_SHM_DIR", "--start-method": "ZOEXEC_START_METHOD",
               "--debug": "ZOEXEC_DEBUG"}


COMMAND_OWN = ("plan", "config", "print_config")   # zoexec run's own, not a field's


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def _plan(tmp_path) -> str:
    path = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=Layout(), workload=WORKLOAD).save(path)
    return str(path)


def _parsed(plan: str, *args: str) -> dict:
    """The options `zoexec run PLAN args` gives, as the command hands them on."""
    ctx = _command("run").make_context("run", [plan, *args])
    return given({k: v for k, v in ctx.params.items() if k not in COMMAND_OWN})


def test_every_run_option_is_a_config_field_and_every_field_an_option():
    params = [p for p in _command("run").params if p.name not in (*COMMAND_OWN, "help")]
    fields = [f for section in SECTIONS.values() for f in option_fields(section)]
    assert len({f.name for f in fields}) == len(fields), "two sections share a field name"
    assert sorted(p.name for p in params) == sorted(f.name for f in fields)
    for param in params:
        f = field_named(param.name)
        assert param.opts[0] == flag_of(f), param.opts
        assert set(param.opts) == {flag_of(f), *f.metadata["aliases"]}, param.opts
        assert param.help == f.metadata["help"], param.name
        assert param.show_default == shown_default(f), param.name
        # the default lives in the field: the option's says "not given"
        assert param.default in (None, False), (param.name, param.default)


def test_the_builder_takes_every_default_from_the_fields(tmp_path):
    cfg = build_config(plan=_plan(tmp_path))
    for name, section in SECTIONS.items():
        for f in option_fields(section):
            assert getattr(getattr(cfg, name), f.name) == f.default, (name, f.name)


def test_shown_defaults_are_the_fields():
    assert shown_default(field_named("lr")) == "1e-06"
    assert shown_default(field_named("save_every")) == "30m"
    assert shown_default(field_named("model_path")) is False      # None: the help says it
    assert shown_default(field_named("timeout_s")) == "$ZOEXEC_TIMEOUT_S or 600.0"


@pytest.mark.parametrize("alias,primary,value", [
    ("--learning-rate", "--lr", "0.01"), ("--learning_rate", "--lr", "0.01"),
    ("--max-steps", "--steps", "7"), ("--max_steps", "--steps", "7"),
    ("--output-dir", "--out", "OUT"), ("--output_dir", "--out", "OUT"),
    ("--save-total-limit", "--keep", "5"), ("--save_total_limit", "--keep", "5"),
    ("--logging-steps", "--log-every", "3"), ("--logging_steps", "--log-every", "3"),
    ("--eval-steps", "--eval-every", "3"), ("--eval_steps", "--eval-every", "3"),
    ("--lr-scheduler-type", "--lr-schedule", "cosine"),
    ("--lr_scheduler_type", "--lr-schedule", "cosine"),
    ("--warmup_steps", "--warmup-steps", "2"), ("--weight_decay", "--weight-decay", "0.1"),
    ("--save-steps", "--save-every", "4"), ("--save_steps", "--save-every", "4")])
def test_hf_trainer_names_give_the_same_config(tmp_path, alias, primary, value):
    plan = _plan(tmp_path)
    if "OUT" in value:
        value = str(tmp_path / "out")
    extra = ["--eval-data", plan] if "eval" in primary else []   # --eval-every needs it
    extra += ["--data", str(tmp_path / "d.jsonl")] if extra else []
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    by_alias = build_config(plan=plan, **_parsed(plan, alias, value, *extra))
    by_name = build_config(plan=plan, **_parsed(plan, primary, value, *extra))
    assert by_alias == by_name
    if primary == "--save-every":   # --save-steps: steps only, as --save-every N
        assert by_alias.checkpoint.every_steps == int(value) and by_alias.checkpoint.every_s is None


def test_help_groups_the_options_in_panels_and_names_the_environment():
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for panel in PANELS:
        assert f" {panel} " in result.output, panel
    for option, env in ENV_OPTIONS.items():
        assert option in result.output and f"${env}" in result.output, option
    assert "[constant|linear|cosine]" in result.output        # a fixed set shows its values


def test_the_environment_is_a_default_an_option_overrides(tmp_path, monkeypatch):
    plan = _plan(tmp_path)
    monkeypatch.setenv("ZOEXEC_TIMEOUT_S", "7")
    monkeypatch.setenv("ZOEXEC_DEBUG", "1")
    monkeypatch.setenv("ZOEXEC_START_METHOD", "spawn")
    cfg = build_config(plan=plan)
    assert (cfg.runtime.timeout_s, cfg.runtime.debug, cfg.runtime.start_method) == (7.0, True, "spawn")
    assert build_config(plan=plan, **_parsed(plan, "--timeout-s", "9")).runtime.timeout_s == 9.0
    monkeypatch.setenv("ZOEXEC_TIMEOUT_S", "soon")
    with pytest.raises(Exception, match=r"\$ZOEXEC_TIMEOUT_S 'soon': not a float"):
        build_config(plan=plan)


def _one_error_line(args: list[str], *, match: str) -> None:
    result = runner.invoke(app, args)
    text = result.output.strip()
    assert result.exit_code == 2, text
    assert text.startswith("error:") and "\n" not in text and "Traceback" not in text, text
    assert match in text, text


@pytest.mark.parametrize("args,match", [
    (["--lr-schedule", "foo"], "--lr-schedule foo: must be one of constant, linear, cosine"),
    (["--lr-scheduler-type", "foo"], "--lr-schedule foo: must be one of"),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--max-steps", "0"], "--steps 0: must be >= 1"),
    (["--on-nonfinite", "retry"], "--on-nonfinite retry: must be one of stop, skip"),
    (["--report-to", "comet"], "--report-to comet: must be one of none, tensorboard, wandb, mlflow"),
    (["--save-every", "soon"], "--save-every soon: must be N steps (500) or a duration"),
    (["--save-every", "5", "--save-steps", "5"], "either --save-every or --save-steps"),
    (["--timeout-s", "0"], "--timeout-s 0.0: must be a finite number > 0"),
    (["--start-method", "thread"], "--start-method thread: must be one of forkserver"),
    (["--log-every", "0"], "--log-every 0: must be >= 1"),
    (["--lr", "-1"], "--lr -1.0: must be a finite number >= 0"),
    (["--warmup-steps", "10", "--steps", "10"], "--warmup-steps 10: must be < steps (10)")])
def test_a_bad_value_is_one_line_naming_the_option(tmp_path, args, match):
    out = tmp_path / "out"
    _one_error_line(["run", _plan(tmp_path), *args, "--out", str(out)], match=match)
    assert not out.exists()


def test_eval_shares_the_task_options_and_checks_its_own(tmp_path):
    run_task = {p.name for p in _command("run").params if p.name in (
        "name", "text_column", "template", "label_words")}
    eval_params = {p.name: p for p in _command("eval").params}
    assert run_task <= eval_params.keys()
    assert eval_params["eval_batch"].opts[:2] == ["--eval-batch", "--batch"]
    assert eval_params["precision"].opts[:2] == ["--precision", "--dtype"]
    assert {f.name for f in option_fields(EvalOptions)} <= eval_params.keys()
    (tmp_path / "model").mkdir()
    _one_error_line(["eval", str(tmp_path / "model"), "--data", "d.jsonl", "--seq", "0"],
                    match="--seq 0: must be >= 2")
    _one_error_line(["eval", str(tmp_path / "model"), "--data", "d.jsonl", "--batch", "0"],
                    match="--eval-batch 0: must be >= 1")
    _one_error_line(["eval", str(tmp_path / "model"), "--data", "d.jsonl", "--dtype", "fp8"],
                    match="--precision fp8: must be one of fp32, bf16, fp16")


def test_a_field_error_names_the_field_and_the_value():
    with pytest.raises(FieldError, match=r"^steps must be >= 1, got 0$") as caught:
        OptimOptions(steps=0)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(FieldError, match="lr_schedule must be one of constant, linear, cosine, "
                                         "got 'foo'"):
        OptimOptions(lr_schedule="foo")


def test_the_config_is_frozen_and_pickles(tmp_path):
    cfg = build_config(plan=_plan(tmp_path), lr=0.5, label_words=None)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(Exception, match="cannot assign"):
        cfg.optim.lr = 1.0
    assert cfg.replaced(lr=0.25, run_id="x").optim.lr == 0.25
    assert typing.get_type_hints(RunConfig)["optim"] is OptimOptions
