"""The accuracy benchmark's tuning side (`bench_accuracy.py --tuning lora|prefix`): an lr
sweep of short zoexec runs, each evaluated after its last step, to pick the rate the
3-seed runs then use.

`--parts sweep --tuning lora --grid 3e-4,1e-3,3e-3 --grid-steps 80 --eval-samples 100`
runs `zoexec run` of the plan for that tuning (`zoplan optimize --tuning lora`) at each
rate for --grid-steps steps, evaluates --eval-samples held-out sentences (drawn with a
fixed seed, the same for every rate) after the last step, and records the training
loss (first and last fifth), the held-out accuracy and loss and the seconds per step.
The zero-shot figure on the same sentences is `zoexec eval` of the base with the same
--eval-samples. eps defaults to MeZO's for the tuning: 1e-3 full, 1e-2 LoRA, 1e-1 prefix
(its README's runs: `MODE=lora LR=5e-5 EPS=1e-2`, `MODE=prefix LR=1e-3 EPS=1e-1`).
"""

from __future__ import annotations

import statistics

from accuracy_zoexec import step_seconds

TUNINGS = ("full", "lora", "prefix")
EPS = {"full": 1e-3, "lora": 1e-2, "prefix": 1e-1}   # MeZO's runs (arXiv 2305.17333; its code)


def sweep_name(args, lr: float) -> str:
    words = "-".join("".join(c for c in w if c.isalnum()) or "w" for w in args.label_words)
    return f"sweep-{args.tuning}-{words}-lr{lr:g}-s{args.grid_steps}-seed{args.seeds[0]}"


def part_sweep(b, loss_windows) -> None:
    """zoexec runs at each --grid lr (module docstring); `loss_windows`: the benchmark's."""
    args = b.args
    out = b.results["sweep"] = {"tuning": args.tuning, "steps": args.grid_steps,
                                "seed": args.seeds[0], "eps": args.eps,
                                "eval_samples": args.eval_samples, "runs": {}}
    zero = b.zoexec.evaluate(b.model_dir, samples=args.eval_samples)
    out["zero_shot"] = zero
    b.log(f"sweep ({args.tuning}): zero-shot on the same sentences {_fig(zero)}")
    plan = b.zoexec.plan(batch=args.batch, seq=b.seq())
    for lr in args.grid:
        run = b.zoexec.train_run(sweep_name(args, lr), plan=plan, seed=args.seeds[0],
                                 steps=args.grid_steps, lr=lr, eps=args.eps,
                                 eval_every=args.grid_steps, eval_samples=args.eval_samples)
        if "note" in run:
            out["runs"][str(lr)] = {"note": run["note"]}
            b.log(f"sweep lr {lr:g}: {run['note']}")
            b.save()
            continue
        last = run["evals"][-1] if run["evals"] else {}
        out["runs"][str(lr)] = {"loss": loss_windows(run["steps"]), "eval": last,
                                "steps_done": len(run["steps"]),
                                "step_seconds": step_seconds(run["steps"]),
                                "seconds": run["seconds"]}
        b.log(f"sweep lr {lr:g}: {sweep_line(out['runs'][str(lr)])}")
        b.save()


def sweep_line(run: dict) -> str:
    if "note" in run:
        return run["note"]
    loss, ev = run["loss"], run["eval"]
    return (f"loss {loss['first']:.3f} -> {loss['last']:.3f} (max {loss['max']:.3f}, "
            f"{loss['verdict']}, {run['steps_done']} steps); held-out {_fig(ev)}; "
            f"{run['step_seconds'] or 0:.2f} s/step")


def sweep_lines(r: dict) -> list[str]:
    """The sweep's rows for the benchmark's table."""
    sweep = r.get("sweep")
    if not sweep:
        return []
    head = (f"lr sweep, zoexec {sweep['tuning']}, {sweep['steps']} steps, eps {sweep['eps']:g}, "
            f"seed {sweep['seed']}, {sweep['eval_samples'] or 'all'} held-out sentences: "
            f"zero-shot {_fig(sweep['zero_shot'])}")
    return [head] + [f"  lr {float(lr):g}: {sweep_line(run)}" for lr, run in sweep["runs"].items()]


def fine_tuned_lines(r: dict) -> list[str]:
    """The zoexec runs' rows for the benchmark's table: per evaluation step (--eval-every)
    the held-out accuracy over the seeds, the eval loss at the last, the seconds a step
    (each seed's median) and the training seconds (steps x that)."""
    ft = r.get("zoexec_fine_tuned") or {}
    seeds = [s for s in ft.get("seeds", {}).values() if "evals" in s]
    if not seeds:
        return []
    at: dict[int, list[dict]] = {}
    for seed in seeds:
        for ev in seed["evals"]:
            at.setdefault(ev["step"], []).append(ev)
    last = max(at) if at else None
    per_step = "; ".join(f"step {step}: {mean_sd([e['eval_accuracy'] for e in evs])}"
                         for step, evs in sorted(at.items()))
    secs = [s["step_seconds"] for s in seeds if s.get("step_seconds")]
    loss = mean_sd([e["eval_loss"] for e in at[last]]) if last is not None else "n/a"
    return [f"zoexec {ft.get('tuning', 'full')} lr {ft['lr']:g} eps {ft['eps']:g}, {len(seeds)} "
            f"seed(s), held-out accuracy {per_step or 'n/a'}; eval loss at step {last}: {loss}",
            f"  seconds a step {mean_sd(secs, 2)}, training "
            f"{mean_sd([x * ft['steps'] for x in secs], 0)} s"
            f" ({ft['steps']} steps x each seed's median step)"]


def _fig(metrics: dict) -> str:
    if "eval_accuracy" not in metrics:
        return metrics.get("note", "n/a")
    return f"accuracy {metrics['eval_accuracy']:.4f}, loss {metrics['eval_loss']:.3f}"


def mean_sd(values: list[float], digits: int = 4) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "n/a"
    return f"{statistics.fmean(values):.{digits}f} +- {statistics.stdev(values):.{digits}f}"
