"""Seconds `zoexec eval` takes on a classification set, the whole command as a user runs it
(start-up, model load, the evaluation): 400 sentiment examples (the shipped train and
test files, the first 400 lines) with the label words "terrible,great" on a local
random-weight OPT model from examples/make_model.py, one thread.

    python benchmarks/executor/eval_speed.py [--size tiny|micro] [--repeats 3] [--tree DIR]

--tree: the source tree whose zoexec runs (put first on PYTHONPATH), e.g. an export of
another commit (`git archive COMMIT | tar -x -C /tmp/before`), to compare two versions
on one machine; default this checkout (the commands run in the tree's folder). Prints
each run's seconds for the whole command and for eval_model alone (loading the model
into the block store and scoring, without the interpreter's start and imports), the
medians, and the metrics of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from make_model import make_model  # noqa: E402

TASK = ["--task", "classification", "--template", "{sentence} It was",
        "--label-words", "terrible,great"]


def _data(folder: Path, count: int) -> Path:
    lines = []
    for name in ("train.jsonl", "test.jsonl"):
        lines += (ROOT / "examples/sentiment" / name).read_text().splitlines(keepends=True)
    path = folder / "eval.jsonl"
    path.write_text("".join(lines[:count]))
    return path


INNER = """
import json, sys, time
from zoexec.launch.evaluate import eval_config, eval_model
cfg = eval_config(sys.argv[1], sys.argv[2], name="classification", template="{sentence} It was",
                  label_words=("terrible", "great"), threads=1)
start = time.perf_counter()
metrics = eval_model(cfg)
print(json.dumps({"eval_model_s": time.perf_counter() - start, **metrics}))
"""


def _once(tree: Path, model: Path, data: Path) -> tuple[float, float, dict]:
    """(the command's seconds, eval_model's seconds, the metrics): `zoexec eval` as a
    user runs it, then the same evaluation in a fresh interpreter timed around
    zoexec.launch.evaluate.eval_model alone (the model's loading into the block store
    and the scoring; no interpreter start, no imports)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "zoexec.cli", "eval", str(model), "--data",
                           str(data), *TASK, "--threads", "1", "--json"], env=env, cwd=tree,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    inner = subprocess.run([sys.executable, "-c", INNER, str(model), str(data)], env=env,
                           cwd=tree, capture_output=True, text=True, check=False)
    for proc in (done, inner):
        if proc.returncode:
            raise SystemExit(proc.stderr or proc.stdout)
    metrics = json.loads(inner.stdout.strip().splitlines()[-1])
    return seconds, metrics.pop("eval_model_s"), metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=("micro", "tiny"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", size=args.size, seed=0)
        data = _data(Path(tmp), args.examples)
        runs = [_once(args.tree.resolve(), model, data) for _ in range(args.repeats)]
    whole, inner = [r[0] for r in runs], [r[1] for r in runs]
    print(f"zoexec eval ({args.tree}), {args.examples} examples, {args.size} model")
    print("  the command:   " + " ".join(f"{s:.2f}" for s in whole)
          + f" s; median {statistics.median(whole):.2f} s")
    print("  eval_model:    " + " ".join(f"{s:.2f}" for s in inner)
          + f" s; median {statistics.median(inner):.2f} s")
    print(json.dumps(runs[-1][2]))


if __name__ == "__main__":
    main()
