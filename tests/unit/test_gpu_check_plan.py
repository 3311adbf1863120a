"""scripts/gpu_check.py's budget and inputs, and scripts/device_wheels.py's choice of
wheels by version: what decides whether the GPU check fits twice in the device time and
starts on the image as it is (docs/gpu.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import device_wheels  # noqa: E402
import gpu_check  # noqa: E402


def test_the_whole_check_fits_240_seconds_on_a_gpu():
    """The default stages' ceilings + the wheels' install + the last writes: at most
    225 s (15 s of margin under 240), so one pass, a fix and a second pass fit in 15
    minutes of device time with two starts; the profile's time budget inside its
    stage's ceiling."""
    assert gpu_check.budget_total("cuda") <= 225
    assert gpu_check.PROFILE_BUDGET_S + 10 <= gpu_check.ceilings("cuda")["profile"]
    printed = subprocess.run([sys.executable, "scripts/gpu_check.py", "--plan-only"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    total = next(line for line in printed.splitlines() if line.startswith("total"))
    assert float(total.split()[1]) == gpu_check.budget_total("cuda")
    default = [s.name for s in gpu_check.STAGES if s.default]
    assert [line.split()[0] for line in printed.splitlines()[:len(default)]] == default
    named = printed.split("when named")[1]
    assert all(s.name in named for s in gpu_check.STAGES if not s.default)


def test_the_most_valuable_stages_come_first():
    """The runs, then the baselines, then two ranks on one GPU, then the rest."""
    names = [s.name for s in gpu_check.STAGES]
    assert names[:6] == ["preflight", "run-offload", "run-resident", "baselines",
                         "shared-gpu", "staging"]


def test_stages_are_chosen_by_name_with_preflight_first():
    assert gpu_check.selected_stages("slices,run-offload") == ["preflight", "run-offload", "slices"]
    assert gpu_check.selected_stages(None) == [s.name for s in gpu_check.STAGES if s.default]
    assert gpu_check.selected_stages("all") == [s.name for s in gpu_check.STAGES]
    with pytest.raises(SystemExit, match="unknown stage nope"):
        gpu_check.selected_stages("nope")


@pytest.mark.parametrize(("gpu", "kind"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"), ("NVIDIA A100-SXM4-80GB", "h200"), (None, "h200")])
def test_the_check_runs_the_plans_of_the_gpu_it_finds(gpu, kind, tmp_path):
    """Preflight's GPU name (or --gpu-name) picks the plans; another GPU gets the H200's
    and the summary says so; every later stage is told the kind."""
    got, why = gpu_check.plan_kind(gpu)
    assert got == kind and ("no plans for it" in why) == (gpu is None or "A100" in gpu)
    args = argparse.Namespace(out=tmp_path / "out", work=tmp_path / "work", device_kind="cpu",
                              deadline_s=10.0, steps=3, gpu_name=None, hang_stage=None)
    conductor = gpu_check.Conductor(args)
    conductor.pick_plans({"ok": True, **({"gpu": gpu} if gpu else {})})
    command = conductor.stage_command("run-offload", tmp_path / "work" / "run-offload")
    assert command[command.index("--gpu-kind") + 1] == kind
    assert conductor.summary["plans"]["kind"] == kind
    for name in ("offload", "resident"):
        assert gpu_check.plan_path(kind, name).is_file()


@pytest.mark.parametrize("kind", sorted(gpu_check.GPU_KINDS))
@pytest.mark.parametrize("name", ["offload", "resident"])
def test_the_committed_plans_are_what_the_shipped_profiles_give_today(kind, name, tmp_path):
    """The run stages time the plans of each GPU kind's shipped profile: a planner or
    profile change that alters them must be followed by `gpu_check.py --make-plans`."""
    placement = "host" if name == "offload" else "auto"
    out = tmp_path / "plan.json"
    profile = gpu_check.GPU_KINDS[kind][1]
    subprocess.run([sys.executable, "-m", "zoplan.cli", "optimize", *gpu_check.plan_args(profile),
                    "--placement", placement, "-o", str(out)], cwd=REPO, check=True,
                   capture_output=True)
    committed = gpu_check.plan_path(kind, name)
    assert json.loads(out.read_text()) == json.loads(committed.read_text()), \
        f"{committed} is stale: python scripts/gpu_check.py --make-plans"
    blocks = json.loads(committed.read_text())["blocks"]
    resident = sum(b["placement"] == "resident" for b in blocks)
    assert resident == (0 if name == "offload" else len(blocks))


def test_a_need_is_carried_unless_the_image_documents_a_version_that_meets_it(monkeypatch):
    need = Requirement("typing-extensions>=4.14.1")
    monkeypatch.setitem(device_wheels.IMAGE, "typing-extensions", None)     # name only
    assert not device_wheels.image_satisfies(need)
    monkeypatch.setitem(device_wheels.IMAGE, "typing-extensions", "4.12.2")  # too old
    assert not device_wheels.image_satisfies(need)
    monkeypatch.setitem(device_wheels.IMAGE, "typing-extensions", "4.16.0")
    assert device_wheels.image_satisfies(need)
    assert not device_wheels.image_satisfies(Requirement("simpy==4.1.2"))    # not there


def test_the_projects_pins_leave_out_the_images_own_and_what_the_check_never_imports():
    names = {device_wheels.norm(r.name) for r in device_wheels.project_pins()}
    assert {"pydantic", "simpy", "typer", "rich", "networkx"} <= names
    assert not names & (device_wheels.IMAGE_OWN | device_wheels.NOT_IMPORTED)


def test_markers_and_extras_are_evaluated_for_the_target_python():
    assert device_wheels.applies(Requirement("x; python_version < '3.13'"), "3.12")
    assert not device_wheels.applies(Requirement("x; python_version < '3.12'"), "3.12")
    assert not device_wheels.applies(Requirement("x; extra == 'email'"), "3.12")
    assert not device_wheels.applies(Requirement("x; sys_platform == 'win32'"), "3.12")


# ---- preflight's decisions (gpu_stages), without a GPU ----------------------------------------
import gpu_stages  # noqa: E402

from zoexec.runtime import hostmem  # noqa: E402


def test_a_tmpfs_of_the_size_needed_is_mounted_when_none_has_room(monkeypatch, tmp_path):
    """No candidate tmpfs with room: as root, one is mounted (the size needed, rounded
    up, plus 1 GiB) and the check says so; not as root, one line saying how."""
    monkeypatch.delenv("ZOEXEC_SHM_DIR", raising=False)
    monkeypatch.setattr(hostmem, "filesystem_type", lambda path: "tmpfs")
    monkeypatch.setattr(gpu_stages.shutil, "disk_usage", lambda path: SimpleUsage(free=1 << 30))
    monkeypatch.setattr(gpu_stages, "MOUNT_POINT", tmp_path / "zo-shm")
    mounts = []
    monkeypatch.setattr(gpu_stages.subprocess, "run",
                        lambda cmd, **kw: mounts.append(cmd) or SimpleRun(returncode=0))
    monkeypatch.setattr(gpu_stages.os, "geteuid", lambda: 0)
    got = gpu_stages.store_folder(int(9.5 * (1 << 30)))
    assert got == {"store_dir": str(tmp_path / "zo-shm"), "store_free_bytes": 11 << 30,
                   "mounted": True}
    assert mounts == [["mount", "-t", "tmpfs", "-o", "size=11g", "tmpfs", str(tmp_path / "zo-shm")]]
    monkeypatch.setattr(gpu_stages.os, "geteuid", lambda: 1000)
    with pytest.raises(gpu_stages.Failed, match="no tmpfs with 9.5 GiB free"):
        gpu_stages.store_folder(int(9.5 * (1 << 30)))
    assert len(mounts) == 1


def test_a_tmpfs_with_room_is_used_as_it_is(monkeypatch):
    monkeypatch.delenv("ZOEXEC_SHM_DIR", raising=False)
    monkeypatch.setattr(hostmem, "filesystem_type", lambda path: "tmpfs")
    monkeypatch.setattr(gpu_stages.shutil, "disk_usage", lambda path: SimpleUsage(free=64 << 30))
    monkeypatch.setattr(gpu_stages.subprocess, "run", lambda *a, **k: pytest.fail("mounted"))
    assert gpu_stages.store_folder(10 << 30)["store_dir"] == "/dev/shm"


def test_a_store_that_cannot_be_page_locked_is_labelled_not_fatal(monkeypatch, tmp_path):
    """cudaHostRegister failing: preflight records store_pinned False (the runs then
    copy through the staging ring and say so) instead of stopping the check."""
    from zoexec.runtime import pinning

    monkeypatch.setattr(pinning, "pin_tensor", lambda flat, who: False)
    assert gpu_stages.page_locking(tmp_path) == {"store_pinned": False}
    assert not list(tmp_path.iterdir())


def test_the_h200_passes_kept_in_the_repository_calibrate_offline():
    """What came back from the H200 (benchmarks/results/h200-2026-12-04) still reads:
    the plan, its trace and the shipped hgx-h200 profile give the step it measured."""
    from zoplan.calibrate import calibrate

    run = REPO / "benchmarks" / "results" / "h200-2026-12-04" / "pass2" / "run-offload"
    result = calibrate(plan=run / "plan.json", trace=run / "trace", profile="hgx-h200", skip=1,
                       fit=False, output=None)
    summary = json.loads((run.parent / "summary.json").read_text())["stages"]["run-offload"]
    assert result.calibration.meas_step_s == pytest.approx(summary["measured_step_s"])
    assert {r.kind for r in result.calibration.rows} >= {"h2d", "update", "forward", "d2h"}


class SimpleUsage:
    def __init__(self, *, free: int) -> None:
        self.free, self.total = free, free


class SimpleRun:
    def __init__(self, *, returncode: int) -> None:
        self.returncode, self.stderr = returncode, ""
