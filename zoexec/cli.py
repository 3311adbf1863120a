"""`zoexec` command line: `zoexec run plan.json` executes a zoplan plan.

Thin: parse, build a RunConfig, call zoexec.launch.spawn.run. A user-facing problem (bad plan,
wrong machine, missing model) is one red line on stderr and exit code 2, before any
output is written; a rank that crashes is one red line naming the rank, exit code 1.
"""

from __future__ import annotations

import inspect
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from zoexec.config import (
    SECTIONS,
    TASK_FIELDS,
    EvalOptions,
    ModelOptions,
    RuntimeOptions,
    check_given,
    env_defaults,
    option_error,
)
from zoexec.data.presets import with_preset
from zoexec.data.section import TaskOptions
from zoexec.fields import FieldError
from zoexec.flags import PARAM, config_options, config_values, given, section_params, with_params
from zoexec.runtime.hostenv import quiet_openmp
from zoplan.errors import EXIT_USER_ERROR, ZoError, exit_with_error, need_exec_extra
from zoplan.hubcache import model_folder
from zoplan.usage import OneLineUsage

quiet_openmp()   # before torch is imported: the ranks inherit it

app = typer.Typer(cls=OneLineUsage, add_completion=False, no_args_is_help=True,
                  help="Execute a zoplan plan: MeZO fine-tuning with blocks streamed from host memory.")
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Execute zoplan plans (NCCL on CUDA GPUs, gloo on the CPU)."""


def run_cmd(plan: Path, config: Path | None = None, print_config: str | None = None,
            **values: Any) -> None:
    """Run the plan's ranks (here, or one rank per process under torchrun). A stop signal
    while the run is not taking them (before its ranks do, after they end) stops at once,
    the files made so far removed (zoexec.runtime.procwatch.stop_at_once): Ctrl-C exits
    130 quietly, SIGTERM 143 and SIGHUP 129 with one line naming it."""
    with _stops_at_once():
        _run_cmd(plan, config, print_config, **values)


@contextmanager
def _stops_at_once() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the command at once, what it made removed
    (zoexec.runtime.procwatch.stop_at_once), except where a run takes them over."""
    from zoexec.runtime.procwatch import stop_at_once

    main = threading.current_thread() is threading.main_thread()   # signals: the main thread's
    previous = {s: signal.signal(s, stop_at_once)
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if main}
    try:
        yield
    except KeyboardInterrupt:   # a second Ctrl-C in a rank: at once, quietly
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run_cmd(plan: Path, config: Path | None, print_config: str | None, **values: Any) -> None:
    try:
        options = {**(config_options(config, *SECTIONS.values()) if config else {}),
                   **given(values)}   # the command line over the file
        if print_config is not None:
            _print_config(options, print_config)
            return
    except FieldError as exc:
        exit_with_error(option_error(exc), EXIT_USER_ERROR)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    try:
        _check_limits(plan, options)   # before torch: under a low ulimit it fails half-imported
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    try:
        from zoexec.launch.spawn import RankFailure, Stopped, run  # torch: after quiet_openmp
        from zoexec.options import build_config
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec run")))
    try:
        cfg = build_config(plan=plan, **options)

        def note() -> None:
            for line in cfg.notes:   # the run folder's: a damaged snapshot passed over, ...
                err_console.print(line, highlight=False, soft_wrap=True)
            if cfg.checkpoint.out and cfg.logging.progress and not cfg.resumed:   # kill -9
                err_console.print(f"zoexec: if the run stops, resume it with: "
                                  f"{cfg.resume_command()}", style="dim", highlight=False,
                                  soft_wrap=True)
            if "steps" not in options and "trace" in options and cfg.logging.progress \
                    and not cfg.resumed:
                step_s = cfg.plan["predicted"]["step_time_s"]
                err_console.print(f"--trace without --steps: {cfg.optim.steps} steps, about "
                                  f"{(cfg.optim.steps - 1) * step_s:.0f} s of the plan's "
                                  f"predicted {step_s:.3f} s steps (a trace for `zoplan "
                                  f"calibrate` should average 20 s or more of the machine's "
                                  f"speeds)", style="dim", highlight=False)
        run(cfg, checked=note)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    except Stopped as exc:
        if exc.exit_code < 128:   # a non-finite step, a diverging loss: the run failed
            exit_with_error(str(exc), exc.exit_code)
        err_console.print(f"zoexec: {exc}", highlight=False, soft_wrap=True)   # a signal's stop,
        raise SystemExit(exc.exit_code) from None                             # saved: no error
    except RankFailure as exc:
        exit_with_error(str(exc), exc.exit_code)


def _print_config(options: dict[str, Any], target: str, *, command: str = "run PLAN") -> None:
    """--print-config: the options (checked, each on its own) as a config file."""
    from zoplan.configfile import write_config

    check_given(options)
    text = write_config(config_values(options), target)
    if text is not None:
        print(text, end="")
    else:
        err_console.print(f"zoexec: wrote {target} (zoexec {command} --config {target})",
                          highlight=False, soft_wrap=True)


def _command_options(config: Path | None, print_config: str | None, values: dict[str, Any],
                     params: list[inspect.Parameter], *, command: str) -> dict[str, Any] | None:
    """A command's options (eval, lengths): its --config file's (only the options the
    command takes, `params`), then the command line's over them; with --print-config
    they are written instead (None). A bad file or value: one line, exit 2."""
    only = {p.name for p in params}
    sections = (TaskOptions, EvalOptions, ModelOptions, RuntimeOptions)
    try:
        options = {**(config_options(config, *sections, only=only) if config else {}),
                   **given(values)}
        if print_config is None:
            return options
        _print_config(options, print_config, command=command)
        return None
    except FieldError as exc:
        exit_with_error(option_error(exc), EXIT_USER_ERROR)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)


def _command_config_params(command: str) -> list[inspect.Parameter]:
    """--config and --print-config of `zoexec COMMAND` (eval, lengths): its options
    from a file, read as `zoexec run` reads one."""
    return [
        inspect.Parameter("config", PARAM, default=None, annotation=Annotated[
            Optional[Path], typer.Option(
                help=f"Options of zoexec {command} from a YAML or JSON file (each under its "
                     f"name, its flag or an HF Trainer alias); the command line overrides it "
                     f"(docs/options.md)", metavar="FILE")]),
        inspect.Parameter("print_config", PARAM, default=None, annotation=Annotated[
            Optional[str], typer.Option(
                help="Write the options given (the file's and the command line's) as a "
                     "config file --config reads (YAML; .json: JSON; -: stdout) and run "
                     "nothing", metavar="FILE")])]


def _check_limits(plan: Path, options: dict[str, Any]) -> None:
    """The process limits against what the plan's local ranks need (zoexec.launch.limits)."""
    import os

    from zoexec.launch.limits import check_limits

    ranks = 1
    try:
        if os.environ.get("LOCAL_WORLD_SIZE"):   # under torchrun: this node's ranks
            ranks = int(os.environ["LOCAL_WORLD_SIZE"])
        else:
            from zoplan.io import load_json
            from zoplan.layout import Layout

            ranks = Layout.from_dict(load_json(plan, what="plan")["layout"]).local_ranks
    except Exception:  # noqa: BLE001 - a bad plan: build_config says what is wrong
        pass
    threads = options.get("threads")
    check_limits(threads=int(threads) if threads else None, ranks=max(1, ranks))


PLAN_ARG = inspect.Parameter("plan", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
    Path, typer.Argument(help="plan.json written by `zoplan optimize`")])
CONFIG_PARAMS = [
    inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        Optional[Path], typer.Option(
            help="Options from a YAML or JSON file (any option under its name or an HF Trainer "
                 "alias: learning_rate: 1.0e-6); the command line overrides it (docs/options.md)",
            metavar="FILE")]),
    inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        Optional[str], typer.Option(
            help="Write the options given (the file's and the command line's) as a config file "
                 "--config reads (YAML; .json: JSON; -: stdout) and run nothing",
            metavar="FILE")])]
app.command("run")(with_params(run_cmd, [PLAN_ARG, *CONFIG_PARAMS,
                                         *section_params(*SECTIONS.values())]))


def eval_cmd(model_dir: Path, data: Path, as_json: bool = False, config: Path | None = None,
             print_config: str | None = None, **values: Any) -> None:
    """Evaluate a saved model on a data set: eval_loss, and eval_accuracy (eval_f1 with
    two labels) for classification, eval_accuracy and eval_accuracy_norm for multiple
    choice, eval_exact_match and eval_f1 for generation; the blocks stream from host
    memory as in a run."""
    options = _command_options(config, print_config, values, EVAL_OPTIONS,
                               command=f"eval MODEL --data {data}")
    if options is None:   # --print-config
        return
    try:
        from zoexec.launch.evaluate import eval_config, eval_model
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec eval")))
    try:
        model_dir = model_folder(str(model_dir), what="zoexec eval")   # or a Hub id, cached
        cfg = eval_config(model_dir, data, **options)
        with _stops_at_once():
            metrics = eval_model(cfg)
    except FieldError as exc:
        exit_with_error(option_error(exc), EXIT_USER_ERROR)
    except (ZoError, ValueError) as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    if as_json:
        import json

        print(json.dumps({"model": str(model_dir), "data": str(data), **metrics}))
        return
    shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
    print(f"{model_dir}: {shown}")


# task options that only training reads: `zoexec eval --help` does not list them
TRAINING_ONLY = ("demonstrations_in_training",)
EVAL_PARAMS = [
    inspect.Parameter("model_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        Path, typer.Argument(help="Local HF model folder (config.json, weights, tokenizer): a "
                                  "base model or a run's final/, best/ or snapshot; or a LoRA "
                                  "run's (a PEFT adapter folder), over its base; or a Hub id "
                                  "in the local HF cache")]),
    inspect.Parameter("data", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[
        Path, typer.Option(help="Evaluation data: .jsonl, .json, .csv, .parquet or a "
                                "save_to_disk folder")]),
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
        bool, typer.Option("--json", help="Print the metrics as one JSON object")]),
    *_command_config_params("eval")]
EVAL_OPTIONS = [
    *section_params(TaskOptions, keep=(*(f for f in TASK_FIELDS if f not in TRAINING_ONLY),
                                       "eval_samples")),
    *section_params(EvalOptions), *section_params(RuntimeOptions, keep=("threads",))]
EVAL_PARAMS += EVAL_OPTIONS
app.command("eval")(with_params(eval_cmd, EVAL_PARAMS))


def lengths_cmd(data: Path, output: Path, config: Path | None = None,
                print_config: str | None = None, **values: Any) -> None:
    """Measure the token widths of the rows the task's training batches pack, for
    `zoplan optimize --lengths`: the plan then prices a batch's padded width."""
    options = _command_options(config, print_config, values, LENGTHS_OPTIONS,
                               command=f"lengths {data} -o {output}")
    if options is None:   # --print-config
        return
    try:
        from zoexec.data.lengths import measure_lengths
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec lengths")))
    try:
        options = with_preset(options)
        model_dir = options.pop("model_path", None)
        if model_dir is None:
            raise ZoError("zoexec lengths needs --model-path DIR (the tokenizer to count with)")
        model_dir = model_folder(model_dir)
        task = TaskOptions(data=str(data), **options)
        doc = measure_lengths(data, task, model_dir=Path(model_dir), output=output)
    except FieldError as exc:
        exit_with_error(option_error(exc), EXIT_USER_ERROR)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    widths = [w for w, _ in doc["histogram"]]
    print(f"zoexec: wrote {output}: {doc['count']} examples, {doc['rows_per_example']} "
          f"row(s) each, {widths[0]}..{widths[-1]} tokens, the head at "
          f"{doc['head_positions']:.3g} position(s) per example")


LENGTHS_PARAMS = [
    inspect.Parameter("data", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        Path, typer.Argument(help="Training data: .jsonl, .json, .csv, .parquet or a "
                                  "save_to_disk folder, in the --task's columns")]),
    inspect.Parameter("output", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[
        Path, typer.Option("-o", "--out", "--output", help="The lengths file to write")]),
    *_command_config_params("lengths")]
LENGTHS_OPTIONS = [*section_params(ModelOptions, keep=("model_path",)),
                   *section_params(TaskOptions, keep=TASK_FIELDS)]
LENGTHS_PARAMS += LENGTHS_OPTIONS
app.command("lengths")(with_params(lengths_cmd, LENGTHS_PARAMS))


@app.command("export")
def export_cmd(
    merge: Annotated[Path, typer.Option(help="A LoRA run's final/ or snapshot (a PEFT adapter folder)")],
    base: Annotated[str, typer.Option(help="The base model the run trained on: its folder (config.json, weights) or a Hub id in the local HF cache", metavar="PATH")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="Where to write the merged HF model folder")],
    accept_other_base: Annotated[bool, typer.Option(
        "--accept-other-base", help="Merge into a base other than the one the run trained on "
                                    "(its recorded fingerprint differs, or it trained on random weights)")] = False,
) -> None:
    """Merge LoRA adapters into their base model (peft's merge_and_unload) and write
    one plain HF model folder. The adapters are checked first: every file against the
    checksums their state.json records, their r, alpha and targets against the run's,
    and --base against the base the run trained on (a folder, or a Hub id resolved in
    the local Hugging Face cache as --model-path is)."""
    try:
        from zoexec.model.lora import merge_adapters
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec export")))
    try:
        if output.exists() and any(output.iterdir()) if output.is_dir() else output.exists():
            raise ZoError(f"-o {output}: exists and is not an empty folder")
        folder = model_folder(base, what="--base")   # or a Hub id, cached
        merge_adapters(merge, folder, output, accept_other_base=accept_other_base)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    print(f"zoexec: read LoRA adapters {merge} and the base model {folder} (unchanged); "
          f"wrote {output}: a plain HF model folder (config, safetensors, tokenizer) of the "
          f"base with the adapters merged in")


def main() -> None:
    """Entry point. Standalone mode: click shows usage errors (exit 2) and exits with
    typer.Exit's code; run_cmd turns ZoError / RankFailure into one red line. The
    stop signals get their usual handlers back (zoexec/__init__.py exits at once on
    them while the command line is imported); run and eval take them over."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    app()


def clean_cmd(dry_run: bool = False, **values: Any) -> None:
    """Remove the shared-memory files of zoexec runs that died (never a live run's)."""
    from zoexec.store.shmfiles import FOREIGN, LIVE, STALE, UNOWNED, freed_line, shm_dir, sweep
    from zoplan.memory import fmt_bytes

    try:
        options = {**env_defaults(given(values), keep=("shm_dir",)), **given(values)}
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    directory = shm_dir(options.get("shm_dir"))
    found = sweep(dry_run=dry_run, directory=directory)
    console = Console(highlight=False, soft_wrap=True)
    notes = {STALE: ("would remove" if dry_run else "removed", "its owner, pid {pid}, has exited"),
             LIVE: ("kept", "in use: its owner, pid {pid}, is running"),
             UNOWNED: ("left", "no owner in its name: remove it by hand if no run uses it"),
             FOREIGN: ("left", "made on another boot, host or container")}
    for item in found:
        verb, why = notes[item.state]
        pid = item.owner.pid if item.owner else "?"
        console.print(f"{verb:12} {item.path}  ({fmt_bytes(item.nbytes)}; {why.format(pid=pid)})")
    console.print(freed_line(found, dry_run=dry_run) or f"zoexec: no stale files in {directory}",
                  style="dim")


CLEAN_PARAMS = [
    inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing")]),
    *section_params(RuntimeOptions, keep=("shm_dir",))]
app.command("clean")(with_params(clean_cmd, CLEAN_PARAMS))


@app.command("import-gguf")
def import_gguf_cmd(
    gguf_file: Annotated[Path, typer.Argument(help="A GGUF file (llama.cpp's format) of a family zoexec runs")],
    out: Annotated[Path, typer.Option("-o", "--out", help="The HF model folder to write (must not exist)")],
    dtype: Annotated[str, typer.Option(help="Precision of the saved weights: auto (F32 -> fp32, F16 -> fp16, else bf16), fp32, bf16 or fp16")] = "auto",
) -> None:
    """Rebuild an ordinary HF model folder (config, safetensors, tokenizer) from a GGUF
    file, quantised weights dequantised: `zoexec run --model-path DIR` then reads it."""
    try:
        from zoexec.model.gguf_import import import_gguf
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec import-gguf")))
    try:
        folder = import_gguf(gguf_file, out, dtype=dtype)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    print(f"zoexec: wrote {folder} from {gguf_file}")


# `zoexec baseline mezo|zo2`: the programs zoexec is measured against (torch-free here)
from zoexec.baselines.command import baseline_cmd  # noqa: E402

app.command("baseline")(baseline_cmd)


if __name__ == "__main__":
    main()
