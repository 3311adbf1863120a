"""The accuracy benchmark's zoexec side, through the command lines a user types:
`zoplan optimize` for the plan (one CPU rank), `zoexec run` to fine-tune, `zoexec eval`
for held-out accuracy (few-shot: `--demonstrations K --demonstrations-data TRAIN`).
Options are passed only where the command's `--help` lists them, so the same script
also measures older code (a checkout of an earlier commit); what a command prints on
failure is kept as the figure's note instead of stopping the benchmark."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def _cli(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@dataclass(kw_only=True)
class Zoexec:
    """Where the model, the data and the runs are, and the task's options."""

    model: Path
    train: Path
    test: Path
    work: Path
    template: str
    label_words: tuple[str, ...]
    threads: int
    tuning: str = "full"          # zoplan optimize --tuning: full, lora (or prefix)
    profile: str = "cpu"          # zoplan optimize --profile: bench_accuracy's --plan-profile
    helps: dict[str, str] = field(default_factory=dict)

    def task_args(self) -> list[str]:
        return ["--task", "classification", "--template", self.template,
                "--label-words", ",".join(self.label_words)]

    def supports(self, command: str, option: str) -> bool:
        """Whether `zoexec COMMAND --help` lists OPTION (read once per command)."""
        if command not in self.helps:
            done = subprocess.run(_cli("zoexec.cli", command, "--help"), capture_output=True,
                                  text=True, env={**os.environ, "COLUMNS": "400"})
            self.helps[command] = done.stdout
        return option in self.helps[command]

    def plan(self, *, batch: int, seq: int, extra: tuple[str, ...] = ()) -> Path:
        """A plan for one CPU rank (the planner's choice of the rest), made once;
        `extra`: more `zoplan optimize` options (an estimator's), named in its file."""
        tuning = "" if self.tuning == "full" else f"{self.tuning}-"
        tag = "".join(f"-{x.lstrip('-')}" for x in extra)
        path = self.work / f"plan-{tuning}b{batch}-s{seq}{tag}-{Path(self.profile).stem}.json"
        if not path.exists():
            self.work.mkdir(parents=True, exist_ok=True)
            _checked(_cli("zoplan.cli", "optimize", "--model", str(self.model / "config.json"),
                          "--gpus", "1", "--profile", self.profile, "--batch", str(batch),
                          "--seq", str(seq), "--tuning", self.tuning, *extra, "-o", str(path),
                          "-q"))
        return path

    def evaluate(self, model: Path, *, demos: int = 0, seed: int = 0,
                 samples: int | None = None) -> dict:
        """`zoexec eval` of `model` on the test file: its metrics and wall seconds."""
        args = ["eval", str(model), "--data", str(self.test), *self.task_args(), "--json",
                "--threads", str(self.threads)]
        if demos:
            if not self.supports("eval", "--demonstrations"):
                return {"note": "this zoexec eval has no --demonstrations"}
            args += ["--demonstrations", str(demos), "--demonstrations-data", str(self.train)] \
                if self.supports("eval", "--demonstrations-data") else ["--demonstrations", str(demos)]
            args += ["--seed", str(seed)] if self.supports("eval", "--seed") else []
        if samples is not None and self.supports("eval", "--eval-samples"):
            args += ["--eval-samples", str(samples)]
        done, seconds = _timed(args)
        if done.returncode != 0:
            return {"note": _last_line(done), "seconds": seconds}
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "seconds": seconds}

    def train_run(self, name: str, *, plan: Path, seed: int, steps: int, lr: float, eps: float,
                  eval_every: int | None = None, eval_samples: int | None = None) -> dict:
        """`zoexec run` of the classification task: the step records, its wall seconds
        and the run folder (final/ holds the fine-tuned model)."""
        out = self.work / "runs" / name
        args = ["run", str(plan), "--model-path", str(self.model), "--data", str(self.train),
                *self.task_args(), "--steps", str(steps), "--seed", str(seed), "--lr", str(lr),
                "--eps", str(eps), "--threads", str(self.threads), "--out", str(out),
                "--overwrite", "-q"]
        if eval_every:
            args += ["--eval-data", str(self.test), "--eval-every", str(eval_every)]
            if eval_samples is not None and self.supports("run", "--eval-samples"):
                args += ["--eval-samples", str(eval_samples)]
        done, seconds = _timed(args)
        if done.returncode != 0:
            return {"note": _last_line(done), "seconds": seconds}
        steps_done = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
        metrics = out / "metrics.jsonl"
        evals = [r for r in (json.loads(x) for x in metrics.read_text().splitlines())
                 if "eval_accuracy" in r] if metrics.exists() else []
        return {"steps": steps_done, "evals": evals, "seconds": seconds, "out": str(out)}


def step_seconds(records: list[dict]) -> float | None:
    """The median measured step of a zoexec run, the first (warm-up) left out."""
    times = [r["step_time_s"] for r in records[1:] if r.get("step_time_s")]
    return statistics.median(times) if times else None


def _timed(args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """A zoexec command run to its end, and its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run(_cli("zoexec.cli", *args), capture_output=True, text=True)
    return done, time.perf_counter() - start


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    return f"exit {done.returncode}: {lines[-1] if lines else '(no output)'}"


def _checked(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed: {_last_line(done)}")
