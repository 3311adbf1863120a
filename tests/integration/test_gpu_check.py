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
.whl/cp311 in this checkout; pip downloads from the package index setup.sh uses) and
reused. The check's results must fit what the GPU machine returns: at most 8 files,
here exactly three, no folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MISSING_THERE = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "simpy",
                 "datasets")
LEFT_OUT = MISSING_THERE + ("__editable__", "zoplan", "zoexec", "distutils-precedence")
MAX_BYTES = 64 << 20


def _wheels() -> Path:
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    folder = REPO / ".whl" / tag
    if not list(folder.glob("*.whl")):
        done = subprocess.run(["bash", str(REPO / "scripts" / "device_wheels.sh"), "--python-version",
                               f"{sys.version_info[0]}.{sys.version_info[1]}", str(folder)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
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
    assert "error: cannot import zoplan.cli" in done.stderr and "is missing" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_the_dry_run_starts_as_the_gpu_machine_would_and_fits_the_return(machine, tmp_path):
    python, repo = machine
    out = tmp_path / "out"
    done = _check(python, repo, out, "--device-kind", "cpu", "--batch", "2", "--seq", "32",
                  "--steps", "3", "--modes", "master", "--precision", "bf16")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check-files.tar.gz", "summary.json",
                                                    "summary.txt"]
    stages = json.loads((out / "summary.json").read_text())["stages"]
    failed = {k: v["error"] for k, v in stages.items() if not v["ok"]}
    assert not failed, failed
    assert stages["env"]["torch"] and "pydantic" not in stages["env"]
    for name in ("pcie", "overlap", "context"):
        assert "needs a CUDA GPU" in stages[name]["skipped"]
    run = stages["run-master"]
    assert run["step_time_s"] > 0 and run["predicted_step_time_s"] > 0 and len(run["losses"]) == 3
    assert stages["oracle"]["same_bits"], stages["oracle"]
    assert stages["slices"]["slices2_same_bits"] and stages["slices"]["slices8_same_bits"]
    assert stages["issue"]["host_issue_s_per_step"] > 0
    assert stages["fit"]["fitted_profile"] == "fitted-profile.json"
    with tarfile.open(out / "gpu_check-files.tar.gz") as tar:
        names = tar.getnames()
    assert "gpu_check/fitted-profile.json" in names and "gpu_check/run-master/run.log" in names
    text = (out / "summary.txt").read_text()
    assert "FAILED" not in text and text.count("\n") == len(stages) + 1
