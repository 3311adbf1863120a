"""Single-rank throughput of zoexec against the plain in-process MeZO loop.

Both train the same model (seeded random init) on the same batches with the same seeds
(zoexec.reference.mezo_reference_train follows the same z addresses), side by side in
this process: each round runs ours then the reference back to back and the median of
the rounds' ratios is reported, so that a busy machine hurts both alike. Tokens/s =
global batch x seq / step time (each token counted once, although both loops run two
forward passes). zoexec's step time is the median of its measured
steps after the first (warm-up); the reference's is the mean of its timed steps after a
warm-up step (it reports no per-step times).

    .venv/bin/python benchmarks/executor/bench_throughput.py --model opt-125m --batch 4 --seq 64

Prints one line per round and the ratio ours / reference (> 1: zoexec is faster).
Where zoexec gains on the CPU: z is drawn twice per block per step instead of four
times (the deferred update and the out-of-place perturbation need no restore pass), z
generation runs on all the rank's threads, and blocks move as one flat buffer.
"""

from __future__ import annotations

import argparse
import statistics
import time

from zoexec.runtime.hostenv import quiet_openmp

quiet_openmp()   # as `zoexec run` starts its ranks (both loops run in this process)
import torch  # noqa: E402

from zoexec.config import RunConfig
from zoexec.data.text import SyntheticTask
from zoexec.launch.spawn import run_in_process
from zoexec.model.families import build_hf_model
from zoexec.reference import mezo_reference_train
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload


def ours(args) -> tuple[float, list]:
    plan = hand_plan(model=args.model, layout=Layout(prefetch=1),
                     workload=Workload(batch=args.batch, seq=args.seq, param_dtype="fp32",
                                       compute_dtype="fp32"))
    cfg = RunConfig.make(plan=plan.data, steps=args.steps + 1, seed=args.seed, lr=args.lr,
                    eps=1e-3, threads=args.threads, quiet=True)
    records = run_in_process(cfg)
    return statistics.median(r.step_time_s for r in records[1:]), records


def reference(args) -> tuple[float, list]:
    spec = get_model(args.model)
    model = build_hf_model(spec, seed=args.seed)
    task = SyntheticTask(vocab=spec.vocab, seed=args.seed)
    batches = [task.batch(s, args.batch, args.seq) for s in range(args.steps + 1)]
    kw = dict(seed=args.seed, lr=args.lr, eps=1e-3, weight_decay=0.0)
    history = mezo_reference_train(model, batches[:1], steps=1, **kw)   # warm-up
    start = time.monotonic()
    timed = mezo_reference_train(model, batches[1:], steps=args.steps, **{**kw, "seed": args.seed + 1})
    return (time.monotonic() - start) / args.steps, history + timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="default: all cores")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokens = args.batch * args.seq
    ratios = []
    for round_index in range(args.rounds):
        t_ours, records = ours(args)
        t_ref, history = reference(args)
        ratios.append(t_ref / t_ours)
        print(f"round {round_index}: zoexec {tokens / t_ours:8.1f} tok/s ({t_ours:.3f} s/step)   "
              f"reference MeZO {tokens / t_ref:8.1f} tok/s ({t_ref:.3f} s/step)   "
              f"ratio {ratios[-1]:.2f}   step-0 loss {records[0].loss:.5f} vs "
              f"{sum(history[0][:2]) / 2:.5f}", flush=True)
    print(f"model {args.model} batch {args.batch} seq {args.seq} threads "
          f"{args.threads or torch.get_num_threads()}: zoexec / reference throughput = "
          f"{statistics.median(ratios):.2f}x (median of {args.rounds} rounds, each round "
          f"runs both loops back to back)")

if __name__ == "__main__":
    main()
