"""GPU check: plan, run and measure zoexec on this machine's first CUDA GPU.

0. profile `zoplan profile --quick -o RESULTS/profile.json` measures this GPU (default
          --profile measure); if that fails the shipped hgx-h200 profile is used.
1. plan   `zoplan optimize --model M --gpus 1 --profile P` when the planner's search is
          importable (it needs simpy); otherwise, or with --profile '', a hand-built
          one-GPU plan (zoplan.handplan: ZO2 layout, prefetch 2).
2. run    `python -m zoexec.cli run plan.json --steps N --trace DIR` (random init).
3. calibrate `zoplan calibrate plan.json trace`: predicted vs measured per task kind.
4. report tokens/s (median over the steps after the first), peak GPU memory, and the
          overlap achieved: the fraction of the h2d + d2h time that ran while the
          compute lane was busy (1.0 = all transfers hidden under compute).
Everything lands in the results folder: plan.json, trace/, run.log, summary.json.
Stages are functions reading and writing the same folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPUTE_KINDS = ("embed", "update", "forward", "head")
TRANSFER_KINDS = ("h2d", "d2h")


def measure_profile(args, folder: Path) -> str:
    """--profile measure: profile this GPU; fall back to a shipped profile on failure."""
    if args.profile != "measure":
        return args.profile
    out = folder / "profile.json"
    cmd = [sys.executable, "-m", "zoplan.cli", "profile", "--quick", "--name", "gpu-check",
           "-o", str(out)]
    print("$", " ".join(cmd), flush=True)
    with (folder / "profile.log").open("w") as handle:
        done = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
    print((folder / "profile.log").read_text()[-4000:], flush=True)
    if done.returncode or not out.exists():
        print("zoplan profile failed: planning with the shipped hgx-h200 profile instead")
        return "hgx-h200"
    return str(out)


def calibrate(plan: Path, trace: Path, profile: str, folder: Path) -> None:
    cmd = [sys.executable, "-m", "zoplan.cli", "calibrate", str(plan), str(trace)]
    if profile:
        cmd += ["--profile", profile]
    print("$", " ".join(cmd), flush=True)
    with (folder / "calibrate.log").open("w") as handle:
        subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                       env={**os.environ, "COLUMNS": "120"})
    print((folder / "calibrate.log").read_text()[-6000:], flush=True)


def make_plan(args, folder: Path) -> Path:
    """plan.json from the planner (with a profile) or built by hand."""
    plan = folder / "plan.json"
    if args.profile and not _has_search():
        print("zoplan's search is not importable here (simpy?): using a hand-built plan")
    if args.profile and _has_search():
        _run([sys.executable, "-m", "zoplan.cli", "optimize", "--model", args.model,
              "--gpus", "1", "--profile", args.profile, "--batch", str(args.batch),
              "--seq", str(args.seq), "--precision", args.precision, "-o", str(plan), "-q"],
             folder / "plan.log")
        return plan
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    workload = Workload(batch=args.batch, seq=args.seq, param_dtype=args.precision,
                        compute_dtype=args.precision)
    hand_plan(model=args.model, layout=Layout(prefetch=args.prefetch), workload=workload,
              device_kind=args.device_kind, profile_name="gpu-check-hand-built").save(plan)
    return plan


def _has_search() -> bool:
    try:
        import simpy  # noqa: F401

        import zoplan.search  # noqa: F401
    except ImportError:
        return False
    return True


def run_plan(args, plan: Path, folder: Path) -> Path:
    trace = folder / "trace"
    _run([sys.executable, "-m", "zoexec.cli", "run", str(plan), "--steps", str(args.steps),
          "--lr", str(args.lr), "--trace", str(trace), "--quiet"], folder / "run.log")
    return trace


def _run(cmd: list[str], log: Path) -> None:
    print("$", " ".join(cmd), flush=True)
    with log.open("w") as handle:
        done = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
    print(log.read_text()[-4000:], flush=True)
    if done.returncode:
        sys.exit(f"command failed with exit code {done.returncode}: see {log}")


def overlap(spans) -> tuple[float, float]:
    """(transfer seconds, seconds of it under a compute span) for one rank and step."""
    busy = sorted((s.start_s, s.end_s) for s in spans if s.kind in COMPUTE_KINDS)
    moved = hidden = 0.0
    for s in spans:
        if s.kind not in TRANSFER_KINDS:
            continue
        moved += s.dur_s
        hidden += sum(max(0.0, min(s.end_s, b) - max(s.start_s, a)) for a, b in busy)
    return moved, hidden


def summarise(args, plan: Path, trace: Path) -> dict:
    from zoplan.trace import read_trace

    meta, spans = read_trace(trace)
    records = meta["records"][1:] or meta["records"]
    steps = sorted({s.step for s in spans})[1:] or [0]
    moved = hidden = 0.0
    for step in steps:
        a, b = overlap([s for s in spans if s.step == step and s.rank == 0])
        moved, hidden = moved + a, hidden + b
    memory = meta["host_memory"][0]
    plan_data = json.loads(plan.read_text())
    return {"model": args.model, "layout": meta["layout"], "workload": meta["workload"],
            "steps": meta["steps"],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records),
            "step_time_s": statistics.median(r["step_time_s"] for r in records),
            "predicted_step_time_s": plan_data["predicted"]["step_time_s"],
            "gpu_peak_allocated_gib": memory.get("gpu_peak_allocated", 0) / 2**30,
            "gpu_peak_reserved_gib": memory.get("gpu_peak_reserved", 0) / 2**30,
            "predicted_gpu_mem_gib": plan_data["predicted"]["gpu_mem_bytes"] / 2**30,
            "transfer_s_per_step": moved / len(steps),
            "overlap_fraction": hidden / moved if moved else 0.0,
            "store_pinned": memory.get("store_pinned"),
            "losses": [r["loss"] for r in meta["records"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-1.3b")
    parser.add_argument("--profile", default="measure",
                        help="'measure' (zoplan profile this GPU), a profile name/path, "
                             "or '' for a hand-built plan")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-7)
    parser.add_argument("--results", type=Path, required=True, help="output folder")
    parser.add_argument("--device-kind", default="cuda", help="cpu: dry run of this script")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    args.profile = measure_profile(args, args.results)
    plan = make_plan(args, args.results)
    trace = run_plan(args, plan, args.results)
    if args.profile:
        calibrate(plan, trace, args.profile, args.results)
    summary = summarise(args, plan, trace)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['model']} {summary['workload']}: {summary['tokens_per_s']:,.0f} tokens/s "
          f"({summary['step_time_s']:.3f} s/step, predicted {summary['predicted_step_time_s']:.3f}); "
          f"peak GPU memory {summary['gpu_peak_allocated_gib']:.2f} GiB allocated "
          f"({summary['gpu_peak_reserved_gib']:.2f} reserved, predicted "
          f"{summary['predicted_gpu_mem_gib']:.2f}); h2d+d2h {summary['transfer_s_per_step']:.3f} "
          f"s/step, {100 * summary['overlap_fraction']:.0f}% hidden under compute")


if __name__ == "__main__":
    main()
