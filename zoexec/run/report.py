"""What a run tells the person who started it: rank 0's Reporter shows progress on
stderr, writes the metrics (metrics.jsonl, and TensorBoard with --report-to tensorboard)
and prints a summary at the end. The other ranks get a Reporter that does nothing, so
every rank may call it alike.

Progress: on a terminal a rich bar (steps, time left, loss, lr, tokens/s); elsewhere
(a log file, a batch job) one line per `--log-every N` steps, or about every 30 s of
wall time when N is not given, and always after the first and the last step:
    zoexec: step 120/2000  loss 2.8131  lr 1.00e-06  g -1.200e+01  5,210 tok/s  ETA 3m40s
Evaluations (`evaluate`) print a line too. `-q` silences progress, evaluation lines and
the summary, and transformers' progress bars (quiet_libraries); warnings and errors
still print.

metrics.jsonl (with --out): one strict-JSON object per event, named as the HF Trainer
names them. A training step: {"step", "epoch" (when the data source knows it), "loss",
"learning_rate", "projected_grad" (MeZO's g: there is no gradient norm),
"tokens_per_s", "step_time_s"} (+ "skipped": true); an evaluation: {"step",
"eval_loss", "eval_accuracy", ...} as given to `evaluate` (keys prefixed "eval_"); the
end of a whole run:
{"step", "train_runtime", "train_loss", "train_steps_per_second",
"train_tokens_per_second"}. "step" counts the steps done (HF's global_step: 1 after
the first step, 0 for an evaluation before training). A non-finite figure is null.
A resumed run keeps the lines up to its start step and appends. TensorBoard scalars
go under <out>/runs/ with the Trainer's tags: "train/loss", "train/learning_rate",
"eval/loss", "eval/accuracy", ...

The summary (rank 0, stderr, plain text), after the weights and the trace are
written: the steps and where the time went, the loss at the start and the end, the
final and the best evaluation of the whole run (a resumed run's earlier evaluations
too, read back from metrics.jsonl; the highest eval_accuracy, else the lowest
eval_loss), and where everything was written (run folder, final/ and how to load it: a
model folder, or a LoRA run's PEFT adapter folder with the line that loads it onto its
base, snapshots, metrics.jsonl, losses.jsonl, TensorBoard, trace). A run that stops early (a signal, a non-finite
loss) prints none: its one error line says what happened.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Protocol, TextIO

from zoexec.config import RunConfig
from zoexec.maths.history import StepHistory, StepRecord
from zoexec.model.quiet import progress_bars_off
from zoexec.run.checkpoint import open_own
from zoexec.run.folder import snapshot_step
from zoexec.run.trackers import (
    MLFLOW_DIR,
    TRACKERS,
    WANDB_DIR,
    MlflowTracker,
    WandbTracker,
    check_tracker,
    open_tracker,
)
from zoexec.run.writes import writing
from zoexec.runtime.groups import DistEnv
from zoplan.errors import ZoError

METRICS = "metrics.jsonl"
# one encoder for every line: json.dumps(allow_nan=False) builds a new one a call, and
# those live in reference cycles until the collector runs (a long run's RSS grew by them)
STRICT_JSON = json.JSONEncoder(allow_nan=False)
TENSORBOARD_DIR = "runs"
ADAPTER_CONFIG = "adapter_config.json"   # a PEFT adapter folder's (zoexec.model.lora)
LOG_EVERY_S = 30.0        # progress lines without --log-every: about this often
LOSS_WINDOW = 10          # the summary's first and last loss: means of this many steps

# One metrics.jsonl line: a step's, an evaluation's or the run's totals (module
# docstring); every figure a number (an int: a count) or None
Row = dict[str, float | None]
Metrics = dict[str, float]   # an evaluation's figures, "eval_" names


class Scalars(Protocol):
    """Where TensorBoard scalars go (torch.utils.tensorboard.SummaryWriter)."""

    def add_scalar(self, tag: str, value: float, step: float | None) -> object: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


# ---- options -------------------------------------------------------------------------------
def check_report_to(report_to: str, out_dir: str | Path | None) -> None:
    """--report-to tensorboard needs --out and the tensorboard package (the choice itself
    is checked by zoexec.config.LoggingOptions); wandb and mlflow alike
    (zoexec.run.trackers); a ZoError before the run starts."""
    check_tracker(report_to, out_dir)
    if report_to != "tensorboard":
        return
    if out_dir is None:
        raise ZoError("--report-to tensorboard writes under the run folder: give --out DIR")
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ZoError("--report-to tensorboard needs the tensorboard package, which is not "
                      "installed: pip install tensorboard (or use --report-to none)") from None


@contextlib.contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """With `quiet`: transformers' progress bars (model and tokenizer loading) off; its
    warnings and errors still print. Restored on the way out (a run inside another
    program). (datasets' bars are off in any case: zoexec.data.tasks.)"""
    if not quiet:
        yield
        return
    with progress_bars_off():
        yield


# ---- formatting ------------------------------------------------------------------------------
def fmt_duration(seconds: float) -> str:
    """4.2s, 42s, 3m40s, 2h05m."""
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f}s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eval_key(name: str) -> str:
    """The HF Trainer's name of an evaluation metric: "eval_" + name unless it has it."""
    return name if name.startswith("eval_") else f"eval_{name}"


def _number(value: float) -> float:
    """An int stays an int (a count); anything else numeric becomes a float."""
    return value if isinstance(value, int) and not isinstance(value, bool) else float(value)


def _finite_or_none(value: float | None) -> float | None:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _fmt_metric(value: float | None) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


# ---- the reporter ------------------------------------------------------------------------------
class Reporter:
    """Rank 0's progress, metrics and summary (see the module docstring). `stream`:
    where progress and the summary go (default: sys.stderr at the time of writing);
    `clock`: seconds (tests)."""

    def __init__(self, cfg: RunConfig, *, lead: bool = True, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.lead, self.clock = cfg, lead, clock
        self.show = lead and cfg.logging.progress
        self._stream = stream
        self.out = Path(cfg.checkpoint.out) if lead and cfg.checkpoint.out else None
        self.log_every = cfg.logging.log_every
        self.report_to = cfg.logging.report_to
        self.first, self.total = cfg.start_step, cfg.optim.steps
        self.records = StepHistory()            # this invocation's steps (StepRecords, compact)
        self.evals: list[tuple[int, Metrics]] = []
        self.earlier = self._earlier_evals()   # a resumed run's evaluations before its start
        self.created_s = clock()
        self.begin_s: float | None = None
        self.end_s: float | None = None
        self.last_line_s = 0.0
        self._metrics: IO[str] | None = None
        self._writer: Scalars | None = None
        self._tracker: WandbTracker | MlflowTracker | None = None   # --report-to wandb|mlflow
        self._bar: _Bar | None = None
        self._opened: set[str] = set()          # files begun by this run: reopened to append
        self._totals_written = False

    @classmethod
    def make(cls, cfg: RunConfig, env: DistEnv) -> Reporter:
        return cls(cfg, lead=env.rank == 0)

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    # ---- the run's events --------------------------------------------------------------
    def begin(self) -> None:
        """The first step starts now (after loading and any replay)."""
        self.begin_s = self.last_line_s = self.clock()
        if self.show and self.stream.isatty():
            self._bar = _Bar(self)

    def train(self, record: StepRecord, *, epoch: float | None = None) -> None:
        """One finished step (a StepRecord); `epoch`: passes over the data, when known."""
        if self.begin_s is None:
            self.begin()
        self.records.append(record)
        if not self.lead:
            return
        data = {"step": record.step + 1, "epoch": epoch, "loss": record.loss,
                "learning_rate": record.lr, "projected_grad": record.g,
                "tokens_per_s": record.tokens_per_s, "step_time_s": record.step_time_s}
        if epoch is None:
            data.pop("epoch")
        if record.skipped:
            data["skipped"] = True
        self._write(data)
        if self.show:
            self._progress(record)

    def evaluate(self, step: int, metrics: dict[str, float]) -> None:
        """Evaluation results after `step` steps (0: before training). Keys are prefixed
        "eval_" as the HF Trainer does ("loss" -> "eval_loss"; "eval_f1" stays). Any rank
        may call it; rank 0 writes a metrics.jsonl row and TensorBoard scalars, shows a
        progress line, and keeps the evaluations for the summary (final and best). It
        may come after `close` (an evaluation after the last step)."""
        if not self.lead:
            return
        row = {eval_key(k): _number(v) for k, v in metrics.items()}
        self.evals.append((int(step), row))
        self._write({"step": int(step), **row})
        if self.show:
            text = "  ".join(f"{k} {_fmt_metric(v)}" for k, v in row.items())
            self._say(f"zoexec: eval after step {step}/{self.total}: {text}")

    def best_eval(self) -> tuple[int, Metrics, str] | None:
        """(step, metrics, the metric it was chosen by) of the best evaluation of the
        whole run (a resumed run's earlier ones too): the highest eval_accuracy when the
        evaluations have one, else the lowest eval_loss (the earliest of equals); None
        without such a figure."""
        evals = self.earlier + self.evals
        for key, sign in (("eval_accuracy", -1.0), ("eval_loss", 1.0)):
            seen = [(sign * m[key], i) for i, (_, m) in enumerate(evals)
                    if isinstance(m.get(key), int | float) and math.isfinite(m[key])]
            if seen:
                index = min(seen)[1]
                return evals[index][0], evals[index][1], key
        return None

    def _earlier_evals(self) -> list[tuple[int, Metrics]]:
        """A resumed run's evaluations up to its start step, as its metrics.jsonl holds
        them (the lines _open_metrics keeps); [] for a new run."""
        path = self.out / METRICS if self.out is not None else None
        if not self.cfg.resumed or path is None or not path.is_file():
            return []
        found: list[tuple[int, Metrics]] = []
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
                step = int(data["step"])
            except (ValueError, KeyError, TypeError):
                break
            if step > self.first:
                break
            row = {k: v for k, v in data.items() if k.startswith("eval_")}
            if row:
                found.append((step, row))
        return found

    def close(self) -> None:
        """The steps are over (or stopped): the bar ends, the files are closed. After a
        whole run, the end-of-run record is written first."""
        if self.end_s is None:
            self.end_s = self.clock()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if (self.lead and self.records and self.records[-1].step == self.total - 1
                and not self._totals_written):
            self._totals_written = True
            self._write(self._totals())
        if self._metrics is not None:
            with contextlib.suppress(OSError):   # a line a full disk refused: _write said so
                self._metrics.close()
            self._metrics = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._tracker is not None:
            self._tracker.close()
            self._tracker = None

    # ---- metrics files -------------------------------------------------------------------
    def _write(self, data: Row) -> None:
        if self.out is None:
            return
        with writing(self.out / METRICS, what="the metrics", folder=self.out):
            if self._metrics is None:
                self._metrics = self._open_metrics(self.out / METRICS)
            clean = {k: _finite_or_none(v) for k, v in data.items()}
            self._metrics.write(STRICT_JSON.encode(clean) + "\n")
            self._metrics.flush()
        if self.report_to == "tensorboard":
            with writing(self.out / TENSORBOARD_DIR, what="the TensorBoard events in",
                         folder=self.out):
                self._tensorboard(data, self.out / TENSORBOARD_DIR)
        elif self.report_to in TRACKERS:
            if self._tracker is None:
                self._tracker = open_tracker(self.report_to, self.cfg, self.out)
            self._tracker.log(clean)

    def _open_metrics(self, path: Path) -> IO[str]:
        """metrics.jsonl (`path`): new for a new run; a resumed run keeps its whole lines
        up to its start step (a crash may have torn the last one)."""
        if METRICS in self._opened:
            return open_own(path, "a")
        self._opened.add(METRICS)
        if not self.cfg.resumed or not path.is_file():
            return open_own(path, "w")
        kept = []
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
                if int(data["step"]) <= self.first:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                break
        with open_own(path, "w") as handle:
            handle.write("".join(f"{line}\n" for line in kept))
        return open_own(path, "a")

    def _tensorboard(self, data: Row, folder: Path) -> None:
        """`data`'s figures as scalars in the run's TensorBoard events (`folder`)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            first = TENSORBOARD_DIR not in self._opened
            self._opened.add(TENSORBOARD_DIR)
            if first and not self.cfg.resumed:   # a new run: no events of an earlier one
                for old in folder.glob("events.out.tfevents.*"):
                    old.unlink()
            resumed = first and self.cfg.resumed
            self._writer = SummaryWriter(str(folder), purge_step=self.first + 1 if resumed else None)
        step = data["step"]
        for key, value in data.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self._writer.add_scalar(tensorboard_tag(key), value, step)
        self._writer.flush()

    def _totals(self) -> Row:
        finite = [r for r in self.records if r.finite and not r.skipped]
        step_s = sum(r.step_time_s for r in self.records)
        runtime = (self.end_s or self.clock()) - (self.begin_s or self.created_s)
        tokens = sum(r.tokens_per_s * r.step_time_s for r in self.records)
        return {"step": self.total, "train_runtime": round(runtime, 4),
                "train_loss": sum(r.loss for r in finite) / len(finite) if finite else None,
                "train_steps_per_second": len(self.records) / runtime if runtime > 0 else None,
                "train_tokens_per_second": tokens / step_s if step_s > 0 else None}

    # ---- progress --------------------------------------------------------------------------
    def _progress(self, record: StepRecord) -> None:
        text = (f"loss {record.loss:.4f}  lr {record.lr:.2e}  g {record.g:+.3e}  "
                f"{record.tokens_per_s:,.0f} tok/s")
        if self._bar is not None:
            self._bar.update(text)
            return
        now = self.clock()
        done = record.step + 1
        last = done == self.total
        if self.log_every:
            due = done % self.log_every == 0
        else:
            due = now - self.last_line_s >= LOG_EVERY_S
        if not (due or last or len(self.records) == 1):
            return
        self.last_line_s = now
        assert self.begin_s is not None, "a step before begin"
        elapsed = now - self.begin_s
        if last:
            tail = f"{fmt_duration(elapsed)} in all"
        else:
            tail = f"ETA {fmt_duration(elapsed / len(self.records) * (self.total - done))}"
        self._say(f"zoexec: step {done}/{self.total}  {text}  {tail}")

    def _say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.print(line)
        else:
            print(line, file=self.stream, flush=True)

    # ---- the summary -----------------------------------------------------------------------
    def summary(self) -> str | None:
        """Print the end-of-run summary (rank 0, unless quiet) and return it."""
        if not self.show:
            return None
        text = "\n".join(summary_lines(self, self._history()))
        print(text, file=self.stream, flush=True)
        return text

    def _history(self) -> Iterable[StepRecord]:
        """Every step of the run: the log (a resumed run's earlier steps too), else this
        invocation's steps."""
        if self.out is not None:
            from zoexec.run.checkpoint import read_log

            with contextlib.suppress(ZoError, OSError):
                logged = read_log(self.out / "losses.jsonl")
                if logged:
                    return logged
        return self.records


def tensorboard_tag(key: str) -> str:
    """HF Trainer's tags: eval_loss -> eval/loss, loss -> train/loss, train_loss (the
    run's mean) -> train/train_loss."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    return "train/" + key


class _Bar:
    """The rich progress bar on a terminal (stderr)."""

    def __init__(self, reporter: Reporter) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]zoexec"), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), TextColumn("{task.description}"),
                            console=Console(file=reporter.stream), transient=False)
        self.task = self.bar.add_task("", total=reporter.total, completed=reporter.first)
        self.bar.start()

    def update(self, text: str) -> None:
        self.bar.update(self.task, advance=1, description=text)

    def print(self, line: str) -> None:
        self.bar.console.print(line, highlight=False, markup=False)

    def stop(self) -> None:
        self.bar.stop()


# ---- the summary's lines -------------------------------------------------------------------
def summary_lines(rep: Reporter, history: Iterable[StepRecord]) -> list[str]:
    cfg = rep.cfg
    now = rep.clock()
    begin = rep.begin_s if rep.begin_s is not None else now
    end = rep.end_s if rep.end_s is not None else now
    steps = len(rep.records)
    first = rep.records[0].step + 1 if rep.records else cfg.start_step
    span = f"steps {first}-{first + steps - 1} of {cfg.optim.steps}" if steps else "no steps"
    resumed = f", resumed after step {cfg.start_step}" if cfg.resumed else ""
    step_s = sum(r.step_time_s for r in rep.records)
    tokens = sum(r.tokens_per_s * r.step_time_s for r in rep.records)
    rate = f" ({tokens / step_s:,.0f} tok/s)" if step_s > 0 else ""
    lines = [f"zoexec: done: {steps} steps ({span}{resumed}) in {fmt_duration(now - rep.created_s)}: "
             f"start-up {fmt_duration(begin - rep.created_s)}, training "
             f"{fmt_duration(end - begin)}{rate}, saving {fmt_duration(now - end)}"]
    lines.append(_loss_line(history))
    lines += _eval_lines(rep)
    lines += _output_lines(rep)
    return [line for line in lines if line]


def _loss_line(history: Iterable[StepRecord]) -> str:
    good = [r for r in history if r.finite and not r.skipped]
    if not good:
        return "  loss: no finite step"
    window = max(1, min(LOSS_WINDOW, len(good) // 2))   # a short run: halves, apart
    head, tail = good[:window], good[-window:]

    def part(records: list[StepRecord]) -> str:
        mean = sum(r.loss for r in records) / len(records)
        where = (f"step {records[0].step + 1}" if len(records) == 1
                 else f"steps {records[0].step + 1}-{records[-1].step + 1}")
        return f"{mean:.4f} (mean of {where})" if len(records) > 1 else f"{mean:.4f} ({where})"
    if len(good) == 1:
        return f"  loss {part(head)}"
    return f"  loss {part(head)} -> {part(tail)}"


def _eval_lines(rep: Reporter) -> list[str]:
    if not rep.evals:
        return []

    def figures(metrics: Metrics) -> str:
        return "  ".join(f"{k} {_fmt_metric(v)}" for k, v in metrics.items())
    step, last = rep.evals[-1]
    lines = [f"  eval, final (after step {step}): {figures(last)}"]
    best = rep.best_eval()
    count = len(rep.earlier) + len(rep.evals)
    if count > 1 and best is not None:
        how = "highest" if best[2] == "eval_accuracy" else "lowest"
        before = f" ({len(rep.earlier)} before the resume)" if rep.earlier else ""
        lines.append(f"  eval, best of {count}{before} by {how} {best[2]} (after step "
                     f"{best[0]}): {figures(best[1])}")
    return lines


def _output_lines(rep: Reporter) -> list[str]:
    cfg = rep.cfg
    lines: list[str] = []
    if rep.out is None:
        lines.append("  weights: not saved (no --out)")
    else:
        lines.append(f"  run folder: {rep.out}")
        final = rep.out / "final"
        if final.is_dir():
            lines += _adapter_lines(cfg, final) if (final / ADAPTER_CONFIG).is_file() else [
                f"  model: {final}  ({_weights_note(final)}; AutoModelForCausalLM.from_pretrained)"]
            lines.append(f"  tokenizer: {_tokenizer_note(cfg, final)}")
        snaps = [p.name for _, p in sorted((snapshot_step(p.name), p) for p in
                                           (rep.out / "snapshots").glob("*") if p.is_dir()
                                           and snapshot_step(p.name) is not None)]
        if snaps:
            lines.append(f"  snapshots: {rep.out / 'snapshots'} ({', '.join(snaps)})")
        lines.append(f"  logs: {rep.out / METRICS}, {rep.out / 'losses.jsonl'}")
        if rep.report_to == "tensorboard":
            board = rep.out / TENSORBOARD_DIR
            lines.append(f"  tensorboard: {board}  (tensorboard --logdir {board})")
        if rep.report_to == "wandb":
            lines.append(f"  wandb: {rep.out / WANDB_DIR}  (offline: wandb sync "
                         f"{rep.out / WANDB_DIR}/offline-run-*)")
        if rep.report_to == "mlflow":
            lines.append(f"  mlflow: {rep.out / MLFLOW_DIR}  (mlflow ui --backend-store-uri "
                         f"{(rep.out / MLFLOW_DIR).resolve().as_uri()}; or $MLFLOW_TRACKING_URI)")
    if cfg.logging.trace:
        lines.append(f"  trace: {cfg.logging.trace}  (zoplan show / zoplan calibrate)")
    return lines


def _weights_note(final: Path) -> str:
    shards = sorted(final.glob("model-*-of-*.safetensors"))
    weights = f"{len(shards)} safetensors shards" if shards else "model.safetensors"
    return f"config, generation config, {weights}"


def _adapter_lines(cfg: RunConfig, final: Path) -> list[str]:
    """A LoRA run's final/: a PEFT adapter folder, and the line that loads it."""
    head = f"  adapters: {final}  (PEFT adapters: adapter_model.safetensors, {ADAPTER_CONFIG})"
    if cfg.source_dir is None:
        return [head, "  base: the run's random weights (--init random), which no folder "
                      "holds: the adapters load onto those weights only"]
    base = Path(cfg.source_dir).resolve()
    # a prefix has no weights to merge (zoexec export refuses it): it is loaded over its base
    merge = ("" if _is_prefix(final) else f";  zoexec export --merge {final} --base "
             f"{cfg.source_dir} -o DIR (one plain HF folder)")
    return [head,
            f"  load: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("
            f"{str(base)!r}), {str(final.resolve())!r})",
            f"  or: zoexec eval {final} --data FILE{merge}"]


def _is_prefix(final: Path) -> bool:
    """A PEFT folder of prefixes (PREFIX_TUNING), not of LoRA adapters."""
    try:
        peft_type: object = json.loads((final / ADAPTER_CONFIG).read_text()).get("peft_type")
        return peft_type == "PREFIX_TUNING"
    except (OSError, ValueError, AttributeError):
        return False


def _tokenizer_note(cfg: RunConfig, final: Path) -> str:
    from zoexec.model.export import tokenizer_files

    if tokenizer_files(final):
        return f"in {final} (AutoTokenizer.from_pretrained)"
    if cfg.source_dir is None:
        return ("none: the run started from random weights (--init random); "
                "copy a tokenizer into it to use it with AutoTokenizer")
    if tokenizer_files(Path(cfg.source_dir)):
        return f"in {cfg.source_dir} (AutoTokenizer.from_pretrained)"
    return f"none: {cfg.source_dir} has no tokenizer files"
