"""A resume keeps the run's evaluation (issue 40): a run with --eval-data, --eval-every
and --save-best killed with SIGKILL and resumed with the command it printed when it
started ends with the uninterrupted run's evaluation records and best/, byte for byte
(the resume takes the evaluation settings from run.json and evaluates again a step
whose evaluation the kill cut off)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from make_model import make_model  # noqa: E402

# Not `serial`: it kills only its own run (its process group), and what the killed run
# could leave behind goes to folders of its own: the block store's (ZOEXEC_SHM_DIR:
# private_shm) and the temporary one (TMPDIR: the rendezvous and data files), so no
# other test's run finds stale files of it to sweep (and says so on its stderr).

BIN = Path(sys.executable).parent
DATA = ROOT / "examples" / "sentiment"
STEPS, KILL_AFTER = 10, 4   # killed after 4 logged steps: the evaluation after step 4 may be cut
ARGS = ["--data", str(DATA / "train.jsonl"), "--task", "classification", "--template",
        "{sentence} It was", "--label-words", "terrible,great", "--eval-data",
        str(DATA / "test.jsonl"), "--eval-samples", "16", "--eval-every", "2",
        "--save-best", "eval_loss:max", "--steps", str(STEPS), "--lr", "1e-3",
        "--save-every", "2", "--threads", "1"]


def _evals(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if any(k.startswith("eval_") for k in r)]


@pytest.fixture
def private_shm(tmp_path, monkeypatch):
    """A folder of its own for the runs' block stores (on the tmpfs where there is one),
    named so that no sweep of /dev/shm's zoexec-* files looks into it; removed after."""
    shm = Path("/dev/shm")
    folder = (shm if shm.is_dir() else tmp_path) / f"zt-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    monkeypatch.setenv("ZOEXEC_SHM_DIR", str(folder))   # the runs here and the one started
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_run_resumed_with_its_printed_command_evaluates_as_the_whole_run(tmp_path,
                                                                                 private_shm):
    model = make_model(tmp_path / "micro", size="micro", seed=0)
    plan = tmp_path / "plan.json"
    hand_plan(model=get_model(str(model)), layout=Layout(),
              workload=Workload(batch=16, seq=48, param_dtype="fp32",
                                compute_dtype="fp32")).save(plan)
    whole = tmp_path / "whole"
    done = CliRunner().invoke(app, ["run", str(plan), "--model-path", str(model), *ARGS,
                                    "--out", str(whole), "-q"])
    assert done.exit_code == 0, done.output
    killed = tmp_path / "killed"
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    proc = subprocess.Popen([str(BIN / "zoexec"), "run", str(plan), "--model-path", str(model),
                             *ARGS, "--out", str(killed)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(own_tmp)})
    command = proc.stderr.readline()   # the first line: how to resume it
    log = killed / "losses.jsonl"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= KILL_AFTER:
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.fail(f"the run ended (exit {proc.returncode}) before it was killed: "
                    f"{command}{proc.stderr.read()[-2000:]}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert not (killed / "final").exists(), "the run ended before it was killed"
    assert "resume it with: zoexec run" in command, command
    words = shlex.split(command.split("resume it with: ", 1)[1])
    assert words[:2] == ["zoexec", "run"] and "--eval-data" not in words, words   # run.json keeps it
    resumed = CliRunner().invoke(app, [*words[1:], "-q"])
    assert resumed.exit_code == 0, resumed.output
    assert _evals(killed) == _evals(whole) and len(_evals(whole)) == STEPS // 2
    for name in ("state.json", "model.safetensors"):
        assert (killed / "best" / name).read_bytes() == (whole / "best" / name).read_bytes(), name
    assert (killed / "final" / "model.safetensors").read_bytes() == \
        (whole / "final" / "model.safetensors").read_bytes()
