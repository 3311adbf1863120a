"""--zo-kernel counter end to end (one rank, tiny-opt, bf16 weights with stochastic rounding
and weight decay): run.json records the path; a run killed while it wrote final/
resumes from its snapshot plus the log to the same bits (the replay applies two logged
updates in one counter pass); a resume on another path is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

SETTINGS = ["--lr", "1e-3", "--weight-decay", "0.1", "--seed", "7", "--save-every", "2", "-q"]
ONE_THREAD = ["--threads", "1"]   # tiny tensors: more threads only wait on each other


def _zoexec(*args):
    return CliRunner().invoke(app, ["run", *map(str, args)])


def _final(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def counter_run(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("counter")
    plan = folder / "plan.json"
    workload = Workload(batch=2, seq=16, param_dtype="bf16", compute_dtype="bf16",
                        update="stochastic")
    hand_plan(model="tiny-opt", layout=Layout(), workload=workload).save(plan)
    out = folder / "run"
    done = _zoexec(plan, "--out", out, "--steps", "4", "--zo-kernel", "counter", *SETTINGS,
                   *ONE_THREAD)
    assert done.exit_code == 0, done.output
    return plan, out


def test_run_json_records_the_path(counter_run):
    _, out = counter_run
    assert json.loads((out / "run.json").read_text())["z"]["zo_kernel"] == "counter"


def test_a_resume_replays_the_log_through_the_counter_pass_exactly(counter_run, tmp_path):
    plan, reference = counter_run
    out = tmp_path / "unsaved"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")               # the snapshot of step 1 and the log are left
    done = _zoexec(plan, "--resume", out, "--zo-kernel", "counter", "-q", *ONE_THREAD)
    assert done.exit_code == 0, done.output
    want, got = _final(reference), _final(out)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_a_resume_on_another_path_is_refused_in_one_line(counter_run, tmp_path):
    plan, reference = counter_run
    out = tmp_path / "other"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")
    done = _zoexec(plan, "--resume", out, "-q", *ONE_THREAD)   # auto: torch on the CPU
    assert done.exit_code != 0
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and "--zo-kernel counter" in lines[0], done.output
    assert not (out / "final").exists()
