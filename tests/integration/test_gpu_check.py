"""scripts/gpu_check.sh's dry run on the CPU, started the way the GPU machine starts it:
from a copy of the repository with no .venv, with the system-like `python3` of an image
that has torch, transformers and the rest of what we use (numpy, rich, typer, networkx,
safetensors, tokenizers, psutil) but neither pydantic nor simpy nor datasets, and the
wheels scripts/device_wheels.sh downloads (for this host's Python) installed by the
script into a private folder on PYTHONPATH.

The image, cheaply: a fresh venv without pip (a second or two) whose site-packages holds
one .pth line naming a folder of symbolic links to every entry of this checkout's
.venv site-packages except pydantic, pydantic_core, annotated_types, typing_inspection,
simpy and datasets (and their dist-info) and the editable install of zoplan/zoexec.
Nothing is copied or installed, and `import pydantic` fails there (checked first).

The wheel folder is built once (bash scripts/device_wheels.sh --python-version 3.11
DIR; pip downloads from the package index setup.sh uses) and reused: DIR is this
checkout's .whl/cp311 where it holds wheels, else a folder of the user's cache named
after the wheel list's inputs (_wheels). The check's results must fit what the GPU machine returns: at most 8 files,
here exactly three, no folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MISSING_THERE = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "simpy",
                 "datasets")
LEFT_OUT = MISSING_THERE + ("__editable__", "zoplan", "zoexec", "distutils-precedence")
MAX_BYTES = 64 << 20


def _wheels() -> Path:
    """This checkout's .whl/cpXY where it holds wheels, else the user's cache of them
    for this very wheel list (pyproject.toml's pins and device_wheels.py, hashed), made
    there once: a fresh clone (CI's) reuses the last one's instead of downloading them
    again (16 pip processes, ~13 s of CPU and the network)."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    folder = REPO / ".whl" / tag
    if not list(folder.glob("*.whl")):
        key = hashlib.sha256(b"".join((REPO / name).read_bytes() for name in
                                      ("pyproject.toml", "scripts/device_wheels.py"))).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        folder = cache / "zoexec-tests" / f"wheels-{key}" / tag
    if not list(folder.glob("*.whl")):   # made beside it, then renamed: whole or absent
        making = folder.with_name(f"{tag}.making-{os.getpid()}")
        done = subprocess.run(["bash", str(REPO / "scripts" / "device_wheels.sh"), "--python-version",
                               f"{sys.version_info[0]}.{sys.version_info[1]}", str(making)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        shutil.rmtree(folder, ignore_errors=True)
        making.rename(folder)
    return folder


def _image(tmp: Path) -> Path:
    """The python of an image without pydantic, simpy and datasets (module docstring)."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    links = tmp / "image-site"
    links.mkdir()
    for entry in site.iterdir():
        stem = entry.name.split("-")[0].split(".")[0].lower()
        if not any(stem == name or entry.name.startswith(name) for name in LEFT_OUT):
            (links / entry.name).symlink_to(entry)
    venv = tmp / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = next((venv / "lib").glob("python3*")) / "site-packages"
    (target / "image.pth").write_text(str(links) + "\n")
    return venv / "bin" / "python"


def _repo_copy(tmp: Path, wheels: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    copy = tmp / "repo"
    for name in files:
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    shutil.copytree(wheels, copy / ".whl" / wheels.name)
    return copy


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_machine")
    python = _image(tmp)
    return python, _repo_copy(tmp, _wheels())


def _check(python: Path, repo: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHON"] = str(python)
    return subprocess.run(["bash", "scripts/gpu_check.sh", "--out", str(out), *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=900)


def test_the_image_lacks_what_the_wheels_bring(machine):
    python, repo = machine
    for name in ("pydantic", "simpy", "datasets"):
        done = subprocess.run([str(python), "-c", f"import {name}"], capture_output=True)
        assert done.returncode != 0, f"{name} is importable in the image copy"
    assert not (repo / ".venv").exists()
    assert _size(repo) <= MAX_BYTES, f"repo + wheels: {_size(repo) / 2**20:.1f} MiB"
    assert _size(repo / ".whl") <= 20 << 20


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_without_the_wheels_the_check_stops_with_one_line(machine, tmp_path):
    python, repo = machine
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    done = _check(python, repo, tmp_path / "out", "--wheels", str(empty), "--device-kind", "cpu")
    assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
    assert not (tmp_path / "out").exists()
    shutil.rmtree(repo / ".whl-hidden", ignore_errors=True)
    (repo / ".whl").rename(repo / ".whl-hidden")
    try:
        done = _check(python, repo, tmp_path / "out", "--device-kind", "cpu")
    finally:
        (repo / ".whl-hidden").rename(repo / ".whl")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "error: preflight: cannot import zoplan.cli" in done.stderr and "is missing" in done.stderr
    assert "Traceback" not in done.stderr
    summary = _summary(tmp_path / "out")         # what it found is kept, and says so
    assert summary["state"] == "stopped at preflight" and list(summary["stages"]) == ["preflight"]


DRY_STAGES = ["preflight", "run-offload", "profile"]
DEFAULT_STAGES = ["preflight", "run-offload", "run-resident", "baselines", "shared-gpu", "staging",
                  "profile"]


def test_the_dry_run_starts_as_the_gpu_machine_would_fits_the_return_and_survives_hangs(
        machine, tmp_path):
    """One check (one start-up: the wheels' install, one preflight) on the CPU, each
    stage a child started from the image's python as on the GPU machine: preflight,
    run-offload (a `zoexec run --trace` and its calibration), profile (the dry run skips
    it: one line), then overlap, made to hang (the test hook: no torch start-up), is
    killed at its ceiling and recorded, and the next stage starts: context, made to hang
    too, is in flight when SIGTERM comes to the check's whole process group (as
    `timeout` or a user would send it): the summary keeps every stage that ended (the
    killed one's log too), the stage in flight is killed, one line says so, and what
    comes back fits the device tool's return (at most 8 files, no folder). The other
    stages' CPU paths run in a test process (test_gpu_stages_cpu.py: a child's start-up
    each, torch and transformers, was most of their seconds); the default stages'
    order, and the conductor's ends without a signal (exit 0, "done"; exit 1 and its
    line): test_the_check_ends_with_its_stages_status_and_line."""
    python, repo = machine
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHON"] = str(python)
    proc = subprocess.Popen(["bash", "scripts/gpu_check.sh", "--out", str(out), "--device-kind",
                             "cpu", "--steps", "3", "--gpu-name", "NVIDIA H100 80GB HBM3",
                             "--stages", ",".join(DRY_STAGES + ["overlap", "context"]),
                             "--hang-stage", "overlap,context", "--work", str(tmp_path / "work"),
                             "--deadline-s", "900"],
                            cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _wait_for(lambda: "overlap" in _stages_so_far(out), proc, timeout_s=900)
        _wait_for(lambda: "hanging" in _text(tmp_path / "work" / "context" / "stage.log"), proc)
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, stdout[-4000:] + stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the check was interrupted by SIGTERM"), stderr
    assert sorted(p.name for p in out.iterdir()) == ["files.tar", "summary.json", "summary.txt"]
    summary = _summary(out)
    assert summary["state"] == "interrupted by SIGTERM"
    stages = summary["stages"]
    assert list(stages)[:len(DRY_STAGES) + 1] == DRY_STAGES + ["overlap"]
    failed = {k: v.get("error") for k, v in stages.items() if not v["ok"] and k != "context"}
    assert list(failed) == ["overlap"] and "killed at its ceiling" in failed["overlap"], failed
    assert "context" not in stages or not stages["context"]["ok"]
    assert summary["plans"]["kind"] == "h100"
    run = stages["run-offload"]
    assert run["measured_step_s"] > 0 and run["predicted_step_s"] > 0 and len(run["losses"]) == 3
    assert {"forward", "update"} <= set(run["kinds"]) and run["kinds"]["h2d"]["meas_busy_s"] > 0
    with tarfile.open(out / "files.tar") as tar:     # the hung stage's log came back too
        names = tar.getnames()
    assert {"run-offload/plan.json", "run-offload/trace/meta.json", "run-offload/run.log",
            "run-offload/calibrate.txt", "profile/stage.log", "overlap/stage.log"} <= set(names)
    text = (out / "summary.txt").read_text()
    assert text.count("FAILED") == 1 and text.count("\n") == len(stages) + 1


@pytest.mark.parametrize("failing", [None, "overlap"])
def test_the_check_ends_with_its_stages_status_and_line(failing, tmp_path, monkeypatch, capsys):
    """The conductor (scripts/gpu_check.py) in this process, its stages one-line Python
    children that pass or fail: every stage ran; all passed: exit 0, "done", nothing on
    stderr; one failed: the later stages still run, exit 1, one line naming it. (The
    whole check, started as on the GPU machine: the test above.)"""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import gpu_check

    def stage_command(self, name, folder):
        result = {"ok": name != failing, **({"error": "it broke"} if name == failing else {})}
        return [sys.executable, "-c", f"import json, pathlib; pathlib.Path({str(folder)!r}, "
                f"'result.json').write_text(json.dumps({result!r}))"]
    monkeypatch.setattr(gpu_check.Conductor, "stage_command", stage_command)
    args = gpu_check.argparse.Namespace(out=tmp_path / "out", work=tmp_path / "work",
                                        stages="overlap,context" if failing else None,
                                        deadline_s=60.0, steps=3, gpu_name=None,
                                        device_kind="cpu", hang_stage=None)
    assert gpu_check.check(args) == (1 if failing else 0)
    err = capsys.readouterr().err
    summary = _summary(tmp_path / "out")
    assert list(summary["stages"]) == (["preflight", "overlap", "context"] if failing
                                       else DEFAULT_STAGES)   # without --stages: in this order
    assert all(stage["ok"] for name, stage in summary["stages"].items() if name != failing)
    if failing:
        assert err.strip().splitlines() == ["error: stage(s) that did not pass: overlap "
                                            "(summary.txt says why)"], err
        assert summary["state"] == "done, with failures"
        assert summary["stages"]["overlap"]["error"] == "it broke"
    else:
        assert err == "" and summary["state"] == "done"
        assert "FAILED" not in (tmp_path / "out" / "summary.txt").read_text()


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _stages_so_far(out: Path) -> dict:
    try:
        return _summary(out)["stages"]
    except (OSError, ValueError):
        return {}


def _wait_for(ready, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    """Poll until `ready()` (an event the check writes), failing if the check ends first."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the check ended first: {proc.communicate()}"
        assert time.monotonic() < deadline, "the event never came"
        time.sleep(0.2)
