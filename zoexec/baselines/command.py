"""`zoexec baseline mezo|zo2`: time MeZO or ZO2 (zoexec.baselines) on a model, batch and
precision, as `zoexec run` would train them; prints seconds a step (the median, the
first step left out) and each task kind's busy seconds, or one JSON object (--json).
Torch is imported only when the command runs (zoexec.cli stays light)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer

from zoplan.errors import EXIT_USER_ERROR, ZoError, exit_with_error, need_exec_extra


def baseline_cmd(
    which: Annotated[Literal["mezo", "zo2"], typer.Argument(
        help="mezo: every weight on the device; zo2: blocks streamed from host memory")],
    model: Annotated[str, typer.Option(help="A catalogue name (zoplan models) or a config.json")] = "opt-1.3b",
    model_path: Annotated[str | None, typer.Option(
        help="A local HF model folder whose weights to load (default: random weights)")] = None,
    batch: Annotated[int, typer.Option(help="Rows a step")] = 8,
    seq: Annotated[int, typer.Option(help="Tokens a row")] = 512,
    steps: Annotated[int, typer.Option(help="Steps timed (the first is left out of the median)")] = 10,
    dtype: Annotated[Literal["fp32", "fp16", "bf16"], typer.Option(
        help="The weights' and the compute's precision")] = "bf16",
    lr: Annotated[float, typer.Option(help="Learning rate")] = 1e-6,
    eps: Annotated[float, typer.Option(help="Perturbation scale")] = 1e-3,
    weight_decay: Annotated[float, typer.Option(help="Weight decay (matrices only)")] = 0.0,
    seed: Annotated[int, typer.Option(help="Run seed (step seeds, random weights, data)")] = 0,
    device: Annotated[Literal["cpu", "cuda"], typer.Option(help="Where it runs")] = "cpu",
    host_memory: Annotated[Literal["pageable", "pinned"], typer.Option(
        help="zo2: the blocks' host memory (ZO2's code: pageable)")] = "pageable",
    attn: Annotated[str, typer.Option(help="HF attention implementation (both programs: eager)")] = "eager",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Also write the JSON here")] = None,
) -> None:
    """Time MeZO or ZO2, written from their published algorithms and run as their code
    runs, on the same model, batch and precision as a zoexec run."""
    try:
        from zoexec.baselines.common import BaselineConfig
        from zoexec.baselines.mezo import run_mezo
        from zoexec.baselines.zo2 import run_zo2
    except ModuleNotFoundError as exc:
        exit_with_error(str(need_exec_extra(exc, "zoexec baseline")))
    try:
        if out is not None:
            from zoplan.io import check_writable

            check_writable(out, what="--out")
        cfg = BaselineConfig(model=model, init=model_path or "random", batch=batch, seq=seq,
                             steps=steps, dtype=dtype, lr=lr, eps=eps, weight_decay=weight_decay,
                             seed=seed, device=device, host_memory=host_memory, attn=attn)
        result, _ = (run_mezo if which == "mezo" else run_zo2)(cfg)
    except ZoError as exc:
        exit_with_error(str(exc), EXIT_USER_ERROR)
    summary = result.summary()
    if out is not None:
        from zoplan.io import atomic_write_text

        try:
            atomic_write_text(out, json.dumps(summary, indent=2) + "\n", what="--out")
        except ZoError as exc:
            exit_with_error(str(exc), EXIT_USER_ERROR)
    if as_json:
        print(json.dumps(summary))
        return
    kinds = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in summary["kind_busy_s_median"].items())
    print(f"{which}: {summary['step_s_median'] * 1e3:.2f} ms a step (median of "
          f"{max(1, steps - 1)}), {cfg.model} {batch} x {seq} {dtype} on {device}; busy: {kinds}")
