"""zoexec against MeZO and ZO2 (zoexec.baselines) on this machine's CPU: the same model,
batch, precision and synthetic data, one after the other in this process, each the
median of its steps after the first (warm-up). zoexec runs a one-rank plan with every
block offloaded (its store; in 16-bit its default update, stochastic rounding) and one with
every block resident; MeZO and ZO2 run as their code runs (docs/gpu.md: The baselines).
The GPU check's `baselines` stage makes the same comparison on a GPU.

    .venv/bin/python benchmarks/gpu/baselines_cpu.py --model tiny-opt --batch 2 --seq 64 --steps 6

Prints seconds a step for each and zoexec's step over each baseline's (below 1:
zoexec is faster). A CPU has no link to hide and no streams: this compares the zo
maths and the host's work, not the schedule.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from zoexec.runtime.hostenv import quiet_openmp

quiet_openmp()


def zoexec_step(model: str, batch: int, seq: int, dtype: str, steps: int, resident: bool) -> float:
    from zoexec.config import RunConfig
    from zoexec.launch.spawn import run_in_process
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.models import get_model
    from zoplan.workload import Workload

    spec = get_model(model)
    wl = Workload(batch=batch, seq=seq, param_dtype=dtype, compute_dtype=dtype)
    blocks = tuple(range(spec.num_layers)) if resident else ()
    plan = hand_plan(model=spec, layout=Layout(), workload=wl, resident=blocks)
    records = run_in_process(RunConfig.make(plan=plan.data, steps=steps, lr=1e-6, quiet=True,
                                            speed_checks=False))
    return statistics.median(r.step_time_s for r in records[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-opt")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from zoexec.baselines.common import BaselineConfig
    from zoexec.baselines.mezo import run_mezo
    from zoexec.baselines.zo2 import run_zo2

    shape = dict(model=args.model, batch=args.batch, seq=args.seq, dtype=args.dtype,
                 steps=args.steps)
    got = {"zoexec offloaded": zoexec_step(**shape, resident=False),
           "zoexec resident": zoexec_step(**shape, resident=True),
           "mezo": run_mezo(BaselineConfig(**shape))[0].step_s,
           "zo2": run_zo2(BaselineConfig(**shape))[0].step_s}
    print(f"{args.model}, {args.batch} x {args.seq}, {args.dtype}, CPU, median of "
          f"{args.steps - 1} steps:")
    for name, seconds in got.items():
        print(f"  {name:17s} {seconds * 1e3:9.2f} ms a step")
    for mine, theirs in (("zoexec offloaded", "zo2"), ("zoexec resident", "mezo")):
        print(f"  {mine} / {theirs}: {got[mine] / got[theirs]:.3f}")


if __name__ == "__main__":
    main()
