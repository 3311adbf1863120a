"""GPU check: what one CUDA GPU (an H100 or an H200, the kinds this project can borrow) must tell about
zoplan + zoexec, most valuable first, every result kept as it comes (docs/gpu.md).
Started by scripts/gpu_check.sh, which installs the carried wheels and runs this under
`timeout -s TERM`.

This process is the conductor: it imports neither torch nor the project, holds no CUDA
context, and runs each stage as a child process (scripts/gpu_stages.py STAGE) with a
ceiling: a stage that fails, hangs inside a CUDA call or runs over is killed and recorded,
and the next one starts. After every stage it rewrites OUT/summary.json and
OUT/summary.txt and appends the stage's folder (plans, traces, logs, profiles) to
OUT/files.tar. SIGTERM (or --deadline-s running out) ends the check cleanly: the running
stage is killed, everything so far is saved, one line says so, exit 3.

    python scripts/gpu_check.py --out DIR [--stages a,b] [--deadline-s S] [--device-kind cpu]
    python scripts/gpu_check.py --plan-only      # the stages, their ceilings and the total
    python scripts/gpu_check.py --make-plans     # rewrite the committed plans (scripts/gpu_plans/)

Exit: 0 every stage ran, 1 a stage failed, 2 preflight stopped the check, 3 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES_PY = REPO / "scripts" / "gpu_stages.py"
PLANS = REPO / "scripts" / "gpu_plans"
PROFILE_BUDGET_S = 12      # zoplan profile's --time-budget: inside its stage's ceiling


@dataclass(frozen=True, kw_only=True)
class Stage:
    """A stage of the check: its ceilings in seconds on a CUDA GPU and in the CPU dry
    run (the child is killed there), what it measures, and whether a check without
    --stages runs it (`default`; the others run when named, or with --stages all)."""

    name: str
    cuda_s: float
    cpu_s: float
    what: str
    default: bool = True


# In order of value. The CUDA ceilings: the H200 passes' seconds where a stage ran there
# (docs/gpu.md: preflight 10.4-11.3; run-offload 28.0 and run-resident 24.4 for 20 steps,
# about 0.09 s and 0.07 s more a step; profile 27.4 with a 60 s budget, now 12 s) with
# room; the new stages (baselines, shared-gpu, staging) from their parts' H200 figures
# (an OPT-1.3B build and a zoexec run's start, the steps at their priced length). The
# default stages, the wheels and the last writes stay under 240 s with margin; the
# stages the H200 passes already measured (oracle, slices, issue, overlap, context) run
# when named. The CPU column (the dry run, tiny shapes) only guards against a hang: a
# loaded 2-core machine may take 3x its idle time.
STAGES = (
    Stage(name="preflight", cuda_s=15, cpu_s=40,
          what="imports; a tmpfs with room for the store (mounted if /dev/shm is small); "
               "the GPU, its name (whose committed plans run) and compute mode; 1 GiB of the store "
               "page-locked (else: staged)"),
    Stage(name="run-offload", cuda_s=38, cpu_s=60,
          what="`zoexec run --trace` (60 steps) of the committed plan for this GPU "
               "(scripts/gpu_plans/KIND/): OPT-1.3B, every block streamed from host memory, "
               "bf16; predicted vs measured"),
    Stage(name="run-resident", cuda_s=32, cpu_s=60,
          what="the same with every block resident on the GPU"),
    Stage(name="baselines", cuda_s=40, cpu_s=60,
          what="MeZO and ZO2 (zoexec baseline) on the same model, batch and precision: "
               "zoexec's step over each, measured, beside the planner's ratio"),
    Stage(name="shared-gpu", cuda_s=40, cpu_s=90,
          what="PertP 2, DDP 2 and the update on 2 slices as two processes on one GPU over "
               "gloo: final weights against one rank's, bit for bit"),
    Stage(name="staging", cuda_s=15, cpu_s=20,
          what="H2D, D2H and both at once: pageable and page-locked memory, and a pageable "
               "store through the staging ring"),
    Stage(name="profile", cuda_s=28, cpu_s=10,
          what=f"`zoplan profile --quick --time-budget {PROFILE_BUDGET_S}`: copies and "
               "duplex, forwards, z (the dry run skips it)"),
    Stage(name="oracle", cuda_s=20, cpu_s=45, default=False,
          what="zoexec.reference's loop on the device against `zoexec run`: the same bits"),
    Stage(name="slices", cuda_s=20, cpu_s=45, default=False,
          what="z and the update of 2 and 8 slices of a block are the whole block's bits"),
    Stage(name="issue", cuda_s=30, cpu_s=45, default=False,
          what="host issue time of a step (no device wait inside it) against its GPU time"),
    Stage(name="overlap", cuda_s=25, cpu_s=8, default=False,
          what="a forward beside an update and beside an H2D copy of the same length: "
               "each stream's slowdown; pinned and pageable copies, alone and duplex"),
    # context's CPU ceiling: room for the dry-run test's SIGTERM, sent while it hangs
    Stage(name="context", cuda_s=10, cpu_s=30, default=False,
          what="the CUDA context's and cuBLAS's device bytes as NVML reports them"),
)
# the wrapper's install of the carried wheels, and the final writes
FIXED_S = {"wheels": 10, "pack": 5}
BY_NAME = {s.name: s for s in STAGES}
# Plans per GPU kind, each from the shipped profile of that GPU (--make-plans): the
# check runs the kind whose name the GPU's name holds (preflight reports the name).
GPU_KINDS = {"h100": ("H100", "dgx-h100"), "h200": ("H200", "hgx-h200")}
DEFAULT_KIND = "h200"


def plan_kind(gpu_name: str | None) -> tuple[str, str]:
    """(kind, why) of the committed plans for the GPU named `gpu_name` (torch's
    device name: "NVIDIA H100 80GB HBM3", "NVIDIA H200"); a GPU of another kind gets
    the H200's plans, and `why` says so."""
    for kind, (word, profile) in GPU_KINDS.items():
        if gpu_name and word in gpu_name.upper():
            return kind, f"{gpu_name}: the plans of hwprofiles/{profile}.json"
    profile = GPU_KINDS[DEFAULT_KIND][1]
    return DEFAULT_KIND, (f"{gpu_name or 'no GPU name'}: no plans for it; those of "
                          f"hwprofiles/{profile}.json")


class Interrupted(Exception):
    """SIGTERM or SIGINT: save what there is and stop."""


def ceilings(device_kind: str) -> dict[str, float]:
    return {s.name: s.cuda_s if device_kind == "cuda" else s.cpu_s for s in STAGES}


def budget_total(device_kind: str, names: list[str] | None = None) -> float:
    """The ceilings of `names` (default: the default stages) and the fixed costs."""
    names = names or [s.name for s in STAGES if s.default]
    return sum(ceilings(device_kind)[n] for n in names) + sum(FIXED_S.values())


def plan_only(device_kind: str) -> str:
    """The default stages, their ceilings and the total, as --plan-only prints them, then
    the stages that run when named."""
    ceiling = ceilings(device_kind)
    rows = [f"{s.name:13s} {ceiling[s.name]:5.0f} s  {s.what}" for s in STAGES if s.default]
    rows += [f"{name:13s} {seconds:5.0f} s  (outside the stages)" for name, seconds in FIXED_S.items()]
    rows.append(f"{'total':13s} {budget_total(device_kind):5.0f} s  ({device_kind})")
    rows.append("when named (--stages NAME,... or all):")
    rows += [f"{s.name:13s} {ceiling[s.name]:5.0f} s  {s.what}" for s in STAGES if not s.default]
    return "\n".join(rows)


# ---- the summary ---------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_summary(out: Path, summary: dict) -> None:
    write_atomic(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_atomic(out / "summary.txt", report(summary) + "\n")


def report(summary: dict) -> str:
    """summary.txt: a header, then one line per stage: its figures or why it did not."""
    lines = [f"gpu_check on {summary['device_kind']}: {summary['state']}, "
             f"{summary['elapsed_s']:.0f} s of {summary['deadline_s']:.0f}"]
    for name, result in summary["stages"].items():
        lines.append(f"{name:13s} {stage_line(result)}")
    return "\n".join(lines)


def stage_line(result: dict) -> str:
    took = f" ({result['seconds']:.1f} s)" if "seconds" in result else ""
    if result.get("skipped"):
        return f"skipped: {result['skipped']}{took}"
    if not result.get("ok"):
        return f"FAILED: {result.get('error')}{took}"
    shown = {k: v for k, v in result.items() if k not in ("ok", "seconds", "losses", "kinds")}
    return ", ".join(f"{k}={_fmt(v)}" for k, v in shown.items()) + took


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


# ---- one stage ------------------------------------------------------------------------------
class Conductor:
    """Runs the stages as children, one at a time, and keeps the summary current."""

    def __init__(self, args) -> None:
        self.args = args
        self.began = time.monotonic()
        self.deadline = self.began + args.deadline_s
        self.child: subprocess.Popen | None = None
        self.gpu_kind = DEFAULT_KIND
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
        self.summary = {"device_kind": args.device_kind, "state": "running",
                        "deadline_s": args.deadline_s, "elapsed_s": 0.0,
                        "budget_s": budget_total(args.device_kind), "stages": {}}
        args.out.mkdir(parents=True, exist_ok=True)
        args.work.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.began, 1)
        write_summary(self.args.out, self.summary)

    def interrupt(self, signum, frame) -> None:
        """The first SIGTERM/SIGINT ends the check; more (a group's and a relay's) wait."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        self.kill_child()
        raise Interrupted(signal.Signals(signum).name)

    def kill_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.child.wait()

    def run(self, name: str) -> dict:
        """One stage in a child process within its ceiling (and the deadline)."""
        left = self.deadline - time.monotonic()
        ceiling = min(ceilings(self.args.device_kind)[name], left)
        if ceiling < 2:
            return {"ok": False, "skipped": f"the deadline ({self.args.deadline_s:.0f} s) is spent"}
        folder = self.args.work / name
        shutil.rmtree(folder, ignore_errors=True)    # an earlier check's files
        folder.mkdir(parents=True)
        result_file = folder / "result.json"
        began = time.monotonic()
        with (folder / "stage.log").open("w") as log:
            self.child = subprocess.Popen(self.stage_command(name, folder), cwd=REPO, env=self.env,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            try:
                code = self.child.wait(timeout=ceiling)
            except subprocess.TimeoutExpired:
                self.kill_child()
                code = None
        self.child = None
        result = self.result_of(code, result_file, folder / "stage.log", ceiling)
        result["seconds"] = round(time.monotonic() - began, 2)
        self.keep_files(folder)
        return result

    def pick_plans(self, preflight: dict) -> None:
        """The GPU kind whose plans the later stages run (--gpu-name, else the GPU
        preflight found), recorded in the summary."""
        kind, why = plan_kind(self.args.gpu_name or preflight.get("gpu"))
        self.gpu_kind = kind
        self.summary["plans"] = {"kind": kind, "why": why}
        print(f"plans: {kind} ({why})", flush=True)

    def stage_command(self, name: str, folder: Path) -> list[str]:
        a = self.args
        cmd = [sys.executable, str(STAGES_PY), name, "--work", str(a.work), "--folder", str(folder),
               "--device-kind", a.device_kind, "--steps", str(a.steps),
               "--gpu-kind", self.gpu_kind]
        if name in (a.hang_stage or "").split(","):
            cmd.append("--hang")
        return cmd

    @staticmethod
    def result_of(code, result_file: Path, log: Path, ceiling: float) -> dict:
        if code is None:
            return {"ok": False, "error": f"killed at its ceiling of {ceiling:.0f} s (a hang or "
                                          f"a slow start: see {log.parent.name}/stage.log)"}
        if result_file.is_file():
            try:
                return json.loads(result_file.read_text())
            except ValueError as exc:
                return {"ok": False, "error": f"its result file is not JSON ({exc})"}
        tail = (log.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        return {"ok": False, "error": f"exited {code} with no result: {tail[:300]}"}

    def keep_files(self, folder: Path) -> None:
        """The stage's folder into OUT/files.tar (appended: what earlier stages put there
        stays readable if this check is killed), and a measured profile beside it."""
        with tarfile.open(self.args.out / "files.tar", "a") as tar:
            tar.add(folder, arcname=folder.name)
        profile = folder / "profile.json"
        if profile.is_file():
            (self.args.out / "profile.json").write_bytes(profile.read_bytes())


# ---- the whole check ----------------------------------------------------------------------------
def selected_stages(text: str | None) -> list[str]:
    if not text:
        return [s.name for s in STAGES if s.default]
    if text.strip() == "all":
        return [s.name for s in STAGES]
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: unknown stage {', '.join(unknown)} (stages: "
                         f"{', '.join(BY_NAME)})")
    # preflight always runs first: it chooses the store's folder the others use
    return ["preflight"] + [n for n in BY_NAME if n in names and n != "preflight"]


def check(args) -> int:
    conductor = Conductor(args)
    signal.signal(signal.SIGTERM, conductor.interrupt)
    signal.signal(signal.SIGINT, conductor.interrupt)
    stages = conductor.summary["stages"]
    code = 0
    try:
        for name in selected_stages(args.stages):
            print(f"== {name} (ceiling {ceilings(args.device_kind)[name]:.0f} s)", flush=True)
            result = conductor.run(name)
            stages[name] = result
            conductor.save()
            print(f"{name:13s} {stage_line(result)}", flush=True)
            if name == "preflight" and result.get("store_dir"):
                conductor.env["ZOEXEC_SHM_DIR"] = result["store_dir"]
            if name == "preflight":
                conductor.pick_plans(result)
            if name == "preflight" and not result.get("ok"):
                conductor.summary["state"] = "stopped at preflight"
                print(f"error: preflight: {result.get('error')}", file=sys.stderr, flush=True)
                code = 2
                break
            if not result.get("ok"):
                code = 1
        else:
            conductor.summary["state"] = "done" if not code else "done, with failures"
    except Interrupted as why:
        conductor.summary["state"] = f"interrupted by {why}"
        conductor.save()
        done = [n for n, r in stages.items() if r.get("ok")]
        print(f"error: the check was interrupted by {why} after {len(done)} stage(s) "
              f"({', '.join(done) or 'none'}); their results are in {args.out}/summary.json",
              file=sys.stderr, flush=True)
        return 3
    conductor.save()
    print((args.out / "summary.txt").read_text(), end="", flush=True)
    failed = [n for n, r in stages.items() if not r.get("ok")]
    if failed and code == 1:
        print(f"error: stage(s) that did not pass: {', '.join(failed)} (summary.txt says why)",
              file=sys.stderr, flush=True)
    return code


def make_plans() -> None:
    """Write the committed plans of the run stages, for each GPU kind from its shipped
    profile (scripts/gpu_plans/KIND/)."""
    for kind, (_, profile) in GPU_KINDS.items():
        (PLANS / kind).mkdir(parents=True, exist_ok=True)
        for name, placement in (("offload", "host"), ("resident", "auto")):
            out = plan_path(kind, name)
            subprocess.run([sys.executable, "-m", "zoplan.cli", "optimize", *plan_args(profile),
                            "--placement", placement, "-o", str(out)], cwd=REPO, check=True,
                           stdout=subprocess.DEVNULL)
            print(f"wrote {out.relative_to(REPO)}")


def plan_path(kind: str, name: str) -> Path:
    return PLANS / kind / f"opt-1.3b-{name}.plan.json"


def plan_args(profile: str) -> tuple[str, ...]:
    """The committed plans' command (tests/unit/test_gpu_check_plan.py checks they are
    today's): the fused pass priced (issue 37: the step at its bound), so `zoexec run`'s
    --zo-kernel auto runs it on the GPU; pass 2 measured the torch path
    (benchmarks/gpu/repredict_pass2.py re-predicts that one)."""
    return ("--model", "opt-1.3b", "--gpus", "1", "--profile", profile, "--batch", "8",
            "--seq", "512", "--precision", "bf16", "--update-kernel", "fused",
            "--no-sensitivity")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for summary.json, summary.txt, "
                        "files.tar and profile.json")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_check-work"),
                        help="the stages' working folder (not returned; default %(default)s)")
    parser.add_argument("--stages", help="run only these stages, comma-separated (preflight "
                        "always runs first)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="end the check cleanly after this many seconds (default: the "
                             "sum of the ceilings)")
    parser.add_argument("--steps", type=int, default=60,
                        help="steps of each run stage (the baselines: a third of it)")
    parser.add_argument("--gpu-name", help="pick the plans for a GPU of this name instead "
                        "of preflight's (a dry run on the CPU: --gpu-name 'NVIDIA H100 80GB HBM3')")
    parser.add_argument("--device-kind", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the dry run (tiny shapes, the shipped cpu profile)")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the stages, their ceilings and the total; run nothing")
    parser.add_argument("--make-plans", action="store_true",
                        help="rewrite scripts/gpu_plans/KIND/ from each GPU kind's shipped profile")
    parser.add_argument("--hang-stage", help=argparse.SUPPRESS)   # test hook: these stages hang
    args = parser.parse_args()
    if args.plan_only:
        print(plan_only(args.device_kind))
        return
    if args.make_plans:
        make_plans()
        return
    if args.out is None:
        parser.error("--out is required")
    if args.deadline_s is None:
        args.deadline_s = budget_total(args.device_kind, selected_stages(args.stages)) \
            - sum(FIXED_S.values())
    sys.exit(check(args))


if __name__ == "__main__":
    main()
