"""`zoexec` command line: `zoexec run plan.json` executes a zoplan plan.

Thin: parse, build a RunConfig, call zoexec.launch.run. A user-facing problem (bad plan,
wrong machine, missing model) is one red line on stderr and exit code 2, before any
output is written; a rank that crashes is one red line naming the rank, exit code 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from zoexec.hostenv import quiet_openmp
from zoplan.errors import EXIT_USER_ERROR, ZoError, exit_with_error, need_exec_extra

quiet_openmp()   # before torch is imported: the ranks inherit it

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Execute a zoplan plan: MeZO fine-tuning with blocks streamed from host memory.")
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Execute zoplan plans (NCCL on CUDA GPUs, gloo on the CPU)."""


@app.command("run")
def run_cmd(
    plan: Annotated[Path, typer.Argument(help="plan.json written by `zoplan optimize`")],
    model_path: Annotated[Optional[Path], typer.Option(help="Local HF model directory (config.json + weights); default: random init")] = None,
    init: Annotated[Optional[str], typer.Option(help="'random': seeded random weights (the default without --model-path)")] = None,
    data: Annotated[Optional[Path], typer.Option(help="JSONL file ({'text'} or {'input_ids'} per line); default: the built-in synthetic task")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (default: 10; with --trace, enough of the plan's predicted steps for 25 s)")] = None,
    seed: Annotated[int, typer.Option(help="Base seed: z, data order and random init")] = 0,
    lr: Annotated[float, typer.Option(help="Learning rate")] = 1e-6,
    eps: Annotated[float, typer.Option(help="Perturbation scale")] = 1e-3,
    weight_decay: Annotated[float, typer.Option(help="Weight decay (not on biases and norms)")] = 0.0,
    out: Annotated[Optional[Path], typer.Option(help="Output folder: losses.jsonl and final/ (HF weights)")] = None,
    trace: Annotated[Optional[Path], typer.Option(help="Trace folder: measured spans (zoplan show/calibrate)")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank (default: cores / local ranks)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display")] = False,
) -> None:
    """Run the plan's ranks (here, or one rank per process under torchrun)."""
    try:
        from zoexec.launch import RankFailure, build_config, run  # torch: after quiet_openmp
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec run")))
    try:
        cfg = build_config(plan=plan, model_path=model_path, init=init, data=data, steps=steps,
                           seed=seed, lr=lr, eps=eps, weight_decay=weight_decay, out=out,
                           trace=trace, threads=threads, quiet=quiet)
        if steps is None and trace is not None and not quiet:
            step_s = cfg.plan["predicted"]["step_time_s"]
            err_console.print(f"--trace without --steps: {cfg.steps} steps, about "
                              f"{(cfg.steps - 1) * step_s:.0f} s of the plan's predicted "
                              f"{step_s:.3f} s steps (a trace for `zoplan calibrate` "
                              f"should average 20 s or more of the machine's speeds)",
                              style="dim", highlight=False)
        run(cfg)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    except RankFailure as exc:
        exit_with_error(str(exc), exc.exit_code)


def main() -> None:
    """Entry point. Standalone mode: click shows usage errors (exit 2) and exits with
    typer.Exit's code; run_cmd turns ZoError / RankFailure into one red line."""
    app()


if __name__ == "__main__":
    main()
