"""Seconds per step of full-parameter and LoRA MeZO, side by side, on this CPU.

Both are zoexec runs of one rank in this process (run_in_process), on the same model
(seeded random init, fp32), batches and seeds, every block offloaded; the LoRA run
trains r 8, alpha 16 adapters on q_proj and v_proj (MeZO's LoRA setting). Each round
runs full then LoRA back to back, and the medians of the rounds are reported, so that
a busy machine hurts both alike. A step's time is the median of its measured steps
after the first (warm-up). Also printed: the size of what each run saves (final/).

    .venv/bin/python benchmarks/executor/bench_lora.py --model opt-125m --batch 4 --seq 64

Where LoRA gains on the CPU: z is drawn for the adapters only (0.3% of an OPT-125m
block) instead of the whole block, there is no update pass over the block, no
write-back, and the resident parts (embeddings, head) are neither perturbed nor updated.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from zoexec.runtime.hostenv import quiet_openmp

quiet_openmp()   # as `zoexec run` starts its ranks
from zoexec.config import RunConfig  # noqa: E402
from zoexec.launch.spawn import run_in_process  # noqa: E402
from zoplan.handplan import hand_plan  # noqa: E402
from zoplan.layout import Layout  # noqa: E402
from zoplan.workload import Workload  # noqa: E402


def one_run(args, tuning: str, out: Path) -> float:
    extra = {"tuning": "lora"} if tuning == "lora" else {}
    workload = Workload(batch=args.batch, seq=args.seq, param_dtype="fp32",
                        compute_dtype="fp32", **extra)
    plan = hand_plan(model=args.model, layout=Layout(prefetch=1), workload=workload)
    cfg = RunConfig.make(plan=plan.data, steps=args.steps + 1, seed=args.seed, lr=1e-6,
                         eps=1e-3, threads=args.threads, quiet=True, out=str(out),
                         overwrite=True)
    records = run_in_process(cfg)
    return statistics.median(r.step_time_s for r in records[1:])


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"full": [], "lora": []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            for tuning in times:
                times[tuning].append(one_run(args, tuning, Path(tmp) / tuning))
            print(f"round {index + 1}: full {times['full'][-1]:.3f} s/step, "
                  f"lora {times['lora'][-1]:.3f} s/step", flush=True)
        sizes = {t: folder_bytes(Path(tmp) / t / "final") for t in times}
    full, lora = (statistics.median(times[t]) for t in ("full", "lora"))
    print(f"{args.model} batch {args.batch} x seq {args.seq}, one rank, every block offloaded")
    print(f"  full MeZO  {full:.3f} s/step   final/ {sizes['full'] / 1e6:,.1f} MB")
    print(f"  LoRA MeZO  {lora:.3f} s/step   final/ {sizes['lora'] / 1e6:,.2f} MB")
    print(f"  LoRA / full step time: {lora / full:.2f}")


if __name__ == "__main__":
    main()
