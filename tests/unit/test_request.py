"""`zoplan optimize`'s request (zoplan.request): one declaration per option, from which
the command line, the checks, --config / --print-config and the shared names derive;
and --max-gpu-memory, the option added as one field."""

from __future__ import annotations

import json
import typing

import pytest
import typer.main
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.configfile import read_mapping
from zoplan.errors import ZoError
from zoplan.names import ESTIMATORS, TUNING_CHOICES, TUNINGS
from zoplan.request import PlanRequest, all_fields, config_keys, flag_of
from zoplan.search import resolve_request, search

SMALL = ["--model", "tiny-opt", "--gpus", "2", "--profile", "cpu", "--batch", "4", "--seq", "32"]


def optimize(*args):
    return CliRunner().invoke(app, ["optimize", *args])


def test_the_names_of_tunings_and_estimators_are_declared_once():
    """zoexec's run configuration takes its Literal types from zoplan.names."""
    from zoexec.config import EstimatorOptions, TuningOptions
    from zoexec.fields import choices_of, option_fields

    for section, names in ((TuningOptions, TUNINGS), (EstimatorOptions, ESTIMATORS)):
        first = option_fields(section)[0]
        assert choices_of(first, typing.get_type_hints(section)[first.name]) == names
    tuning = next(f for _, f in all_fields() if f.name == "tuning")
    assert tuning.metadata["choices"] == TUNING_CHOICES == (*TUNINGS, "auto")


def test_every_option_of_optimize_is_a_field_and_every_field_an_option():
    command = typer.main.get_command(app).commands["optimize"]   # type: ignore[attr-defined]
    params = {p.name for p in command.params}
    assert params == {f.name for _, f in all_fields()} | {"config", "print_config"}
    for _, f in all_fields():
        assert f.metadata["help"] and flag_of(f).startswith("--")
    assert set(config_keys().values()) == {f.name for _, f in all_fields()}


@pytest.mark.parametrize("values, message", [
    ({"gpus": 2}, "--model is required: give it on the command line or as `model:` in --config"),
    ({"model": "tiny-opt", "gpus": 0}, "--gpus 0: must be a whole number >= 1"),
    ({"model": "tiny-opt", "gpus": 2, "tuning": "half"}, "--tuning must be one of full, lora"),
    ({"model": "tiny-opt", "gpus": 2, "max_gpu_memory": 0.0},
     "--max-gpu-memory 0.0: must be a finite number > 0"),
    ({"model": "tiny-opt", "gpus": 2, "lora_targets": ()},
     "--lora-targets '': must be at least one block module"),
    ({"model": "tiny-opt", "gpus": 2, "estimator": "sparse", "directions": 2},
     "--directions 2 with estimator 'sparse'"),
])
def test_a_bad_request_is_one_line_naming_the_option(values, message):
    with pytest.raises(ZoError, match=None) as err:
        PlanRequest.make(**values)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# ---- --max-gpu-memory ------------------------------------------------------------------------
def test_max_gpu_memory_plans_for_less_than_the_profile():
    """The memory check reads the capped device (fewer blocks stay resident, the plan's
    usable memory is the cap less the reserved share); a cap above the profile's changes
    nothing but the record."""
    args = dict(model="opt-1.3b", gpus=1, profile="dgx-a100-80gb", batch=16, seq=512)
    full = search(resolve_request(**args))
    capped = search(resolve_request(**args, max_gpu_memory=10.0))
    above = search(resolve_request(**args, max_gpu_memory=1000.0))
    reserved = capped.request.profile.figures().device.reserved_gib
    assert capped.winner.memory.gpu_limit_bytes == (10.0 - reserved) * 2**30
    assert capped.winner.memory.gpu_bytes <= capped.winner.memory.gpu_limit_bytes
    assert 0 < capped.winner.num_resident < full.winner.num_resident == 24
    assert above.winner.memory == full.winner.memory and above.winner.label == full.winner.label
    assert capped.request.profile == full.request.profile   # pricing reads the profile


def test_max_gpu_memory_is_recorded_in_the_plan_and_refuses_what_cannot_fit(tmp_path):
    out = tmp_path / "plan.json"
    result = optimize(*SMALL, "--max-gpu-memory", "3", "-q", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["search"]["fixed"]["max_gpu_memory"] == 3.0
    result = optimize(*SMALL, "--max-gpu-memory", "0.01", "-q", "-o", str(tmp_path / "n.json"))
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "does not fit" in result.output and not (tmp_path / "n.json").exists()


# ---- --update-kernel -------------------------------------------------------------------------
def test_update_kernel_fused_prices_the_fused_pass_and_refuses_what_it_cannot_run():
    """--update-kernel fused: every candidate's workload carries it (zoexec run's
    --zo-kernel auto reads it there) and the update task is the fused pass's, shorter than
    the torch path's; LoRA (and the other estimators) are refused in one line."""
    args = dict(model="opt-1.3b", gpus=1, profile="hgx-h200", batch=8, seq=512,
                precision="bf16", update="stochastic", placement="host")
    torch_path = search(resolve_request(**args))
    fused = search(resolve_request(**args, update_kernel="fused"))
    assert {c.workload.update_kernel for c in fused.ranked} == {"fused"}
    assert torch_path.winner.workload.update_kernel == "torch"
    assert fused.winner.step_time_s < torch_path.winner.step_time_s
    with pytest.raises(ZoError, match=r"^--update-kernel fused: .*LoRA") as err:
        resolve_request(**args | {"update": None}, update_kernel="fused", tuning="lora")
    assert "\n" not in str(err.value)


# ---- --config, --print-config ------------------------------------------------------------
def test_print_config_reads_back_to_the_same_plan(tmp_path):
    """--print-config writes every option of the request; --config FILE makes the same
    plan, byte for byte, as the command line it came from; the command line overrides
    the file."""
    given = [*SMALL, "--tuning", "lora", "--lora-r", "4", "--estimator", "lowrank",
             "--lowrank-rank", "3"]
    printed = optimize(*given, "--print-config")
    assert printed.exit_code == 0, printed.output
    (tmp_path / "req.yaml").write_text(printed.output)
    data = read_mapping(tmp_path / "req.yaml")
    assert data["lora-r"] == 4 and data["lora-targets"] == ["q_proj", "v_proj"]
    assert data["model"] == "tiny-opt" and "out" not in data
    (tmp_path / "req.json").write_text(json.dumps(data))
    plans = {}
    for name, args in (("flags", given), ("yaml", ["--config", str(tmp_path / "req.yaml")]),
                       ("json", ["--config", str(tmp_path / "req.json")])):
        out = tmp_path / f"{name}.json"
        result = optimize(*args, "-q", "-o", str(out))
        assert result.exit_code == 0, result.output
        plans[name] = out.read_bytes()
    assert plans["flags"] == plans["yaml"] == plans["json"]
    over = optimize("--config", str(tmp_path / "req.yaml"), "--lora-r", "2", "--print-config")
    assert "lora-r: 2\n" in over.output and "lowrank-rank: 3\n" in over.output


@pytest.mark.parametrize("text, message", [
    ("model: tiny-opt\nlora_rr: 4\n", "unknown option 'lora_rr' (did you mean 'lora_r'?)"),
    ("model: tiny-opt\nbatch: sixteen\n", "batch must be a whole number, got 'sixteen'"),
    ("model: tiny-opt\nbatch: 4\nbatch_: 4\n", "unknown option 'batch_' (did you mean 'batch'?)"),
    ("model: tiny-opt\nlora-r: 4\nlora_r: 4\n", "'lora_r' and 'lora-r' are the same option"),
    ("- model\n", "must be a mapping of option names to values"),
    ("model: [tiny\n", "not valid YAML (line"),
    ("model: tiny-opt\nplacement: gpu\n", "--placement must be one of auto, host, got 'gpu'"),
])
def test_a_bad_config_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "req.yaml"
    path.write_text(text)
    result = optimize("--config", str(path), "--gpus", "2", "-q", "-o", str(tmp_path / "p.json"))
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "p.json").exists()


def test_a_missing_config_file_is_one_line(tmp_path):
    result = optimize("--config", str(tmp_path / "none.yaml"), "--gpus", "2")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "none.yaml does not exist" in result.output
