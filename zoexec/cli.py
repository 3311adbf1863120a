"""`zoexec` command line: `zoexec run plan.json` executes a zoplan plan.

Thin: parse, build a RunConfig, call zoexec.launch.spawn.run. A user-facing problem (bad plan,
wrong machine, missing model) is one red line on stderr and exit code 2, before any
output is written; a rank that crashes is one red line naming the rank, exit code 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from zoexec.runtime.hostenv import quiet_openmp
from zoplan.errors import EXIT_USER_ERROR, ZoError, exit_with_error, need_exec_extra

quiet_openmp()   # before torch is imported: the ranks inherit it

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Execute a zoplan plan: MeZO fine-tuning with blocks streamed from host memory.")
err_console = Console(stderr=True)
TASK_HELP = ("text (packed LM loss), completion (loss on the completion only) or classification "
             "(label words after a template); default text")
TEMPLATE_HELP = ("classification: the prompt, each {column} filled from the row, e.g. "
                 "'{sentence} It was'")
LABEL_WORDS_HELP = ("classification: the candidates, comma-separated, label 0 first, e.g. "
                    "'terrible,great' (each scored with a space before it)")
# the task options `run` and `eval` share
TaskOpt = Annotated[Optional[str], typer.Option(help=TASK_HELP)]
TextColumnOpt = Annotated[Optional[str], typer.Option(
    help="text task: the documents' column (default 'text'; or 'input_ids')")]
PromptColumnOpt = Annotated[Optional[str], typer.Option(
    help="completion task: the prompt's column (default 'prompt')")]
CompletionColumnOpt = Annotated[Optional[str], typer.Option(
    help="completion task: the completion's column (default 'completion')")]
LabelColumnOpt = Annotated[Optional[str], typer.Option(
    help="classification: the label's column (default 'label'; an index or a label word)")]
TemplateOpt = Annotated[Optional[str], typer.Option(help=TEMPLATE_HELP)]
LabelWordsOpt = Annotated[Optional[str], typer.Option(help=LABEL_WORDS_HELP)]


@app.callback()
def _root() -> None:
    """Execute zoplan plans (NCCL on CUDA GPUs, gloo on the CPU)."""


@app.command("run")
def run_cmd(
    plan: Annotated[Path, typer.Argument(help="plan.json written by `zoplan optimize`")],
    model_path: Annotated[Optional[Path], typer.Option(help="Local HF model directory (config.json + weights); default: random init")] = None,
    init: Annotated[Optional[str], typer.Option(help="'random': seeded random weights (the default without --model-path)")] = None,
    data: Annotated[Optional[Path], typer.Option(help="Training data: JSONL, JSON, CSV, Parquet or a save_to_disk folder, in the --task's columns; default: the built-in synthetic task")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps in all (default: 10; with --trace, enough of the plan's predicted steps for 25 s; with --resume, the run's)")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Base seed: z, data order and random init (default 0)")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (default 1e-6)")] = None,
    lr_schedule: Annotated[Optional[str], typer.Option(help="constant, linear or cosine (decay to 0 over the steps; default constant)")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option(help="Steps of linear warm-up from 0 (default 0)")] = None,
    eps: Annotated[Optional[float], typer.Option(help="Perturbation scale (default 1e-3)")] = None,
    weight_decay: Annotated[Optional[float], typer.Option(help="Weight decay, not on biases and norms (default 0)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run folder: run.json, losses.jsonl, metrics.jsonl, snapshots/, final/ (HF model + tokenizer)")] = None,
    resume: Annotated[Optional[Path], typer.Option(help="Continue the run in this folder from its newest snapshot and log")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run an existing --out folder holds")] = False,
    save_every: Annotated[Optional[str], typer.Option(help="Snapshot every N steps (500) or every duration (30m, 2h); default 30m")] = None,
    keep: Annotated[int, typer.Option(help="Snapshots kept (the newest)")] = 2,
    on_nonfinite: Annotated[str, typer.Option(help="A non-finite loss: 'stop' the run (saving the weights before it) or 'skip' the step")] = "stop",
    trace: Annotated[Optional[Path], typer.Option(help="Trace folder: measured spans (zoplan show/calibrate)")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank (default: cores / local ranks)")] = None,
    report_to: Annotated[str, typer.Option(help="Metrics besides OUT/metrics.jsonl: 'none' or 'tensorboard' (OUT/runs/; needs the tensorboard package)")] = "none",
    log_every: Annotated[Optional[int], typer.Option(help="Off a terminal, a progress line every N steps (default: about every 30 s)")] = None,
    max_shard_size: Annotated[Optional[str], typer.Option(help="Saved weights in safetensors shards of at most this size (default 5GB)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary (errors and warnings only); silences transformers' bars too")] = False,
    task: TaskOpt = None,
    text_column: TextColumnOpt = None,
    prompt_column: PromptColumnOpt = None,
    completion_column: CompletionColumnOpt = None,
    label_column: LabelColumnOpt = None,
    template: TemplateOpt = None,
    label_words: LabelWordsOpt = None,
    eval_data: Annotated[Optional[Path], typer.Option(help="Held-out data (the task's format): eval_loss (and eval_accuracy, eval_f1 for classification) after the last step")] = None,
    eval_every: Annotated[Optional[int], typer.Option(help="Evaluate --eval-data every N steps too")] = None,
) -> None:
    """Run the plan's ranks (here, or one rank per process under torchrun)."""
    try:
        from zoexec.launch.spawn import RankFailure, run  # torch: after quiet_openmp
        from zoexec.options import build_config, task_options
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec run")))
    try:
        given_task = task_options(task=task, text_column=text_column, prompt_column=prompt_column,
                                  completion_column=completion_column, label_column=label_column,
                                  template=template, label_words=label_words)
        cfg = build_config(task=given_task, eval_data=eval_data, eval_every=eval_every,
                           plan=plan, model_path=model_path, init=init, data=data, steps=steps,
                           seed=seed, lr=lr, eps=eps, weight_decay=weight_decay, out=out,
                           trace=trace, threads=threads, quiet=quiet, resume=resume,
                           overwrite=overwrite, save_every=save_every, keep=keep,
                           on_nonfinite=on_nonfinite, lr_schedule=lr_schedule,
                           warmup_steps=warmup_steps, report_to=report_to,
                           log_every=log_every, max_shard_size=max_shard_size)
        def note() -> None:
            if steps is None and trace is not None and not quiet and resume is None:
                step_s = cfg.plan["predicted"]["step_time_s"]
                err_console.print(f"--trace without --steps: {cfg.steps} steps, about "
                                  f"{(cfg.steps - 1) * step_s:.0f} s of the plan's predicted "
                                  f"{step_s:.3f} s steps (a trace for `zoplan calibrate` "
                                  f"should average 20 s or more of the machine's speeds)",
                                  style="dim", highlight=False)
        run(cfg, checked=note)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    except RankFailure as exc:
        exit_with_error(str(exc), exc.exit_code)


@app.command("eval")
def eval_cmd(
    model_dir: Annotated[Path, typer.Argument(help="Local HF model folder (config.json, weights, tokenizer): a base model or a run's final/ or snapshot")],
    data: Annotated[Path, typer.Option(help="Evaluation data: .jsonl, .json, .csv, .parquet or a save_to_disk folder")],
    task: TaskOpt = None,
    text_column: TextColumnOpt = None,
    prompt_column: PromptColumnOpt = None,
    completion_column: CompletionColumnOpt = None,
    label_column: LabelColumnOpt = None,
    template: TemplateOpt = None,
    label_words: LabelWordsOpt = None,
    batch: Annotated[int, typer.Option(help="Rows per forward pass")] = 8,
    seq: Annotated[Optional[int], typer.Option(help="Longest row in tokens (default: the model's positions, at most 512)")] = None,
    dtype: Annotated[str, typer.Option(help="Precision of the weights and the forward: fp32, bf16 or fp16")] = "fp32",
    threads: Annotated[Optional[int], typer.Option(help="torch threads (default: all cores)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the metrics as one JSON object")] = False,
) -> None:
    """Evaluate a saved model on a data set: eval_loss, and eval_accuracy (eval_f1 with
    two labels) for classification; the blocks stream from host memory as in a run."""
    try:
        from zoexec.launch.evaluate import eval_config, eval_model
        from zoexec.options import task_options
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec eval")))
    try:
        spec = task_options(task=task, text_column=text_column, prompt_column=prompt_column,
                            completion_column=completion_column, label_column=label_column,
                            template=template, label_words=label_words)
        from zoexec.data.tasks import TaskSpec

        cfg = eval_config(model_dir, data, TaskSpec.from_dict(spec), batch=batch, seq=seq,
                          dtype=dtype, threads=threads)
        metrics = eval_model(cfg)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    except ValueError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    if as_json:
        import json

        print(json.dumps({"model": str(model_dir), "data": str(data), **metrics}))
        return
    shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
    print(f"{model_dir}: {shown}")


def main() -> None:
    """Entry point. Standalone mode: click shows usage errors (exit 2) and exits with
    typer.Exit's code; run_cmd turns ZoError / RankFailure into one red line."""
    app()


@app.command("clean")
def clean_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing")] = False,
) -> None:
    """Remove the shared-memory files of zoexec runs that died (never a live run's)."""
    from zoexec.store.shmfiles import FOREIGN, LIVE, SHM_DIR, STALE, UNOWNED, freed_line, sweep
    from zoplan.memory import fmt_bytes

    found = sweep(dry_run=dry_run)
    console = Console(highlight=False, soft_wrap=True)
    notes = {STALE: ("would remove" if dry_run else "removed", "its owner, pid {pid}, has exited"),
             LIVE: ("kept", "in use: its owner, pid {pid}, is running"),
             UNOWNED: ("left", "no owner in its name: remove it by hand if no run uses it"),
             FOREIGN: ("left", "made on another boot, host or container")}
    for item in found:
        verb, why = notes[item.state]
        pid = item.owner.pid if item.owner else "?"
        console.print(f"{verb:12} {item.path}  ({fmt_bytes(item.nbytes)}; {why.format(pid=pid)})")
    console.print(freed_line(found, dry_run=dry_run) or f"zoexec: no stale files in {SHM_DIR}",
                  style="dim")


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


if __name__ == "__main__":
    main()
