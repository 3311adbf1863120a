"""The accuracy benchmark's comparison of estimators (docs/estimators.md): each entry of
`--compare` (an estimator, its directions and a learning rate) fine-tuned through
`zoplan optimize --estimator ...` and `zoexec run` over the seeds, held-out accuracy
every --eval-every steps; the table gives, per entry, the accuracy at each evaluation
(mean +- standard deviation over the seeds), the median seconds per step, and the
training seconds (the steps' own times, evaluations left out) it took to reach the
first entry's final accuracy.

    --compare "mezo@3e-5,lowrank@1e-4,sparse@1e-4,mezo+q4@3e-5"

An entry is NAME[+qN]@LR: NAME one of mezo, lowrank, sparse, N the directions a step;
the estimator's own settings come from --lowrank-rank, --lowrank-every and
--sparse-share (the planner's defaults when not given).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One compared setting."""

    estimator: str
    directions: int
    lr: float
    tuning: str = "full"   # a `--parts zoexec` run's --tuning (lora, prefix: named in the tag)

    @property
    def tag(self) -> str:
        more = f"+q{self.directions}" if self.directions > 1 else ""
        tuning = "" if self.tuning == "full" else f"{self.tuning}:"
        return f"{tuning}{self.estimator}{more}@{self.lr:g}"


def parse_compare(text: str) -> list[Entry]:
    """Entries of --compare (ValueError naming a malformed one)."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        head, _, lr = item.partition("@")
        name, _, q = head.partition("+q")
        if name not in ("mezo", "lowrank", "sparse") or not lr or (q and not q.isdigit()):
            raise ValueError(f"--compare {item!r}: give NAME[+qN]@LR, NAME one of mezo, "
                             f"lowrank, sparse (e.g. lowrank@1e-4, mezo+q4@3e-5)")
        out.append(Entry(estimator=name, directions=int(q or 1), lr=float(lr)))
    return out


def plan_args(entry: Entry, args) -> list[str]:
    """The `zoplan optimize` options of an entry (its estimator's own settings as given)."""
    own = {"lowrank": ("lowrank_rank", "lowrank_every"), "sparse": ("sparse_share",)}
    return (["--estimator", entry.estimator, "--directions", str(entry.directions)]
            + _given(args, own.get(entry.estimator, ())))


def _given(args, names) -> list[str]:
    return [x for name in names if getattr(args, name) is not None
            for x in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]


def run_entry(b, entry: Entry, *, plan, name_of) -> dict:
    """Every seed of one entry: its evaluations, seconds per step and training seconds."""
    out = {"entry": entry.tag, "seeds": {}}
    for seed in b.args.seeds:
        run = b.zoexec.train_run(name_of(entry, seed), plan=plan, seed=seed,
                                 steps=b.args.steps, lr=entry.lr, eps=b.args.eps,
                                 eval_every=b.args.eval_every or b.args.steps,
                                 eval_samples=b.args.eval_samples)
        if "note" in run:
            out["seeds"][seed] = run
            b.log(f"{entry.tag} seed {seed}: {run['note']}")
            continue
        times = [r.get("step_time_s") or 0.0 for r in run["steps"]]
        evals = {r["step"]: {"accuracy": r["eval_accuracy"],
                             "train_seconds": sum(times[:r["step"]])} for r in run["evals"]}
        out["seeds"][seed] = {"evals": evals, "step_seconds": statistics.median(times[1:] or times),
                              "loss": [r["loss"] for r in run["steps"]]}
        final = evals[max(evals)]["accuracy"] if evals else None
        b.log(f"{entry.tag} seed {seed}: held-out {final} after {b.args.steps} steps "
              f"({out['seeds'][seed]['step_seconds']:.2f} s/step)")
        b.save()
    return out


def merged(results: list[dict]) -> dict:
    """Several saved runs as one: the first's figures, with every run's estimator
    entries merged by entry (their seeds together, in the order first seen); a run of
    the zoexec part (`--parts zoexec`) counts as its estimator's entry (from_zoexec),
    and the zoexec parts of the same settings as the first one's (zoexec_key) give
    their seeds to its summary; the zero-shot figures are the first run's that has them."""
    out = dict(results[0])
    zero = next((r["zero_shot"] for r in results if "zero_shot" in r), None)
    if zero is not None:
        out["zero_shot"] = zero
    parts = [r["zoexec_fine_tuned"] for r in results if r.get("zoexec_fine_tuned")]
    if parts:
        seeds = {k: v for p in parts if zoexec_key(p) == zoexec_key(parts[0])
                 for k, v in p.get("seeds", {}).items()}
        out["zoexec_fine_tuned"] = {**parts[0], "seeds": seeds}
    entries: dict[str, dict] = {}
    for r in results:
        for e in [*from_zoexec(r), *r.get("estimators", {}).get("entries", [])]:
            entries.setdefault(e["entry"], {"entry": e["entry"], "seeds": {}})["seeds"].update(
                e["seeds"])
    if entries:
        out["estimators"] = {**results[0].get("estimators", {}), "entries": list(entries.values())}
    return out


def from_zoexec(r: dict) -> list[dict]:
    """The zoexec part's fine-tuning runs as an estimator entry (none without them):
    the evaluations metrics.jsonl logged, each seed's median s/step, and training
    seconds taken as step x that median (the part keeps no step's own time)."""
    part, settings = r.get("zoexec_fine_tuned", {}), r.get("settings", {})
    seeds = {}
    for seed, run in part.get("seeds", {}).items():
        secs = run.get("step_seconds")
        if "evals" not in run or not secs:
            continue
        seeds[seed] = {"step_seconds": secs, "evals": {
            int(e["step"]): {"accuracy": e["eval_accuracy"], "train_seconds": int(e["step"]) * secs}
            for e in run["evals"] if "eval_accuracy" in e}}
    if not seeds:
        return []
    entry = Entry(estimator=settings.get("estimator") or "mezo",
                  directions=settings.get("directions") or 1, lr=part["lr"],
                  tuning=part.get("tuning") or "full")
    return [{"entry": entry.tag, "seeds": seeds}]


def zoexec_key(part: dict) -> tuple:
    """What makes two saved zoexec parts seeds of one setting."""
    return tuple(part.get(k) for k in ("tuning", "lr", "eps", "steps"))


def mean_sd(values: list, *, count: bool = False) -> str:
    """Numbers as "mean +- sd" (one: itself; none: n/a); `count`: "(N seeds)" after."""
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.4f}" + (" (1 seed)" if count else "")
    return (f"{statistics.fmean(values):.4f} +- {statistics.stdev(values):.4f}"
            + (f" ({len(values)} seeds)" if count else ""))


def table_lines(results: dict) -> list[str]:
    """The comparison as lines: accuracy per evaluation step, s/step, and the training
    seconds each entry took to reach the first entry's final mean accuracy."""
    entries = results.get("entries", [])
    if not entries:
        return []
    steps = sorted({int(s) for e in entries for run in e["seeds"].values()
                    for s in run.get("evals", {})})
    lines = [f"{'estimator@lr':22}" + "".join(f"{f'step {s}':>22}" for s in steps)
             + f"{'s/step':>8}{'s to baseline':>16}"]
    target = None
    for e in entries:
        runs = [{**r, "evals": {int(s): v for s, v in r["evals"].items()}}   # JSON: str keys
                for r in e["seeds"].values() if "evals" in r]
        row = [[r["evals"][s]["accuracy"] for r in runs if s in r["evals"]] for s in steps]
        if target is None and row and row[-1]:
            target = statistics.fmean(row[-1])
        secs = [r["step_seconds"] for r in runs]
        reach = _reach_seconds(runs, steps, target)
        lines.append(f"{e['entry']:22}" + "".join(f"{mean_sd(v):>22}" for v in row)
                     + f"{statistics.median(secs) if secs else float('nan'):>8.2f}"
                     + f"{reach:>16}")
    lines.append(f"(s to baseline: the training seconds, mean over the seeds, at the first "
                 f"evaluation whose mean accuracy reaches the first entry's final "
                 f"{target if target is None else f'{target:.4f}'})")
    return lines


def _reach_seconds(runs: list[dict], steps: list[int], target: float | None) -> str:
    if target is None or not runs:
        return "n/a"
    for s in steps:
        accs = [r["evals"][s]["accuracy"] for r in runs if s in r["evals"]]
        if accs and len(accs) == len(runs) and statistics.fmean(accs) >= target:
            return f"{statistics.fmean(r['evals'][s]['train_seconds'] for r in runs):.0f} (step {s})"
    return "not reached"
