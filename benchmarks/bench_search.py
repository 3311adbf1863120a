"""How long `zoplan optimize` takes and what it predicts, from 8 to 65,536 GPUs (a fresh
process per run: imports count).

    .venv/bin/python benchmarks/bench_search.py [--repeats 3] [--profile dgx-a100-80gb]

OPT-175B on the DGX A100 profile: 8 GPUs at MeZO's batch of 16, then 1,024, 8,192 and
65,536 GPUs at a batch of one sequence per GPU (the issue's `--gpus 65536 --batch
65536`), 512 tokens each. For each: wall and CPU seconds of the run (CPU = user + sys
of the child: what the search costs when the machine is shared), the plan's size, the
winner, its predicted step and tokens/s, and its scaling efficiency against one node
(zoplan.sim.nodes: the same per-node plan on one node; the slowest node and the
inter-node all-reduce are what it loses). Goals on a 2-core machine: every run under
10 s, every plan under 1 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOPLAN = str(ROOT / ".venv" / "bin" / "zoplan")
CASES = ((8, 16), (1024, 1024), (8192, 8192), (65536, 65536))   # (GPUs, batch)
SEQ = 512
GOAL_S, GOAL_BYTES = 10.0, 1_000_000


def timed_run(args: list[str], output: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([ZOPLAN, "optimize", *args, "-q", "-o", output], check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench(repeats: int, profile: str) -> None:
    print(f"`zoplan optimize --model opt-175b --profile {profile} --seq {SEQ} -q` "
          f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}), {repeats} run(s) each")
    print(f"{'GPUs':>7} {'nodes':>6} {'batch':>7} {'wall s':>7} {'cpu s':>6} {'plan kB':>8} "
          f"{'step s':>7} {'tokens/s':>11} {'scaling':>8}  winner")
    missed = []
    with tempfile.TemporaryDirectory() as tmp:
        for gpus, batch in CASES:
            out = str(Path(tmp) / "plan.json")
            args = ["--model", "opt-175b", "--profile", profile, "--gpus", str(gpus),
                    "--batch", str(batch), "--seq", str(SEQ)]
            runs = [timed_run(args, out) for _ in range(repeats)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            size = Path(out).stat().st_size
            plan = json.loads(Path(out).read_text())
            pred, scaling = plan["predicted"], plan.get("scaling") or {}
            print(f"{gpus:>7,} {plan['search']['nodes']:>6,} {batch:>7,} {wall:>7.2f} {cpu:>6.2f} "
                  f"{size / 1e3:>8.0f} {pred['step_time_s']:>7.3f} {pred['tokens_per_s']:>11,.0f} "
                  f"{scaling.get('efficiency', 1.0):>8.1%}  {plan['candidates'][0]['label']}")
            if wall > GOAL_S or size > GOAL_BYTES:
                missed.append(f"{gpus} GPUs ({wall:.1f} s, {size / 1e3:.0f} kB)")
    print(f"goals (each run <= {GOAL_S:g} s, plan < {GOAL_BYTES / 1e6:g} MB): "
          + ("met" if not missed else "MISSED by " + ", ".join(missed)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", default="dgx-a100-80gb")
    args = parser.parse_args()
    bench(args.repeats, args.profile)


if __name__ == "__main__":
    main()
