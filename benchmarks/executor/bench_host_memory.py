"""Host memory of the local ranks: the node's blocks are held ONCE, not once per rank.

Runs a DDP plan with `--ranks` local CPU ranks (default 2) on a random model (default
opt-125m, fp32), then reads what each rank measured of itself at the end of training
(psutil memory_full_info + the PSS of its mapping of the block store, in the trace's
meta.json) and the PSS of a baseline process forked from the same forkserver (torch
and transformers imported, no model).

    .venv/bin/python benchmarks/executor/bench_host_memory.py --model opt-125m --ranks 2

Prints
- store ratio: sum over ranks of the PSS of the store mapping / one copy of the blocks
  (1.00 = the blocks exist once; private copies would give `ranks`);
- total ratio: (sum of the ranks' PSS - ranks x baseline PSS) / one copy of the blocks,
  and the private part of each rank next to zoplan.memory's figures for a CPU rank (its
  "device" memory is host memory: block buffers, the working block and its z, the
  resident parts clean, perturbed and z, a step's hidden states; rank_memory's
  steady_bytes, what a rank holds through a step, and its peak, which adds the largest
  transient: glibc returns freed blocks of 32 MiB or more to the OS, so the PSS read
  at the end of the run shows the held figure plus what the allocator keeps), and the
  node's total next to the store plus every rank's held bytes.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from zoexec.config import RunConfig
from zoexec.launch.spawn import _context, spawn_local
from zoplan.handplan import hand_plan
from zoplan.hostmemory import node_host_memory
from zoplan.layout import Layout
from zoplan.memory import rank_memory
from zoplan.models import get_model
from zoplan.trace import read_trace
from zoplan.workload import Workload

MIB = 2**20


def _baseline(queue) -> None:
    import psutil

    import zoexec.train.engine  # noqa: F401 - what a rank has imported before it builds anything

    queue.put(psutil.Process().memory_full_info().pss)


def baseline_pss(family: str) -> int:
    ctx = _context(family)
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=_baseline, args=(queue,))
    proc.start()
    proc.join()
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()
    spec, layout = get_model(args.model), Layout(ddp=args.ranks, prefetch=1)
    workload = Workload(batch=args.ranks, seq=args.seq, param_dtype="fp32", compute_dtype="fp32")
    plan = hand_plan(model=spec, layout=layout, workload=workload)
    with tempfile.TemporaryDirectory() as tmp:
        # the trace carries the memory figures; the speed checks would add rank 0's probe
        cfg = RunConfig.make(plan=plan.data, steps=args.steps, lr=1e-6, quiet=True,
                        trace=str(Path(tmp) / "trace"), run_id=uuid.uuid4().hex[:12],
                        speed_checks=False)
        spawn_local(cfg)
        meta, _ = read_trace(Path(tmp) / "trace")
    report(meta["host_memory"], spec=spec, layout=layout, workload=workload,
           base=baseline_pss(spec.family))


def report(ranks: list[dict], *, spec, layout, workload, base: int) -> None:
    blocks = spec.num_layers * spec.block_bytes(workload.param_dtype)
    store_pss = sum(r["store_pss"] for r in ranks)
    total = sum(r["pss"] for r in ranks) - len(ranks) * base
    shape = dict(model=spec, workload=workload, layout=layout, device_kind="cpu")
    rank = rank_memory(**shape)
    node = {t.key: t.bytes for t in node_host_memory(**shape).steady}
    print(f"model {spec.name}: {spec.num_layers} blocks = {blocks / MIB:.1f} MiB (one copy), "
          f"{len(ranks)} local ranks, baseline process PSS {base / MIB:.1f} MiB")
    print(f"zoplan.memory per rank: {rank.allocated_bytes / MIB:.1f} MiB at its peak "
          f"({rank.peak_phase}; " + ", ".join(f"{t.label} {t.bytes / MIB:.1f}"
                                               for t in rank.peak_terms() if t.bytes >= MIB)
          + f"), {rank.steady_bytes / MIB:.1f} MiB held through a step (freed blocks of "
          f"32 MiB or more go back to the OS, so PSS at the end shows this)")
    for r in ranks:
        private = r["pss"] - base - r["store_pss"]
        print(f"  pid {r['pid']}: PSS {r['pss'] / MIB:8.1f} MiB  USS {r['uss'] / MIB:8.1f} MiB  "
              f"store PSS {r['store_pss'] / MIB:7.1f} MiB (RSS {r['store_rss'] / MIB:.1f})  "
              f"private beyond baseline {private / MIB:7.1f} MiB "
              f"(zoplan.memory: {private / rank.steady_bytes:.2f}x held, "
              f"{private / rank.allocated_bytes:.2f}x peak)")
    modelled = node["blocks"] + len(ranks) * rank.steady_bytes
    print(f"store ratio: sum of store PSS / one copy of the blocks = {store_pss / blocks:.2f} "
          f"(per-rank private copies would give {len(ranks)}.00)")
    print(f"total ratio: (sum of rank PSS - {len(ranks)} x baseline) / one copy of the blocks "
          f"= {total / blocks:.2f}")
    print(f"node: sum of rank PSS - {len(ranks)} x baseline = {total / MIB:.1f} MiB; "
          f"zoplan.memory's store + ranks x held = {modelled / MIB:.1f} MiB "
          f"({total / modelled:.2f}x)")


if __name__ == "__main__":
    main()
