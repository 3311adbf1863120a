"""How long `zoplan optimize` takes and what it predicts, from 8 to 65,536 GPUs (a fresh
process per run: start-up and imports count), beside an earlier version of the planner.

    .venv/bin/python benchmarks/planner/bench_search.py [--repeats 3] [--profile dgx-a100-80gb]
        [--before DIR]

OPT-175B on the DGX A100 profile: 8 GPUs at MeZO's batch of 16, then 1,024, 8,192 and
65,536 GPUs at a batch of one sequence per GPU, 512 tokens each. For each: wall and CPU
seconds of the run (CPU = user + sys of the child: what the search costs when the
machine is shared; on a busy machine wall time is CPU time plus waiting for a core),
the plan's size, the winner, its predicted step and tokens/s, and its scaling
efficiency against one node (zoplan.sim.nodes).

--before DIR: an earlier planner to time beside this one, in the same run (so under
the same load): a folder holding its `zoplan/` package, e.g.
    git archive f400b89 zoplan | tar -x -C /tmp/before
Each case then runs with it too (same interpreter, PYTHONPATH=DIR) and the table shows
its times and the ratio now / before.

Both run as `python -m zoplan.cli optimize ...` after one untimed run each, so their
byte code is cached as on an installed machine (PYTHONDONTWRITEBYTECODE is cleared for
the children). Goals (issue 27), wall and CPU, each run: OPT-175B x 8 under 1 s,
65,536 GPUs under 2 s; every plan under 1 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = ((8, 16), (1024, 1024), (8192, 8192), (65536, 65536))   # (GPUs, batch)
SEQ = 512
GOAL_S = {8: 1.0, 65536: 2.0}   # seconds per run, wall and CPU
GOAL_BYTES = 1_000_000


def child_env(tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def timed_run(args: list[str], output: str, tree: Path | None) -> tuple[float, float]:
    """(wall, CPU) seconds of one `zoplan optimize` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zoplan.cli", "optimize", *args, "-q", "-o", output],
                   check=True, env=child_env(tree), cwd=tree or None)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_run(args: list[str], output: str, tree: Path | None, repeats: int) -> tuple[float, float]:
    runs = [timed_run(args, output, tree) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def bench(repeats: int, profile: str, before: Path | None) -> None:
    print(f"`python -m zoplan.cli optimize --model opt-175b --profile {profile} --seq {SEQ} -q` "
          f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}), median of {repeats} run(s)"
          + (f"; before: {before}" if before else ""))
    head = f"{'GPUs':>7} {'nodes':>6} {'batch':>7} {'wall s':>7} {'cpu s':>6}"
    if before:
        head += f" {'before wall':>11} {'cpu':>5} {'now/before cpu':>14}"
    print(head + f" {'plan kB':>8} {'step s':>7} {'tokens/s':>11} {'scaling':>8}  winner")
    missed = []
    with tempfile.TemporaryDirectory() as tmp:
        for gpus, batch in CASES:
            out = str(Path(tmp) / "plan.json")
            args = ["--model", "opt-175b", "--profile", profile, "--gpus", str(gpus),
                    "--batch", str(batch), "--seq", str(SEQ)]
            timed_run(args, out, None)   # byte code cached, files warm
            wall, cpu = median_run(args, out, None, repeats)
            line = f"{gpus:>7,} {{nodes:>6,}} {batch:>7,} {wall:>7.2f} {cpu:>6.2f}"
            if before:
                old = str(Path(tmp) / "before.json")
                timed_run(args, old, before)
                b_wall, b_cpu = median_run(args, old, before, repeats)
                line += f" {b_wall:>11.2f} {b_cpu:>5.2f} {cpu / b_cpu:>14.2f}"
            size = Path(out).stat().st_size
            plan = json.loads(Path(out).read_text())
            pred, scaling = plan["predicted"], plan.get("scaling") or {}
            print(line.format(nodes=plan["search"]["nodes"])
                  + f" {size / 1e3:>8.0f} {pred['step_time_s']:>7.3f} {pred['tokens_per_s']:>11,.0f} "
                  f"{scaling.get('efficiency', 1.0):>8.1%}  {plan['candidates'][0]['label']}")
            goal = GOAL_S.get(gpus)
            if (goal and max(wall, cpu) > goal) or size > GOAL_BYTES:
                missed.append(f"{gpus} GPUs ({wall:.2f} s wall, {cpu:.2f} s CPU, {size / 1e3:.0f} kB)")
    goals = ", ".join(f"{g:,} GPUs < {s:g} s" for g, s in GOAL_S.items())
    print(f"goals ({goals}, wall and CPU; plans < {GOAL_BYTES / 1e6:g} MB): "
          + ("met" if not missed else "MISSED by " + ", ".join(missed)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", default="dgx-a100-80gb")
    parser.add_argument("--before", type=Path, default=None,
                        help="a folder holding an earlier zoplan/ package to time beside this one")
    args = parser.parse_args()
    if args.before is not None and not (args.before / "zoplan" / "cli.py").is_file():
        sys.exit(f"error: --before {args.before} holds no zoplan/cli.py")
    bench(args.repeats, args.profile, args.before)


if __name__ == "__main__":
    main()
