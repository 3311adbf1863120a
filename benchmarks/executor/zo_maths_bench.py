"""CPU cost of the zeroth-order maths per million parameters (prints a table; not a test).

    .venv/bin/python benchmarks/executor/zo_maths_bench.py [--model opt-125m] [--reps 5]

Times, on one block of the model (shapes from the catalogue, no weights built):
z_block with 1..N threads, a single torch.randn over the whole block (the naive
alternative), perturb_into (theta + eps*z into a work buffer) and apply_update, and one
draw of each estimator's d (zoexec.maths.estimators: mezo's z, lowrank of rank 2 and
8, sparse; docs/estimators.md), side by side with z's.
Per step a block costs 2 z generations + 2 perturb_into + 1 apply_update here, against
4 z generations + 4 in-place passes in plain MeZO / ZO2's public code.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from zoexec.maths import zo
from zoexec.model.families import TensorSpec


def block_specs(model: str) -> list[TensorSpec]:
    """Specs of one block from the HF module built on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    from zoexec.model.families import _config_from, adapter_for, make_specs

    config = _config_from(model, "random")
    config.num_hidden_layers = 1
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    layers = adapter_for(config).get_layers(hf)
    return make_specs(list(layers[0].named_parameters()))


def timed_ms(fn, reps: int) -> float:
    """Best of `reps` runs (robust to other processes on a shared box)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    specs = block_specs(args.model)
    numel = specs[-1].stop
    mega = numel / 1e6
    z, theta, work = torch.empty(numel), torch.randn(numel), torch.empty(numel)
    print(f"{args.model}: block of {numel:,} params, {len(specs)} tensors; "
          f"cpus {os.cpu_count()}, torch threads {torch.get_num_threads()}")
    rows = []
    for threads in range(1, torch.get_num_threads() + 1):
        ms = timed_ms(lambda: zo.z_block(1, 0, specs, out=z, num_threads=threads), args.reps)
        rows.append((f"z_block, {threads} thread(s)", ms))
    gen = torch.Generator()
    rows.append(("torch.randn(out=) one call", timed_ms(lambda: torch.randn(numel, generator=gen, out=z), args.reps)))
    rows.append(("perturb_into", timed_ms(lambda: zo.perturb_into(work, theta, z, 1e-3), args.reps)))
    rows.append(("apply_update (wd)", timed_ms(lambda: zo.apply_update(
        theta, z, lr=1e-9, g=1.0, weight_decay=0.1, decay_mask_or_specs=specs), args.reps)))
    rows += estimator_rows(specs, theta, z, args.reps)
    for label, ms in rows:
        print(f"  {label:32s} {ms:9.2f} ms/block  {ms / mega:7.2f} ms per M params")


def estimator_rows(specs, theta, out, reps: int) -> list[tuple[str, float]]:
    """One draw of d of the block per estimator (the thread count torch has)."""
    from zoexec.maths.estimators import Directions
    from zoplan.estimators import EstimatorSpec

    rows = []
    for label, spec in (("d: mezo (z)", EstimatorSpec()),
                        ("d: lowrank, rank 2", EstimatorSpec(estimator="lowrank", lowrank_rank=2)),
                        ("d: lowrank, rank 8", EstimatorSpec(estimator="lowrank", lowrank_rank=8)),
                        ("d: sparse, share 0.25", EstimatorSpec(estimator="sparse"))):
        dirs = Directions(spec, run_seed=0, device="cpu", shapes=[t.shape for t in specs])
        rows.append((label, timed_ms(lambda d=dirs: d.fill(out, seed=1, step=0, block=0,
                                                           specs=specs, theta=theta), reps)))
    return rows


if __name__ == "__main__":
    main()
