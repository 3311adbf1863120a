"""The run folder (zoexec.run.folder, zoexec.run.checkpoint, zoexec.run.verify): a
strict-JSON log that survives a torn last line, snapshots that count only when whole
and whose checksums hold, a lock that keeps a second run out, the resume plan (which
snapshot, which logged updates, which next step), and what a resume checks: seeds and
lrs of the log, run.json's seal, extensions of the steps, the devices that draw z, the
nodes' copies."""

from __future__ import annotations

import json
import math
import multiprocessing

import pytest

from zoexec.config import RunConfig
from zoexec.maths.history import StepRecord, Update
from zoexec.maths.zo import step_seed
from zoexec.model.saved import check_saved, folder_checksums
from zoexec.run.checkpoint import LossLog, read_log
from zoexec.run.extension import extend
from zoexec.run.folder import RunDir, histories, logged_lr
from zoexec.run.verify import DATA_ORDER, binding, fingerprints, z_problem
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload


def _record(step: int, **kw) -> StepRecord:
    """Step `step` of a run of seed 0 and lr 1e-3 (the seed rule's seed)."""
    values = {"seed": step_seed(0, step), "loss_plus": 2.0, "loss_minus": 1.0,
              "g": 500.0 + step, "lr": 1e-3, **kw}
    return StepRecord(step=step, **values)


def _log(rundir: RunDir, records) -> None:
    log = LossLog(rundir.path, history=rundir.run_digest or "")
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
    assert [line["step"] for line in parsed] == [1, 2, 3]   # steps done, as metrics.jsonl
    back = read_log(tmp_path / "losses.jsonl")
    assert [r.update for r in back] == [Update(step=0, seed=step_seed(0, 0), g=500.0, lr=1e-3),
                                        None, None]


def test_a_torn_last_line_is_left_out_and_cut_off_only_when_the_run_resumes(tmp_path):
    _log(RunDir(tmp_path), [_record(0), _record(1)])
    path = tmp_path / "losses.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"step": 2, "seed": 10')          # a crash mid-line
    assert [r.step for r in read_log(path)] == [0, 1]
    assert path.read_bytes() != whole                              # reading changes nothing
    LossLog(tmp_path, keep_bytes=len(whole)).close()               # the resumed run's log
    assert path.read_bytes() == whole


def test_a_bad_whole_line_anywhere_is_refused(tmp_path):
    _log(RunDir(tmp_path), [_record(0), _record(1), _record(2)])
    path = tmp_path / "losses.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{oops\n" + lines[2])
    with pytest.raises(ZoError, match=r"losses.jsonl:2 is not a step record"):
        read_log(path)


def _cfg(**kw) -> RunConfig:
    plan = hand_plan(model="tiny-opt", layout=Layout(),
                     workload=Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32"))
    return RunConfig.make(plan=plan.data, steps=10, lr=1e-3, **kw)


def _snapshot(rundir: RunDir, step: int, *, whole: bool = True, path=None) -> None:
    """A saved weights folder as zoexec.run.loop writes one after `step` steps: its
    files and their sha256."""
    path = path or rundir.snapshot_path(step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(bytes(range(step, step + 64)))
    if whole:
        done = histories(rundir.run_digest or "", read_log(rundir.log_path))
        history = done[step - 1] if step <= len(done) else ""
        state = {**binding(run_digest=rundir.run_digest, step=step, history=history),
                 "files": folder_checksums(path)}
        (path / "state.json").write_text(json.dumps(state))


def test_resume_starts_from_the_newest_whole_snapshot_and_replays_the_rest(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(s) for s in range(7)] + [_record(7, skipped=True)])
    _snapshot(rundir, 3)
    _snapshot(rundir, 5)
    _snapshot(rundir, 7, whole=False)            # killed while writing it: not counted
    plan = rundir.resume_plan(plan_sha256="abc", given={})
    assert plan.snapshot_step == 5 and plan.init.endswith("checkpoint-5")
    assert [u.seed for u in plan.replay] == [step_seed(0, 5), step_seed(0, 6)]   # 8 was skipped
    assert plan.start_step == 8 and plan.settings["lr"] == 1e-3
    older = RunDir(tmp_path)
    older.prune(1)
    assert [s for s, _ in older.snapshots()] == [5]


def _older_folder(rundir: RunDir, steps: int, saved: tuple[int, ...]) -> None:
    """A run folder as a zoexec before steps counted from 1 left it: its log's steps from
    0, snapshots step-NNNNNN named (and state.json "step") by the last step's index."""
    records = [_record(s) for s in range(steps)]
    rundir.log_path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    done = histories(rundir.run_digest, records)
    for index in saved:
        path = rundir.path / "snapshots" / f"step-{index:06d}"
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(bytes(range(index, index + 64)))
        state = {"step": index, "run_digest": rundir.run_digest, "history_sha256": done[index],
                 "files": folder_checksums(path)}
        (path / "state.json").write_text(json.dumps(state))


def test_a_folder_of_an_older_zoexec_resumes_exactly_and_keeps_its_log_s_numbering(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _older_folder(rundir, 7, saved=(2, 4))    # after 3 and 5 steps
    assert [s for s, _ in rundir.snapshots()] == [3, 5]
    plan = rundir.resume_plan(plan_sha256="abc", given={})
    assert plan.snapshot_step == 5 and plan.init.endswith("step-000004")
    assert [u.seed for u in plan.replay] == [step_seed(0, 5), step_seed(0, 6)]
    assert plan.start_step == 7
    log = LossLog(tmp_path, keep_bytes=plan.log_bytes, history=plan.history, start_step=7)
    log.append(_record(7))                    # the resumed run's first step: the 8th
    log.close()
    assert json.loads(rundir.log_path.read_text().splitlines()[-1])["step"] == 7   # its numbering
    assert [r.step for r in read_log(rundir.log_path)] == list(range(8))
    _snapshot(rundir, 8)                      # the resumed run's snapshot: checkpoint-8
    again = RunDir(tmp_path).resume_plan(plan_sha256="abc", given={})
    assert again.init.endswith("checkpoint-8") and again.replay == () and again.start_step == 8
    rundir.prune(1)
    assert [p.name for _, p in rundir.snapshots()] == ["checkpoint-8"]


def test_an_older_snapshot_named_for_another_step_is_refused(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _older_folder(rundir, 7, saved=(2,))
    (tmp_path / "snapshots" / "step-000002").rename(tmp_path / "snapshots" / "step-000004")
    with pytest.raises(ZoError, match=r"step-000004/state.json records step 3, but its folder "
                                      r"is named for step 5"):
        rundir.resume_plan(plan_sha256="abc", given={})


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


def test_one_owner_when_a_lock_file_is_opened_as_its_owner_lets_go(tmp_path, monkeypatch):
    """The race of issue 41: B opens the lock file while A holds it; A lets go (its file
    unlinked); C creates a new lock file and takes it; then B's flock on the old file
    succeeds. B must not own the folder too: it finds its file is no longer the
    folder's, tries the path again and meets C's lock."""
    import threading

    from zoexec.run import folder as folder_module

    real_flock, opened, go = folder_module.fcntl.flock, threading.Event(), threading.Event()

    def flock(handle, how):
        if threading.current_thread().name == "B" and not go.is_set():
            opened.set()
            assert go.wait(30)
        return real_flock(handle, how)

    monkeypatch.setattr(folder_module.fcntl, "flock", flock)
    a, b, c = RunDir(tmp_path), RunDir(tmp_path), RunDir(tmp_path)
    a.lock()
    outcome: list = []

    def take_b() -> None:
        try:
            b.lock()
            outcome.append("owns")
        except ZoError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=take_b, name="B")
    thread.start()
    assert opened.wait(30)     # B has the old file open, not yet locked
    a.unlock()
    c.lock()                   # C: the path's file now
    go.set()
    thread.join(30)
    assert outcome and "is in use by another run" in outcome[0], outcome
    c.unlock()
    assert not (tmp_path / ".lock").exists()
    b.lock()                   # free again: B takes it
    b.unlock()


def test_a_finished_run_extended_with_more_steps_starts_from_its_final_weights(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(s) for s in range(10)])
    _snapshot(rundir, 8)
    _snapshot(rundir, 10, path=tmp_path / "final")
    plan = rundir.resume_plan(plan_sha256="abc", given={})
    assert plan.snapshot_step == 10 and plan.init == str(tmp_path / "final")
    assert plan.replay == () and plan.start_step == 10


def test_a_damaged_snapshot_is_passed_over_for_the_one_before_and_the_log(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(s) for s in range(7)])
    _snapshot(rundir, 3)
    _snapshot(rundir, 6)
    shard = rundir.snapshot_path(6) / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    assert "model.safetensors changed" in check_saved(rundir.snapshot_path(6))
    plan = rundir.resume_plan(plan_sha256="abc", given={})
    assert plan.snapshot_step == 3 and [u.seed for u in plan.replay] == [step_seed(0, s)
                                                                       for s in (3, 4, 5, 6)]
    assert len(plan.notes) == 1 and "checkpoint-6 is damaged" in plan.notes[0]


def test_a_logged_seed_or_lr_off_the_run_s_rule_is_refused(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(0), _record(1, seed=step_seed(0, 1) + 1)])
    with pytest.raises(ZoError, match=r"losses.jsonl:2: step 2 has seed .* seed rule gives"):
        rundir.resume_plan(plan_sha256="abc", given={})
    (tmp_path / "losses.jsonl").unlink()
    _log(rundir, [_record(0), _record(1, lr=2e-3)])
    with pytest.raises(ZoError, match=r"losses.jsonl:2: step 2 has lr 0.002, but the run's "
                                      r"schedule gives 0.001"):
        rundir.resume_plan(plan_sha256="abc", given={})


def test_an_edited_run_json_is_refused(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    path = tmp_path / "run.json"
    path.write_text(path.read_text().replace('"seed": 0', '"seed": 1'))
    with pytest.raises(ZoError, match="run.json was edited after the run started"):
        rundir.resume_plan(plan_sha256="abc", given={})


def test_extending_a_constant_schedule_continues_a_decaying_one_needs_a_new_schedule():
    ident = {"steps": 10, "lr": 1e-3, "lr_schedule": "constant", "warmup_steps": 2,
             "schedule": [[0, 10]], "extensions": []}
    same, line = extend(ident, steps=20, start_step=10, new_schedule=False)
    assert same["schedule"] == [[0, 20]] and "the constant lr 0.001 continues" in line
    assert same["extensions"] == [{"at_step": 10, "from_steps": 10, "to_steps": 20,
                                   "new_schedule": False}]
    cosine = {**ident, "lr_schedule": "cosine"}
    with pytest.raises(ZoError, match=r"--steps 20: the run's cosine schedule decays over 10 "
                                      r"steps .* give --new-schedule"):
        extend(cosine, steps=20, start_step=6, new_schedule=False)
    new, line = extend(cosine, steps=20, start_step=6, new_schedule=True)
    assert new["schedule"] == [[0, 10], [6, 20]] and "a new cosine schedule after step 6" in line
    # steps before 6 keep the old schedule's lr; from 6 a cosine restarts at lr over 14 steps
    assert logged_lr(new, 5) == logged_lr(cosine, 5) and logged_lr(new, 6) == 1e-3
    assert logged_lr(new, 13) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 7 / 14)))
    assert extend(cosine, steps=10, start_step=6, new_schedule=False) == (cosine, None)


def test_the_devices_that_draw_z_must_be_the_run_s_and_one_model():
    cpu = {"device_kind": "cpu", "torch": "2.13.0"}
    h100 = {"device_kind": "cuda", "torch": "2.13.0", "device": "H100", "sm_count": 132}
    a100 = {**h100, "device": "A100", "sm_count": 108}
    assert z_problem([cpu, cpu], recorded=cpu, resumed=True, local_ranks=1) is None
    assert "rank 1 (node 0) would draw z on torch 2.14.0 (the run's: 2.13.0)" in z_problem(
        [cpu, {**cpu, "torch": "2.14.0"}], recorded=cpu, resumed=True, local_ranks=2)
    assert "rank 2 (node 1) has device A100 (rank 0's: H100)" in z_problem(
        [h100, h100, a100, a100], recorded=None, resumed=False, local_ranks=2)


def test_pruning_removes_half_written_snapshots(tmp_path):
    rundir = RunDir(tmp_path)
    _snapshot(rundir, 3)
    half = tmp_path / "snapshots" / ".checkpoint-5.tmp"      # killed while saving step 5
    older = tmp_path / "snapshots" / ".step-000005.tmp"      # an older zoexec's
    for folder in (half, older):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 10)
    rundir.prune(2)
    assert not half.exists() and not older.exists()
    assert [s for s, _ in rundir.snapshots()] == [3]


def test_resume_refuses_another_schedule(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(lr_schedule="cosine", warmup_steps=2), "abc")
    with pytest.raises(ZoError, match=r"--lr-schedule linear differs from the run being resumed \(cosine\)"):
        rundir.resume_plan(plan_sha256="abc", given={"lr_schedule": "linear"})
    with pytest.raises(ZoError, match=r"--warmup-steps 3 differs"):
        rundir.resume_plan(plan_sha256="abc", given={"warmup_steps": 3})
    plan = rundir.resume_plan(plan_sha256="abc", given={"lr_schedule": "cosine", "warmup_steps": None})
    assert plan.settings["lr_schedule"] == "cosine" and plan.settings["warmup_steps"] == 2


def test_nodes_whose_copies_differ_are_named():
    from zoexec.run.agree import diverged

    node = {0: "a", 1: "b", "resident": "r"}
    # 2 nodes x 2 local ranks: each rank checksums its share (block b on local rank b % 2)
    same = [{0: "a", "resident": "r"}, {1: "b"}, {0: "a", "resident": "r"}, {1: "b"}]
    assert diverged(same, local_ranks=2) is None and set(node) == {0, 1, "resident"}
    other = [{0: "a", "resident": "r"}, {1: "b"}, {0: "a", "resident": "r"}, {1: "B"}]
    assert diverged(other, local_ranks=2) == "differ from node 0's: node 1 (block 1)"
    three = [{0: "a", "resident": "r"}, {0: "x", "resident": "y"}, {0: "a", "resident": "r"}]
    assert diverged(three, local_ranks=1) == ("differ from node 0's: node 1 (block 0, the "
                                              "resident parts)")


def test_the_step_history_keeps_records_as_numbers_and_gives_them_back():
    from zoexec.maths.history import StepHistory

    records = [_record(0), _record(1, loss_plus=math.nan, g=math.nan), _record(2, skipped=True)]
    history = StepHistory(records)
    assert len(history) == 3 and history[-1] == records[2] and history[0] == records[0]
    back = list(history)
    assert back[1].step == 1 and math.isnan(back[1].g) and back[1].seed == records[1].seed
    assert [r.update for r in back] == [r.update for r in records]


def test_overwrite_and_undo_remove_only_what_a_run_wrote(tmp_path):
    """--overwrite (clear) and the undoing of a failed new run (discard) remove a run's
    files by their markers; a user's files in the folder, and what was there before the
    run started, stay; a final/ zoexec did not write is refused before anything goes."""
    rundir = RunDir(tmp_path)
    rundir.write_identity(_cfg(), "abc")
    _log(rundir, [_record(0), _record(1)])
    _snapshot(rundir, 1)
    (tmp_path / "snapshots" / "notes.txt").write_text("the user's\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "events.out.tfevents.1.host").write_text("")
    (tmp_path / "runs" / "my-board").mkdir()
    (tmp_path / "keep.txt").write_text("the user's\n")
    rundir.clear()
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["keep.txt", "runs", "runs/my-board", "snapshots", "snapshots/notes.txt"]
    (tmp_path / "final").mkdir()   # a user's folder named final/ (no state.json)
    with pytest.raises(ZoError, match="final was not written by zoexec"):
        rundir.clear()
    assert (tmp_path / "final").is_dir() and (tmp_path / "keep.txt").is_file()
    (tmp_path / "final").rmdir()
    before = rundir.present()
    rundir.write_identity(_cfg(), "abc")   # a new run that fails before its first step
    rundir.discard(before=before)
    assert not (tmp_path / "run.json").exists() and (tmp_path / "snapshots" / "notes.txt").is_file()


def test_the_step_history_holds_a_bounded_number_of_steps_in_memory(monkeypatch):
    """Past HELD steps the older ones go to a file: what is in memory stays bounded
    over a long run, and every record comes back as it went in."""
    from zoexec.maths.history import StepHistory

    monkeypatch.setattr(StepHistory, "HELD", 4)
    records = [_record(i, skipped=i == 5) for i in range(11)]
    history = StepHistory(records)
    assert len(history._ints) <= 3 * 4 and len(history._floats) <= 6 * 4
    assert len(history) == 11 and list(history) == records and history[-11] == records[0]


@pytest.mark.parametrize("task,order,refused", [
    ({"name": "text"}, None, True),                   # an older zoexec's packed text: refused
    ({"name": "text"}, 1, True),
    ({"name": "text"}, DATA_ORDER, False),
    ({"name": "classification"}, None, False),        # its order did not change
    ({"name": "classification"}, DATA_ORDER, False)])
def test_a_run_drawn_in_another_data_order_is_refused(tmp_path, task, order, refused):
    """Packed text is read in blocks of windows since DATA_ORDER 2: a text run recorded
    without that order (an older zoexec) would resume on other rows, so it is refused in
    one line; a run of another task, whose order did not change, resumes."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "a b c"}\n')
    inputs = fingerprints(data=str(data), model="random")
    assert inputs["data"]["order"] == DATA_ORDER
    if order is None:
        del inputs["data"]["order"]
    else:
        inputs["data"]["order"] = order
    rundir = RunDir(tmp_path / "run")
    rundir.path.mkdir()
    rundir.write_identity(_cfg(data=str(data), inputs=inputs), "abc")
    rundir.write_sealed({**rundir.read_identity(), "task": task})   # as that run recorded it
    if refused:
        with pytest.raises(ZoError, match=r"another order .* cannot resume exactly"):
            rundir.resume_plan(plan_sha256="abc", given={})
    else:
        assert rundir.resume_plan(plan_sha256="abc", given={}).start_step == 0
