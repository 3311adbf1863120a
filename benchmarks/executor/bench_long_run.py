"""Memory over a long run: does a rank's RSS stay flat step after step, with and
without --trace? (Spans are written by each rank to its own file as the run goes,
zoplan.trace.SpanWriter; nothing grows with the steps.)

Runs a tiny random model (tiny-opt; `--layers N` for a deeper copy of it, every block
offloaded) for `--steps` steps on `--ranks` local CPU ranks (DDP), once without and
once with --trace (each in a process of its own), and samples each rank's RSS as the
log passes every `--every` steps.

    .venv/bin/python benchmarks/executor/bench_long_run.py                  # 100,000 steps, 1 rank
    .venv/bin/python benchmarks/executor/bench_long_run.py --only no-trace   # without --trace only
    .venv/bin/python benchmarks/executor/bench_long_run.py --steps 3000 --ranks 2 --layers 40
    .venv/bin/python benchmarks/executor/bench_long_run.py --history   # the step history alone
    .venv/bin/python benchmarks/executor/bench_long_run.py --only no-trace --steps 2000 \
        --warmup 500 --every 500 --tracemalloc     # what the Python heap gained, by line

Prints each sample as it is taken ("sample: step N, RSS (MiB) ..."), then per run and
rank: RSS at the first sample after warm-up (`--warmup` steps), at
the end, the growth per 1,000 steps between them (least-squares slope over the
samples), the end against the steady RSS (the median of the samples) in percent, and
each against its limit: less than 1 MiB grown after warm-up, no sample more than 5%
above the steady RSS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from zoexec.config import RunConfig
from zoexec.launch.spawn import run_in_process, spawn_local
from zoplan.catalogue import CATALOGUE_CONFIGS
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

MIB = 2**20
# the limits a long run is held to (after warm-up, per rank): total growth, and the
# highest sample above the steady RSS
GROWTH_MIB, ABOVE_PCT = 1.0, 5.0
TAIL = 200   # steps run after the last one sampled


def _model(folder: Path, layers: int | None) -> str:
    if layers is None:
        return "tiny-opt"
    path = folder / "config.json"
    path.write_text(json.dumps({**CATALOGUE_CONFIGS["tiny-opt"], "num_hidden_layers": layers}))
    return str(path)


def _ranks(me: psutil.Process, ranks: int) -> list[psutil.Process]:
    """The rank processes: this one (one rank runs in process) or the spawned ones."""
    if ranks == 1:
        return [me]
    return sorted((p for p in me.children(recursive=True) if p.name().startswith("zoexec-rank")
                   or "rank" in " ".join(p.cmdline())), key=lambda p: p.pid)[:ranks]


def _sampler(log: Path, ranks: int, samples: dict, stop: threading.Event, every: int,
             limit: int, snapshots: list | None = None) -> None:
    """RSS of each rank each time the log passes a multiple of `every` steps (and, with
    `snapshots`, a tracemalloc snapshot: one rank, in this process)."""
    me, seen, done, file = psutil.Process(), 0, 0, None
    while not stop.is_set():
        time.sleep(0.05)
        if file is None:    # the log read as it grows, not whole each time (with one
            if not log.exists():   # rank, the sampler's allocations are in the process
                continue           # it measures)
            file = log.open("rb")
        done += file.read().count(b"\n")
        if done // every > seen // every and seen < limit:
            try:
                samples[done] = [p.memory_info().rss for p in _ranks(me, ranks)]
            except psutil.Error:
                pass
            else:   # as it goes: a run stopped early still leaves its figures
                print(f"sample: step {done}, RSS (MiB) "
                      + ", ".join(f"{r / MIB:.3f}" for r in samples[done]), flush=True)
            if snapshots is not None:
                import tracemalloc

                snapshots.append((done, tracemalloc.take_snapshot()))
        seen = done
    if file is not None:
        file.close()


def run_once(*, steps: int, ranks: int, layers: int | None, trace: bool, every: int,
             snapshots: list | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        plan = hand_plan(model=_model(tmp, layers), layout=Layout(ddp=ranks),
                         workload=Workload(batch=2 * ranks, seq=16, param_dtype="fp32",
                                           compute_dtype="fp32"))
        # TAIL steps more than measured: the last sample (step `steps`) is taken while
        # the run still trains, not while it writes final/
        # no snapshot inside the run (save_every past its end): a 100,000-step run with
        # save_every 100,000 wrote checkpoint-100000 as its last sample was taken, and
        # the RSS of that sample held the snapshot's buffers (+1.5 MiB)
        cfg = RunConfig.make(plan=plan.data, steps=steps + TAIL, lr=1e-4, quiet=True, threads=1,
                             out=str(tmp / "run"), save_every=str(steps + TAIL + 1),
                             trace=str(tmp / "trace") if trace else None, speed_checks=False)
        samples: dict[int, list[int]] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_sampler, args=(tmp / "run" / "losses.jsonl", ranks,
                                                          samples, stop, every, steps, snapshots),
                                   daemon=True)
        sampler.start()
        try:
            (run_in_process if ranks == 1 else spawn_local)(cfg)
        finally:
            stop.set()
            sampler.join()
        return samples


def report(name: str, samples: dict, warmup: int) -> None:
    steps = sorted(s for s in samples if s >= warmup)
    if len(steps) < 2:
        print(f"{name}: too few samples after warm-up ({sorted(samples)})")
        return
    for rank in range(len(samples[steps[0]])):
        rss = [samples[s][rank] for s in steps]
        slope = statistics.linear_regression(steps, rss).slope * 1000
        steady = statistics.median(rss)
        grown, above = (rss[-1] - rss[0]) / MIB, 100 * (max(rss) / steady - 1)
        print(f"{name} rank {rank}: RSS (MiB) by step: "
              + ", ".join(f"{s}: {r / MIB:.1f}" for s, r in zip(steps, rss)))
        print(f"{name} rank {rank}: RSS {rss[0] / MIB:.1f} MiB at step {steps[0]}, "
              f"{rss[-1] / MIB:.1f} MiB at step {steps[-1]}; growth {slope / MIB:+.3f} MiB per "
              f"1,000 steps; end {100 * (rss[-1] / steady - 1):+.2f}% against the steady "
              f"{steady / MIB:.1f} MiB (the median sample)")
        print(f"{name} rank {rank}: grew {grown:+.2f} MiB after warm-up "
              f"({'within' if grown < GROWTH_MIB else 'OVER'} the {GROWTH_MIB} MiB limit); "
              f"highest sample {above:+.2f}% above the steady RSS "
              f"({'within' if above <= ABOVE_PCT else 'OVER'} the {ABOVE_PCT}% limit)")


def heap_growth(snapshots: list, warmup: int, top: int = 12) -> None:
    """What the Python heap gained between the first snapshot after warm-up and the last,
    by line (tracemalloc)."""
    after = [(step, snap) for step, snap in snapshots if step >= warmup]
    if len(after) < 2:
        print(f"tracemalloc: too few snapshots after warm-up ({[s for s, _ in snapshots]})")
        return
    (first, a), (last, b) = after[0], after[-1]
    stats = b.compare_to(a, "lineno")
    total = sum(stat.size_diff for stat in stats)
    print(f"tracemalloc: the Python heap grew {total / 1024:+.1f} KiB from step {first} to {last} "
          f"({total / (last - first):+.1f} bytes a step); the largest changes:")
    for stat in sorted(stats, key=lambda st: -abs(st.size_diff))[:top]:
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {stat.traceback}")


def history_memory(steps: int) -> None:
    """What the step history of `steps` steps holds in memory (tracemalloc), the one
    record a step that a run keeps (zoexec.maths.history.StepHistory)."""
    import tracemalloc

    from zoexec.maths.history import StepHistory, StepRecord

    tracemalloc.start()
    history = StepHistory()
    for step in range(steps):
        history.append(StepRecord(step=step, seed=step, loss_plus=1.0, loss_minus=1.0, g=0.1,
                                  lr=1e-3, tokens_per_s=1.0, step_time_s=0.01))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert history[0].step == 0 and history[-1].step == steps - 1
    print(f"step history of {steps:,} steps: {held / MIB:.3f} MiB held in memory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=5000)
    parser.add_argument("--every", type=int, default=5000, help="steps between RSS samples")
    parser.add_argument("--only", choices=("trace", "no-trace"), default=None)
    parser.add_argument("--tracemalloc", action="store_true",
                        help="one rank: also diff the Python heap between the samples after "
                             "warm-up (slower steps)")
    parser.add_argument("--history", action="store_true",
                        help="only print what the step history of --steps steps holds in memory")
    args = parser.parse_args()
    if args.history:
        history_memory(args.steps)
        return
    if args.only is None:   # each in a fresh process: the second run must not find the
        for only in ("no-trace", "trace"):   # heap the first one grew
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only", only], check=True)
        return
    for trace in (False, True):
        name = "--trace" if trace else "no trace"
        if args.only and args.only != ("trace" if trace else "no-trace"):
            continue
        start = time.monotonic()
        snapshots: list | None = None
        if args.tracemalloc and args.ranks == 1:
            import tracemalloc

            tracemalloc.start()
            snapshots = []
        samples = run_once(steps=args.steps, ranks=args.ranks, layers=args.layers, trace=trace,
                           every=args.every, snapshots=snapshots)
        print(f"{name}: {args.steps} steps, {args.ranks} rank(s), "
              f"{args.layers or 'tiny-opt'} layers, {time.monotonic() - start:.0f} s")
        report(name, samples, args.warmup)
        if snapshots is not None:
            heap_growth(snapshots, args.warmup)


if __name__ == "__main__":
    main()
