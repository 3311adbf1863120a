"""Never lose a run: a 2-rank CPU run killed with SIGKILL at a random step and resumed
ends with weights bit-identical to an uninterrupted run of the same length; resuming
from an older snapshot plus the log equals resuming from a newer one; SIGINT (Ctrl-C)
saves a snapshot and the run resumes from it; the same plan, seed and data give the
same losses and weights run to run (determinism). The tests after the kill run a
one-rank plan (the same code paths in one process, a few seconds faster a run)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.run.checkpoint import read_log
from zoexec.run.folder import RunDir
from zoexec.run.loop import MAX_SKIPS
from zoexec.store import shmfiles
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

# Not `serial`: it kills only its own runs (their process groups), and every run here
# keeps its files in the module's own folders (private_run_dirs: the block stores, the
# rendezvous and data folders), so no run of a test beside it sweeps what a kill here
# left (and says so on its stderr), and its runs' stderr and leftovers are their own.


@pytest.fixture(scope="module", autouse=True)
def _own_folders(private_run_dirs):
    return private_run_dirs

BIN = Path(sys.executable).parent
STEPS = 16
SETTINGS = ["--lr", "1e-3", "--seed", "7", "--save-every", "4", "-q"]   # constant lr
COMMON = ["--steps", str(STEPS), *SETTINGS]


def _plan(folder: Path, layout: Layout) -> Path:
    path = folder / "plan.json"
    workload = Workload(batch=8, seq=64, param_dtype="fp32", compute_dtype="fp32")
    hand_plan(model="tiny-opt", layout=layout, workload=workload).save(path)
    return path


@pytest.fixture(scope="module")
def plan2(tmp_path_factory) -> Path:
    return _plan(tmp_path_factory.mktemp("plan2"), Layout(ddp=2, slices=2))


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    return _plan(tmp_path_factory.mktemp("plan1"), Layout())


def _zoexec(*args) -> subprocess.CompletedProcess:
    """`zoexec run ARGS`: in this process (one rank: no process to start; what the
    command line does, without an interpreter's start-up), or as a command."""
    # the module's own store folder (shmfiles.SHM_DIR, private_run_dirs): an option, not
    # the environment (which a forkserver this process starts would keep)
    result = CliRunner().invoke(app, ["run", *map(str, args), "--shm-dir", str(shmfiles.SHM_DIR)])
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def _final(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _logged(out: Path) -> list:
    return [(r.step, r.seed, r.g) for r in read_log(out / "losses.jsonl")]


def _reference(plan: Path, folder: Path) -> Path:
    out = folder / "run"
    done = _zoexec(plan, "--out", out, *COMMON)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def reference2(plan2, tmp_path_factory) -> Path:
    return _reference(plan2, tmp_path_factory.mktemp("ref2"))


@pytest.fixture(scope="module")
def reference(plan, tmp_path_factory) -> Path:
    return _reference(plan, tmp_path_factory.mktemp("ref1"))


def test_the_same_plan_seed_and_data_give_the_same_run(plan, reference, tmp_path):
    again = tmp_path / "again"
    done = _zoexec(plan, "--out", again, *COMMON)
    assert done.returncode == 0, done.stderr
    assert _logged(again) == _logged(reference) and len(_logged(again)) == STEPS
    assert _same(_final(again), _final(reference))


def _start(plan, out: Path, *, steps: int = STEPS) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "zoexec"), "run", str(plan), "--out", str(out),
                             "--steps", str(steps), *SETTINGS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, shmfiles.SHM_DIR_ENV: str(shmfiles.SHM_DIR),
                                 "TMPDIR": str(shmfiles.RDZV_DIR)})   # the module's own


def _wait_for_steps(out: Path, steps: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        log = out / "losses.jsonl"
        if log.exists() and len(log.read_text().splitlines()) >= steps:
            return
        time.sleep(0.05)
    pytest.fail(f"the run did not reach step {steps}: {proc.poll()}")


def _wait_until_free(out: Path) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            RunDir(out).check_free()
            return
        except ZoError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_killed_2_rank_run_resumes_to_the_same_weights(plan2, reference2, tmp_path):
    plan, reference = plan2, reference2
    out = tmp_path / "killed"
    proc = _start(plan, out)
    at = random.Random().randint(5, STEPS - 6)      # a random point after a snapshot
    _wait_for_steps(out, at, proc)
    # the launcher and its ranks at once, as a machine that dies: a rank left to its
    # watchdog (about 1 s) could finish the 16 short steps first
    ranks = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for rank in ranks:
        try:
            rank.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(30)
    _wait_until_free(out)
    assert not (out / "final").exists()
    done = _zoexec(plan, "--resume", out, "-q")
    assert done.returncode == 0, done.stderr
    assert _logged(out) == _logged(reference)
    assert _same(_final(out), _final(reference)), f"killed after {at} logged steps"
    leftovers = list(shmfiles.SHM_DIR.glob("zoexec-*"))   # the module's own folder
    assert leftovers == [], leftovers


def test_an_older_snapshot_plus_the_log_gives_the_newer_ones_weights(plan, reference, tmp_path):
    out = tmp_path / "older"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")
    snapshots = sorted((out / "snapshots").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in snapshots] == ["checkpoint-8", "checkpoint-12"]   # --keep 2
    newer = tmp_path / "newer"
    shutil.copytree(out, newer)
    shutil.rmtree(snapshots[-1])                    # the older run only has step 8's
    log = out / "losses.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:13]))
    shutil.copy(log, newer / "losses.jsonl")
    for folder in (out, newer):
        done = _zoexec(plan, "--resume", folder, "-q")
        assert done.returncode == 0, done.stderr
    assert _same(_final(out), _final(newer)) and _same(_final(out), _final(reference))


def test_a_run_killed_while_saving_final_resumes_to_write_it(plan, reference, tmp_path):
    """Every step logged but final/ not whole (a kill while it was written): the resume
    replays the log after the newest snapshot and writes final/, training no step."""
    out = tmp_path / "unsaved"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")
    done = _zoexec(plan, "--resume", out, "-q")
    assert done.returncode == 0, done.stderr
    assert _same(_final(out), _final(reference))
    assert len(_logged(out)) == STEPS


def test_ctrl_c_saves_a_snapshot_and_the_run_resumes_from_it(plan, reference, tmp_path):
    """SIGINT after 5 logged steps of a run far longer than that (it cannot end first,
    however fast the machine: it stops at the step boundary after the signal); resumed
    for the reference's STEPS steps (the learning rate is constant: the planned length
    changes no step), it ends with the reference's weights. One step number throughout:
    stopped after k steps, the stop line, the snapshot's name, its state.json, the log
    and the resume's summary say k, and the metrics go on at k + 1."""
    out = tmp_path / "interrupted"
    proc = _start(plan, out, steps=100_000)
    _wait_for_steps(out, 5, proc)
    os.killpg(proc.pid, signal.SIGINT)              # what Ctrl-C does in a terminal
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    line = next(iter(s for s in err.splitlines() if "stopped by SIGINT after step " in s), err)
    k = int(line.split("after step ")[1].split(";")[0])
    assert "--resume" in line and f"snapshot {out / 'snapshots' / f'checkpoint-{k}'};" in line, err
    assert k == len(_logged(out)) and k < STEPS, f"the signal was acted on only after step {k}"
    state = json.loads((out / "snapshots" / f"checkpoint-{k}" / "state.json").read_text())
    assert state["global_step"] == k
    assert [json.loads(s)["step"] for s in (out / "losses.jsonl").read_text().splitlines()] \
        == list(range(1, k + 1))
    done = _zoexec(plan, "--resume", out, "--steps", STEPS)
    assert done.returncode == 0, done.stderr
    assert f"resumed after step {k})" in done.stderr, done.stderr
    rows = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, STEPS + 1))   # no gap, no repeat
    assert _logged(out) == _logged(reference)
    assert _same(_final(out), _final(reference))


def test_an_existing_run_is_neither_overwritten_nor_mixed(plan, reference, tmp_path):
    out = tmp_path / "taken"
    shutil.copytree(reference, out)
    done = _zoexec(plan, "--out", out, *COMMON)
    assert done.returncode == 2 and "--resume" in done.stderr and "--overwrite" in done.stderr
    assert _same(_final(out), _final(reference))
    done = _zoexec(plan, "--resume", out, "-q")     # all steps done: nothing to resume
    assert done.returncode == 2 and f"all {STEPS} steps" in done.stderr
    done = _zoexec(plan, "--out", out, *COMMON, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert _same(_final(out), _final(reference))


def test_a_diverging_run_stops_at_the_first_non_finite_step_keeping_the_last_good_one(
        plan, tmp_path):
    out = tmp_path / "diverged"
    done = _zoexec(plan, "--out", out, "--steps", "40", "--lr", "1e6", "--save-every", "100", "-q")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: step 2: the loss is not finite"), done.stderr
    assert done.stderr.count("\n") == 1 and "--on-nonfinite skip" in done.stderr
    records = read_log(out / "losses.jsonl")
    bad = [r for r in records if not r.finite]
    assert len(bad) == 1 and bad[0] is records[-1]
    kept = out / "snapshots" / f"checkpoint-{records[-1].step}"   # the step before (from 0)
    assert (kept / "state.json").is_file() and not (out / "final").exists()
    weights = load_file(str(kept / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
    # --on-nonfinite skip: such steps are logged as skipped, no update, and the run goes
    # on; here the weights stay broken, so it stops after MAX_SKIPS of them in a row
    skipped = tmp_path / "skipped"
    done = _zoexec(plan, "--out", skipped, "--steps", "40", "--lr", "1e6", "--save-every", "100",
                   "--on-nonfinite", "skip", "-q")
    assert done.returncode == 1 and f"{MAX_SKIPS + 1} in a row" in done.stderr, done.stderr
    records = read_log(skipped / "losses.jsonl")
    assert [r.skipped for r in records if not r.finite] == [True] * MAX_SKIPS + [False]
    assert done.stderr.count("skipped, no update") == MAX_SKIPS
