"""The address space a one-rank `zoexec run` reaches (VmPeak) with 1 and 2 torch
threads: the figures behind zoexec.launch.limits' NEED_AS_BASE and NEED_AS_PER_THREAD.

    python benchmarks/executor/bench_limits.py

A tiny random-init OPT model, 3 steps, in a fresh interpreter each; prints VmPeak and
VmHWM (peak resident) in kB and the per-thread difference, beside the figures
zoexec.launch.limits holds.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = """
import atexit, sys
def peak():
    figures = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/status')
               if l.startswith(('VmPeak', 'VmHWM'))}
    sys.stderr.write(f"PEAK {figures['VmPeak']} {figures['VmHWM']}\\n")
atexit.register(peak)
sys.argv = ['zoexec'] + sys.argv[1:]
from zoexec.cli import main
main()
"""


def vm_peak(plan: Path, threads: int) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", CHILD, "run", str(plan), "--init", "random",
                           "--steps", "3", "--threads", str(threads), "-q"],
                          capture_output=True, text=True, cwd=plan.parent)
    line = next(x for x in done.stderr.splitlines() if x.startswith("PEAK"))
    _, peak, hwm = line.split()
    return int(peak), int(hwm)


def main() -> None:
    from zoexec.launch.limits import NEED_AS_BASE, NEED_AS_PER_THREAD
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        hand_plan(model="tiny-opt", layout=Layout(),
                  workload=Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")).save(plan)
        one, two = vm_peak(plan, 1), vm_peak(plan, 2)
    print(f"VmPeak --threads 1: {one[0]:,} kB (resident peak {one[1]:,} kB)")
    print(f"VmPeak --threads 2: {two[0]:,} kB (resident peak {two[1]:,} kB)")
    print(f"per further thread: {two[0] - one[0]:,} kB")
    print(f"zoexec.launch.limits: NEED_AS_BASE {NEED_AS_BASE // 1024:,} kB, "
          f"NEED_AS_PER_THREAD {NEED_AS_PER_THREAD // 1024:,} kB")


if __name__ == "__main__":
    main()
