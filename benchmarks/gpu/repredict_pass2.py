"""The H200's pass-2 traces re-predicted: the layouts the pass ran (its traces'
meta.json) with the workloads and placements of the plans it ran (run-*/plan.json,
OPT-1.3B bf16 8 x 512, every block offloaded / resident) simulated again on a profile (default the shipped hgx-h200) and compared, per task kind (median
task) and for the step (median over steps 1-19), with what the H200 measured
(benchmarks/results/h200-2026-12-04/pass2/run-*/trace).

    python benchmarks/gpu/repredict_pass2.py [--profile hgx-h200] [--kernel torch|fused]

`--kernel fused` prints what the fused pass (Workload.update_kernel) would predict for
the same runs: a prediction, nothing measured it yet. Not a timing of this machine:
tests/unit/test_gpu_repredict.py keeps the torch path within its tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from zoplan.calibrate.compare import step_span  # noqa: E402
from zoplan.hardware import HardwareProfile, load_profile  # noqa: E402
from zoplan.layout import Layout  # noqa: E402
from zoplan.plan import Plan  # noqa: E402
from zoplan.sim import costs as sim_costs  # noqa: E402
from zoplan.sim import graph  # noqa: E402
from zoplan.sim.simulate import simulate  # noqa: E402
from zoplan.trace import read_trace  # noqa: E402
from zoplan.workload import Workload  # noqa: E402

PASS2 = REPO / "benchmarks" / "results" / "h200-2026-12-04" / "pass2"
RUNS = ("offload", "resident")
KINDS = ("update", "forward", "head", "embed")


def measured(run: str, skip: int = 1) -> dict[str, float]:
    """The pass-2 trace of `run`: median seconds of one task per kind, and the step."""
    _, spans = read_trace(PASS2 / f"run-{run}" / "trace")
    kept = [s for s in spans if s.step >= skip]
    steps: dict[int, list] = {}
    for s in kept:
        steps.setdefault(s.step, []).append(s)
    out = {"step": statistics.median(step_span(v) for v in steps.values())}
    for kind in KINDS:
        out[kind] = statistics.median(s.dur_s for s in kept if s.kind == kind)
    return out


def predicted(run: str, profile: HardwareProfile, kernel: str = "torch") -> dict[str, float]:
    """The layout the trace ran (its meta.json) with the committed plan's model,
    workload and placement, simulated on `profile`: median task per kind, and the step."""
    plan = Plan.load(PASS2 / f"run-{run}" / "plan.json")   # the plan pass 2 ran
    meta, _ = read_trace(PASS2 / f"run-{run}" / "trace")
    workload = dataclasses.replace(plan.workload, update_kernel=kernel)
    if Workload.from_dict(meta["workload"]) != plan.workload:
        raise SystemExit(f"pass 2's {run} plan's workload is not the one its trace ran")
    resident = tuple(b["placement"] == "resident" for b in plan.data["blocks"])
    costs = sim_costs.step_costs(model=plan.model, profile=profile, workload=workload,
                                 layout=Layout.from_dict(meta["layout"]), resident=resident,
                                 period=0)
    result = simulate(graph.build_step_graph(costs))
    out = {"step": result.step_time_s}
    for kind in KINDS:
        out[kind] = statistics.median(s.dur_s for s in result.spans if s.kind == kind)
    return out


def split(run: str, profile: HardwareProfile, kernel: str = "torch") -> dict[str, tuple[float, float]]:
    """Per task kind of `run`: (device seconds, the host's seconds to issue it) of one
    task as priced (block tasks: block 0)."""
    plan = Plan.load(PASS2 / f"run-{run}" / "plan.json")
    meta, _ = read_trace(PASS2 / f"run-{run}" / "trace")
    workload = dataclasses.replace(plan.workload, update_kernel=kernel)
    resident = tuple(b["placement"] == "resident" for b in plan.data["blocks"])
    costs = sim_costs.step_costs(model=plan.model, profile=profile, workload=workload,
                                 layout=Layout.from_dict(meta["layout"]), resident=resident,
                                 period=0)
    device = {"update": costs.update_task_s(0), "forward": costs.forward_s,
              "head": costs.head_s, "embed": costs.embed_s}
    block = {"update": 0, "forward": 0, "head": -1, "embed": -1}
    return {kind: (device[kind], costs.issue(kind, block[kind], 0)) for kind in KINDS}


def table(profile: HardwareProfile, kernel: str = "torch") -> list[tuple[str, str, float, float]]:
    """(run, kind, predicted s, measured s) of both runs, step first."""
    rows = []
    for run in RUNS:
        pred, meas = predicted(run, profile, kernel), measured(run)
        rows.extend((run, kind, pred[kind], meas[kind]) for kind in ("step", *KINDS))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="hgx-h200")
    parser.add_argument("--kernel", default="torch", choices=("torch", "fused"))
    args = parser.parse_args()
    profile = load_profile(args.profile)
    print(f"pass-2 traces re-predicted on {profile.name} ({args.kernel} path), ms")
    print(f"{'run':<9} {'kind':<8} {'predicted':>10} {'measured':>9} {'error':>7}")
    for run, kind, pred, meas in table(profile, args.kernel):
        print(f"{run:<9} {kind:<8} {pred * 1e3:>10.3f} {meas * 1e3:>9.3f} "
              f"{100 * (pred - meas) / meas:>+6.1f}%")


if __name__ == "__main__":
    main()
