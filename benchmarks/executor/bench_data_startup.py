"""Start-up and peak memory of a 5-step run against the size of its data file: does a
run read what it uses, or the whole file?

Writes, in a temporary folder, the micro model of examples/make_model.py and four
classification JSONL files of the sentiment example's words ({"sentence": ...,
"label": 0|1}): 1 row, 100,000 rows, 1,000,000 rows, and one row of 200 MB. Each is
trained for `--steps` steps (batch 4, seq 32, one CPU rank) by `zoexec run` in a
process of its own, under an address-space limit (`--limit-gib`, so that a run that
would take the machine's memory fails instead), and the script prints the wall
seconds of the whole command (start-up: preflight, reading the data, building the
model; the steps themselves are milliseconds), the process's peak RSS (wait4's
ru_maxrss) and the exit code, with each file's ratio to the 1-row file.

    .venv/bin/python benchmarks/executor/bench_data_startup.py
    .venv/bin/python benchmarks/executor/bench_data_startup.py --task text
    .venv/bin/python benchmarks/executor/bench_data_startup.py --before /tmp/before

--task text: packed text instead (`--task text`, {"text": ...} documents): one
document of 1,500 words (enough for the 5 batches), 100,000 and 1,000,000 documents
of 3-8 words, and one document of 200 MB.

--eval: `zoexec eval` of the micro model on a held-out packed-text file instead
(`--task text`, documents of 1,000-3,000 words, `--eval-mb` MiB of JSONL, default 50; seq
32, `--eval-samples 64` so that scoring is milliseconds and the figures are the
reading of the file): the wall and CPU seconds and the peak RSS, beside the 1-row
file's; then the evaluation rows alone (make_eval_set in a process of its own, every
row read once in order: the file's cost without the model's memory).

    .venv/bin/python benchmarks/executor/bench_data_startup.py --eval --before /tmp/before

--before DIR: an earlier tree of the project (zoexec/, zoplan/; e.g. `git archive
<commit> zoexec zoplan | tar -x -C /tmp/before`) run on the same files beside this
one (PYTHONPATH=DIR), its figures in columns of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from zoplan.handplan import hand_plan  # noqa: E402
from zoplan.layout import Layout  # noqa: E402
from zoplan.workload import Workload  # noqa: E402

WORDS = ("the acting was brilliant charming awful film second half soundtrack "
         "delightful").split()
TASK = ["--task", "classification", "--template", "{sentence} It was",
        "--label-words", "terrible,great"]
FILES = (("1 row", 1), ("100k rows", 100_000), ("1M rows", 1_000_000), ("200 MB row", None))
BIG_ROW_BYTES = 200 * 10**6
FIELD = {"classification": "sentence", "text": "text"}
ONE_ROW_WORDS = {"classification": (3, 8), "text": (1500, 1500)}   # text: 5 batches of 4 x 32


def write_rows(path: Path, count: int, rng: random.Random, task: str) -> None:
    """`count` rows drawn from 1,000 different ones."""
    low, high = ONE_ROW_WORDS[task] if count == 1 else (3, 8)
    pool = [json.dumps({FIELD[task]: " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))),
                        "label": rng.randint(0, 1)}) + "\n" for _ in range(1000)]
    with path.open("w") as out:
        for start in range(0, count, 10_000):
            out.write("".join(rng.choices(pool, k=min(10_000, count - start))))


def write_big_row(path: Path, task: str) -> None:
    """One row whose sentence (text) is BIG_ROW_BYTES of the words, written in pieces."""
    piece = " ".join(WORDS) + " "
    with path.open("w") as out:
        out.write(f'{{"label": 1, "{FIELD[task]}": "')
        for _ in range(BIG_ROW_BYTES // len(piece)):
            out.write(piece)
        out.write('the film"}\n')


def make_inputs(tmp: Path, task: str) -> tuple[Path, Path, dict[str, Path]]:
    model = tmp / "model"
    subprocess.run([sys.executable, str(HERE / "examples" / "make_model.py"), str(model),
                    "--size", "micro", "--seed", "0"], check=True, capture_output=True)
    plan = hand_plan(model=str(model), layout=Layout(ddp=1),
                     workload=Workload(batch=4, seq=32, param_dtype="fp32", compute_dtype="fp32"))
    plan_path = tmp / "plan.json"
    plan_path.write_text(json.dumps(plan.data))
    rng, files = random.Random(0), {}
    for name, count in FILES:
        path = tmp / f"{name.replace(' ', '-')}.jsonl"
        write_big_row(path, task) if count is None else write_rows(path, count, rng, task)
        files[name] = path
    return model, plan_path, files


def timed_run(code: Path, cmd: list[str], limit_gib: float) -> tuple[float, float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS in MiB, exit code, the last line it printed) of `cmd`
    with PYTHONPATH=`code`, under an address-space limit."""
    limit = int(limit_gib * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    # run from the tree itself: `python -m` puts the working folder first on sys.path
    proc = subprocess.Popen(cmd, env=env, cwd=code, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=cap)
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in out.splitlines() if line.strip()]
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, proc.returncode, lines[-1][:110] if lines else ""


def run_file(code: Path, model: Path, plan: Path, data: Path, out: Path, *, steps: int,
             limit_gib: float, task: str) -> tuple[float, float, float, int, str]:
    cmd = [sys.executable, "-m", "zoexec.cli", "run", str(plan), "--model-path", str(model),
           "--data", str(data), *(TASK if task == "classification" else ["--task", "text"]),
           "--steps", str(steps), "--out", str(out), "-q",
           "--threads", "1"]
    return timed_run(code, cmd, limit_gib)


def write_text_mb(path: Path, mib: float, rng: random.Random) -> None:
    """Packed-text documents of 1,000-3,000 words (100 different ones) up to `mib` MiB
    (long documents: the tokenizer's time per call does not dominate)."""
    pool = [json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1000, 3000)))})
            + "\n" for _ in range(100)]
    with path.open("w") as out:
        while out.tell() < mib * 2**20:
            out.write("".join(rng.choices(pool, k=100)))


def eval_files(tmp: Path, mib: float) -> tuple[Path, dict[str, Path]]:
    """The micro model and two held-out text files: one row, and `mib` MiB."""
    model = tmp / "model"
    subprocess.run([sys.executable, str(HERE / "examples" / "make_model.py"), str(model),
                    "--size", "micro", "--seed", "0"], check=True, capture_output=True)
    rng, files = random.Random(0), {"1 row": tmp / "one.jsonl", f"{mib:g} MiB": tmp / "big.jsonl"}
    write_rows(files["1 row"], 1, rng, "text")
    write_text_mb(files[f"{mib:g} MiB"], mib, rng)
    return model, files


# the evaluation rows alone (zoexec.data.sources.make_eval_set, as zoexec eval reads them
# before the model) in a process of their own: the reading of the file without the model's
# memory, every row visited once in order, 64 at a time, as the evaluator reads them
EVAL_SET_ONLY = """import sys
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_eval_set
rows = make_eval_set(sys.argv[1], TaskOptions(), vocab=10**6, seq=32, tokenizer_dir=sys.argv[2]).rows
print(sum(len(row.target) for i in range(0, len(rows), 64) for row in rows[i:i + 64]), "tokens")
"""


def eval_file(code: Path, model: Path, data: Path, *, limit_gib: float, whole: bool
              ) -> tuple[float, float, float, int, str]:
    if not whole:
        return timed_run(code, [sys.executable, "-c", EVAL_SET_ONLY, str(data), str(model)], limit_gib)
    cmd = [sys.executable, "-m", "zoexec.cli", "eval", str(model), "--data", str(data),
           "--task", "text", "--seq", "32", "--batch", "4", "--eval-samples", "64",
           "--threads", "1"]
    return timed_run(code, cmd, limit_gib)


def main_eval(args: argparse.Namespace, trees: list[tuple[str, Path]]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        model, files = eval_files(Path(tmp), args.eval_mb)
        for what, whole in (("zoexec eval", True), ("the rows alone", False)):
            figures: dict[tuple[str, str], tuple[float, float, float, int, str]] = {}
            for name, path in files.items():
                for tree, code in trees:
                    figures[tree, name] = eval_file(code, model, path, limit_gib=args.limit_gib,
                                                    whole=whole)
                    wall, cpu, rss, rc, last = figures[tree, name]
                    print(f"{tree:>6} {what} {name:>10} ({path.stat().st_size / 2**20:8.1f} MiB): "
                          f"{wall:6.1f} s wall, {cpu:6.1f} s CPU, peak RSS {rss:7.0f} MiB, rc {rc}"
                          + (f"  [{last}]" if rc else ""), flush=True)
            print(f"\n{what}:")
            report(figures, trees, files)
            print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--before", type=Path, default=None,
                        help="an earlier tree (zoexec/, zoplan/) to run beside this one")
    parser.add_argument("--limit-gib", type=float, default=8.0,
                        help="address-space limit of each run (GiB)")
    parser.add_argument("--only", nargs="*", default=None, help="names of the files to run")
    parser.add_argument("--no-now", action="store_true", help="run the --before tree only")
    parser.add_argument("--task", choices=tuple(FIELD), default="classification")
    parser.add_argument("--eval", action="store_true",
                        help="zoexec eval on a held-out text file instead of 5-step runs")
    parser.add_argument("--eval-mb", type=float, default=50.0, help="--eval: the file's MiB")
    args = parser.parse_args()
    trees = [] if args.no_now else [("now", HERE)]
    trees += [("before", args.before.resolve())] if args.before else []
    if args.eval:
        main_eval(args, trees)
        return
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        model, plan, files = make_inputs(Path(tmp), args.task)
        figures: dict[tuple[str, str], tuple[float, float, float, int, str]] = {}
        for name, path in files.items():
            if args.only and name not in args.only:
                continue
            for tree, code in trees:
                out = Path(tmp) / f"run-{tree}-{name.replace(' ', '-')}"
                figures[tree, name] = run_file(code, model, plan, path, out, steps=args.steps,
                                               limit_gib=args.limit_gib, task=args.task)
                wall, cpu, rss, rc, last = figures[tree, name]
                print(f"{tree:>6} {name:>10} ({path.stat().st_size / 2**20:8.1f} MiB): "
                      f"{wall:6.1f} s wall, {cpu:6.1f} s CPU, peak RSS {rss:7.0f} MiB, rc {rc}"
                      + (f"  [{last}]" if rc else ""), flush=True)
        report(figures, trees, files)


def report(figures: dict, trees: list, files: dict) -> None:
    """A table: per file and tree, wall and CPU seconds and peak RSS, each with its
    ratio to the 1-row file's."""
    print()
    print(args_line())
    head = f"{'file':>12}"
    for tree, _ in trees:
        head += (f" | {tree + ' wall s':>12} {'x':>5} {'CPU s':>6} {'x':>5} {'RSS MiB':>8} "
                 f"{'x':>5} {'rc':>3}")
    print(head)
    for name in files:
        line = f"{name:>12}"
        for tree, _ in trees:
            got, base = figures.get((tree, name)), figures.get((tree, "1 row"))
            if got is None:
                line += f" | {'-':>12} {'':>5} {'':>6} {'':>5} {'':>8} {'':>5} {'':>3}"
                continue
            wall, cpu, rss, rc, _ = got
            ratios = [f"{a / b:.2f}" if base else "-" for a, b in zip((wall, cpu, rss), base or (1, 1, 1))]
            line += (f" | {wall:12.1f} {ratios[0]:>5} {cpu:6.1f} {ratios[1]:>5} {rss:8.0f} "
                     f"{ratios[2]:>5} {rc:>3}")
        print(line)


def args_line() -> str:
    return "command: " + " ".join([Path(sys.executable).name, *sys.argv])


if __name__ == "__main__":
    main()
