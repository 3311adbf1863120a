"""The run folder (zoexec.run.folder, zoexec.run.checkpoint): a strict-JSON log that survives a
torn last line, snapshots that count only when whole, a lock that keeps a second run
out, and the resume plan (which snapshot, which logged updates, which next step)."""

from __future__ import annotations

import json
import math
import multiprocessing

import pytest

from zoexec.config import RunConfig
from zoexec.maths.history import StepRecord
from zoexec.run.checkpoint import LossLog, read_log
from zoexec.run.folder import RunDir
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload


def _record(step: int, **kw) -> StepRecord:
    values = {"seed": 100 + step, "loss_plus": 2.0, "loss_minus": 1.0, "g": 500.0 + step,
              "lr": 1e-6, **kw}
    return StepRecord(step=step, **values)


def _log(rundir: RunDir, records) -> None:
    log = LossLog(rundir.path)
    for record in records:
        log.append(record)
    log.close()


def test_the_log_is_strict_json_and_round_trips(tmp_path):
    records = [_record(0), _record(1, loss_plus=math.nan, g=math.nan), _record(2, skipped=True)]
    _log(RunDir(tmp_path), records)
    lines = (tmp_path / "losses.jsonl").read_text().splitlines()
    parsed = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
              for line in lines]
    assert parsed[1]["loss_plus"] is None and parsed[1]["nonfinite"] is True
    assert parsed[2]["skipped"] is True and "skipped" not in parsed[0]
    assert parsed[0]["data_position"] == 0
    back = read_log(tmp_path / "losses.jsonl")
    assert [r.update for r in back] == [(100, 500.0, 1e-6), None, None]


def test_a_torn_last_line_is_cut_off(tmp_path):
    _log(RunDir(tmp_path), [_record(0), _record(1)])
    path = tmp_path / "losses.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"step": 2, "seed": 10')          # a crash mid-line
    assert [r.step for r in read_log(path)] == [0, 1]
    assert path.read_bytes() == whole


def _cfg(**kw) -> RunConfig:
    plan = hand_plan(model="tiny-opt", layout=Layout(),
                     workload=Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32"))
    return RunConfig.make(plan=plan.data, steps=10, lr=1e-3, **kw)


def _snapshot(rundir: RunDir, step: int, *, whole: bool = True) -> None:
    path = rundir.snapshot_path(step)
    path.mkdir(parents=True)
    if whole:
        (path / "state.json").write_text(json.dumps({"step": step}))


def test_resume_starts_from_the_newest_whole_snapshot_and_replays_the_rest(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(s) for s in range(7)] + [_record(7, skipped=True)])
    _snapshot(rundir, 2)
    _snapshot(rundir, 4)
    _snapshot(rundir, 6, whole=False)            # killed while writing it: not counted
    plan = rundir.resume_plan(plan_sha256="abc", given={})
    assert plan.snapshot_step == 4 and plan.init.endswith("step-000004")
    assert [u[0] for u in plan.replay] == [105, 106]       # steps 5 and 6; 7 was skipped
    assert plan.start_step == 8 and plan.settings["lr"] == 1e-3
    older = RunDir(tmp_path)
    older.prune(1)
    assert [s for s, _ in older.snapshots()] == [4]


def test_resume_without_a_snapshot_replays_from_the_initial_weights(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(init="random"), "abc")
    _log(rundir, [_record(0), _record(1)])
    plan = rundir.resume_plan(plan_sha256="abc", given={"lr": None, "seed": 0})
    assert plan.init == "random" and plan.snapshot_step is None and len(plan.replay) == 2


@pytest.mark.parametrize("given,match", [({"lr": 5.0}, r"--lr 5.0 differs from the run"),
                                         ({"seed": 3}, r"--seed 3 differs")])
def test_resume_refuses_other_settings(tmp_path, given, match):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    with pytest.raises(ZoError, match=match):
        rundir.resume_plan(plan_sha256="abc", given=given)


def test_resume_refuses_another_plan_or_no_run(tmp_path):
    with pytest.raises(ZoError, match="holds no run to resume"):
        RunDir(tmp_path).resume_plan(plan_sha256="abc", given={})
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    with pytest.raises(ZoError, match="was run with another plan"):
        rundir.resume_plan(plan_sha256="def", given={})


def _hold(path, ready, release) -> None:
    rundir = RunDir(path)
    rundir.lock()
    ready.set()
    release.wait(30)
    rundir.unlock()


def test_a_second_run_cannot_take_a_folder_in_use(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(tmp_path, ready, release))
    proc.start()
    try:
        assert ready.wait(30)
        with pytest.raises(ZoError, match=rf"is in use by another run \(pid {proc.pid}\)"):
            RunDir(tmp_path).lock()
    finally:
        release.set()
        proc.join(30)
    RunDir(tmp_path).check_free()                 # free again once the owner is gone


def test_a_finished_run_extended_with_more_steps_starts_from_its_final_weights(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(s) for s in range(10)])
    _snapshot(rundir, 7)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "state.json").write_text(json.dumps({"step": 9}))
    plan = rundir.resume_plan(plan_sha256="abc", given={})
    assert plan.snapshot_step == 9 and plan.init == str(tmp_path / "final")
    assert plan.replay == () and plan.start_step == 10


def test_pruning_removes_half_written_snapshots(tmp_path):
    rundir = RunDir(tmp_path)
    _snapshot(rundir, 3)
    half = tmp_path / "snapshots" / ".step-000005.tmp"      # killed while saving step 5
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"x" * 10)
    rundir.prune(2)
    assert not half.exists() and [s for s, _ in rundir.snapshots()] == [3]


def test_resume_refuses_another_schedule(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(lr_schedule="cosine", warmup_steps=2), "abc")
    with pytest.raises(ZoError, match=r"--lr-schedule linear differs from the run being resumed \(cosine\)"):
        rundir.resume_plan(plan_sha256="abc", given={"lr_schedule": "linear"})
    with pytest.raises(ZoError, match=r"--warmup-steps 3 differs"):
        rundir.resume_plan(plan_sha256="abc", given={"warmup_steps": 3})
    plan = rundir.resume_plan(plan_sha256="abc", given={"lr_schedule": "cosine", "warmup_steps": None})
    assert plan.settings["lr_schedule"] == "cosine" and plan.settings["warmup_steps"] == 2
