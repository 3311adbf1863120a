"""Whether a change of the planner leaves its plans byte-identical: `zoplan optimize` of
the same requests with this checkout's planner and an earlier one, plan.json (or the
one-line refusal) compared byte for byte.

    .venv/bin/python benchmarks/planner/same_plans.py --before DIR [--only TEXT]

DIR holds the earlier planner's `zoplan/` package, e.g.
    git archive a8fd4f8 zoplan | tar -x -C /tmp/before
The requests: OPT-1.3B, 13B and 175B on 1 and 8 GPUs on every shipped profile, and on
each profile OPT-1.3B on 8 GPUs with LoRA (twice), lowrank, sparse, 4 directions,
prefix, --tuning auto and fixed axes (112 in all; --only keeps those whose name holds
TEXT). Prints the count of plans identical, of refusals identical, and each request
whose output differs. About 1 s of CPU a request and tree.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import sys
from pathlib import Path
from typer.testing import CliRunner
from zoplan.cli import app
out, cases = Path(sys.argv[1]), eval(sys.argv[2])
for name, args in cases:
    r = CliRunner().invoke(app, ["optimize", *args, "-q", "-o", str(out / f"{name}.json")])
    (out / f"{name}.out").write_text(f"{r.exit_code}\n{r.output}")
'''


def cases() -> list[tuple[str, list[str]]]:
    profiles = sorted(p.stem for p in (ROOT / "zoplan" / "hwprofiles").glob("*.json"))
    out = []
    for prof in profiles:
        for model in ("opt-1.3b", "opt-13b", "opt-175b"):
            for gpus in (1, 8):
                out.append((f"{prof}-{model}-{gpus}",
                            ["--model", model, "--gpus", str(gpus), "--profile", prof]))
        base = ["--model", "opt-1.3b", "--gpus", "8", "--profile", prof]
        out += [(f"{prof}-lora", base + ["--tuning", "lora"]),
                (f"{prof}-lora-r16", base + ["--tuning", "lora", "--lora-r", "16",
                                             "--lora-targets", "q_proj,k_proj,v_proj"]),
                (f"{prof}-lowrank", base + ["--estimator", "lowrank", "--lowrank-rank", "4"]),
                (f"{prof}-sparse", base + ["--estimator", "sparse", "--sparse-share", "0.5"]),
                (f"{prof}-directions", base + ["--directions", "4"]),
                (f"{prof}-prefix", base + ["--tuning", "prefix", "--prefix-tokens", "10"]),
                (f"{prof}-auto", base + ["--tuning", "auto"]),
                (f"{prof}-fixed", base + ["--pertp", "2", "--prefetch", "2", "--update",
                                          "master", "--placement", "host", "--batch", "32",
                                          "--seq", "256"])]
    return out


def run(tree: Path, todo: list[tuple[str, list[str]]], out: Path) -> None:
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", CHILD, str(out), repr(todo)], env=env, check=True,
                   cwd=tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="a folder holding the earlier planner's zoplan/")
    parser.add_argument("--only", default="", help="only the requests whose name holds this")
    args = parser.parse_args()
    todo = [c for c in cases() if args.only in c[0]]
    with tempfile.TemporaryDirectory() as tmp:
        before, after = Path(tmp, "before"), Path(tmp, "after")
        run(args.before.resolve(), todo, before)
        run(ROOT, todo, after)
        plans = refusals = 0
        differ = []
        for name, _ in todo:
            same_out = filecmp.cmp(before / f"{name}.out", after / f"{name}.out", shallow=False)
            has = [(d / f"{name}.json").exists() for d in (before, after)]
            same_plan = has[0] == has[1] and (not has[0] or filecmp.cmp(
                before / f"{name}.json", after / f"{name}.json", shallow=False))
            if same_out and same_plan:
                plans += has[0]
                refusals += not has[0]
            else:
                differ.append(name)
    print(f"{len(todo)} requests: {plans} plans byte-identical, {refusals} refusals "
          f"identical, {len(differ)} differ")
    for name in differ:
        print(f"  differs: {name}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
