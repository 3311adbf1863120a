"""How long `zoplan optimize` takes, end to end (a fresh process: imports count).

    .venv/bin/python benchmarks/bench_search.py [--repeats 3]

Goals (2-core machine): OPT-175B on 8 GPUs of dgx-a100-80gb <= 2 s (goal 1 s);
1024 GPUs (128 nodes, batch 1024) <= 10 s. Prints wall and CPU seconds of each run
(CPU = user + sys of the child: what the search costs when the machine is shared),
then a breakdown of one search by phase, measured in-process.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOPLAN = str(ROOT / ".venv" / "bin" / "zoplan")
CASES = {
    "opt-175b, 8 GPUs": (["--model", "opt-175b", "--gpus", "8"], 2.0),
    "opt-175b, 1024 GPUs (128 nodes, batch 1024)":
        (["--model", "opt-175b", "--gpus", "1024", "--batch", "1024"], 10.0),
    "llama-2-70b, 8 GPUs, 8x-rtx4090 (host fabric)":
        (["--model", "llama-2-70b", "--gpus", "8", "--profile", "8x-rtx4090"], None),
}


def timed_run(args: list[str], output: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([ZOPLAN, "optimize", *args, "-q", "-o", output], check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def bench_cli(repeats: int) -> None:
    print(f"end-to-end `zoplan optimize ... -q` ({os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}), {repeats} runs each")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (args, goal) in CASES.items():
            runs = [timed_run(args, str(Path(tmp) / "plan.json")) for _ in range(repeats)]
            walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
            verdict = "" if goal is None else (
                f"  goal <= {goal:g} s: {'met' if min(walls) <= goal else 'MISSED'}")
            print(f"  {name:48s} wall median {statistics.median(walls):.2f} s "
                  f"(min {min(walls):.2f}), cpu median {statistics.median(cpus):.2f} s{verdict}")


def bench_phases() -> None:
    """Where the time of one OPT-175B search goes (in-process, CPU seconds)."""
    clock = time.process_time
    t0 = clock()
    from zoplan.search import build_plan, space
    from zoplan.search import evaluate as E
    t1 = clock()
    req = space.resolve_request(model="opt-175b", gpus=8, profile=None, batch=16, seq=512)
    candidates, pruned = space.enumerate_space(req, req.fixed)
    cache: dict = {}
    ranked, by_bound = E.branch_and_bound(candidates, cache)
    t2 = clock()
    ranked = E.pick_winner(ranked)
    t3 = clock()
    unsliced, _ = E._unsliced_baseline(req, ranked, cache)
    zo2 = E.zo2_baseline(req)
    t4 = clock()
    result = E.SearchResult(request=req, ranked=ranked, pruned=pruned + by_bound, zo2=zo2,
                            unsliced=unsliced, unsliced_reason="")
    text = build_plan(result).to_json()
    t5 = clock()
    win = result.winner
    print("phases of one opt-175b / 8-GPU search (CPU s): "
          f"imports {t1 - t0:.3f}, branch and bound {t2 - t1:.3f} "
          f"({len(ranked)} simulated, {len(by_bound)} pruned by bound), "
          f"full simulation of the winner {t3 - t2:.3f}, baselines {t4 - t3:.3f}, "
          f"plan JSON {t5 - t4:.3f} ({len(text) / 1e3:.0f} kB)")
    print(f"  winner {win.label}: {win.step_time_s:.3f} s/step, lower bound "
          f"{win.bounds.lower_bound_s:.3f} s, ZO2 {zo2.step_time_s:.3f} s "
          f"({zo2.step_time_s / win.step_time_s:.2f}x), unsliced {unsliced.label} "
          f"{unsliced.step_time_s:.3f} s, GPU {win.memory.gpu_bytes / 2**30:.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    bench_cli(args.repeats)
    bench_phases()


if __name__ == "__main__":
    main()
