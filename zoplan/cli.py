"""`zoplan` command line: thin typer commands that parse, call one function, render;
`zoplan optimize`'s options are made from the request's fields (zoplan.request), merged
over a --config file's.

Every user-facing problem is a ZoError: one red line on stderr, exit code 2, and no
half-written output file.

The planner never imports torch or zoexec, with one exception: `zoplan profile` calls
the executor package's profiler (zoexec.profiler), which measures with torch.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import Field
from pathlib import Path
from typing import Annotated, Any, Optional, ParamSpec, TypeVar

import typer
from rich.console import Console

from zoplan import calibrate as calibration
from zoplan import configfile, profiling, search
from zoplan.errors import ZoError, exit_with_error, need_exec_extra
from zoplan.hardware import load_profile
from zoplan.io import atomic_write_text, check_writable, dumps_canonical
from zoplan.origins import counts
from zoplan.profiling.spec import SpecSheet, build_spec_profile, spec_name_ok
from zoplan.request import (
    PlanRequest,
    all_fields,
    cli_names,
    config_keys,
    field_hints,
    shown_default,
)
from zoplan.search.rent import Option, rent
from zoplan.usage import OneLineUsage
from zoplan.views import calibrate as calibrate_view
from zoplan.views import optimize as optimize_view
from zoplan.views import stdout_console
from zoplan.views.compare import compare_command
from zoplan.views.distzo2 import distzo2_configs, render_distzo2
from zoplan.views.listings import render_models, render_profiles
from zoplan.views.profile import profile_progress, render_summary
from zoplan.views.rent import render_rent
from zoplan.views.show import render_short_timeline, show_command
from zoplan.views.tuning import render_tunings

app = typer.Typer(cls=OneLineUsage, add_completion=False, no_args_is_help=True,
                  help="Plan zeroth-order fine-tuning of models streamed from host memory.")
console = stdout_console()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def command(name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Register a typer command whose ZoErrors become one red line and exit code 2."""
    def register(func: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return func(*args, **kwargs)
            except ZoError as exc:
                exit_with_error(str(exc))
        return app.command(name)(wrapper)
    return register


@command("models")
def models_cmd() -> None:
    """List the model catalogue: blocks, parameters, bytes per block."""
    render_models(console)


@command("profiles")
def profiles_cmd() -> None:
    """List the shipped hardware profiles."""
    render_profiles(console)


def _option_param(f: Field[Any], hint: object, panel: str) -> inspect.Parameter:
    """The typer parameter of one request field: default None, so that what was given
    is known and overrides --config; the field's default is what --help shows."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if f.metadata["parse"] is not None or typing.get_origin(base) is tuple:
        base = str
    choices = f.metadata["choices"]
    metavar = f.metadata["metavar"] or ("[" + "|".join(map(str, choices)) + "]" if choices
                                        else None)
    opt = typer.Option(*cli_names(f), help=f.metadata["help"], rich_help_panel=panel,
                       show_default=shown_default(f) or False, metavar=metavar)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[base], opt])


CONFIG_PARAMS = [
    inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        Optional[Path], typer.Option(metavar="FILE", rich_help_panel="Request file", help=(
            "Options from a YAML or JSON file, each under its option name (`lora-r: 16`); "
            "the command line overrides the file"))]),
    inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, typer.Option(
                          "--print-config", rich_help_panel="Request file", help=(
                              "Print the request as YAML (every option, the file's and "
                              "the command line's) for --config, and plan nothing"))]),
]


def optimize_cmd(*, config: Path | None = None, print_config: bool = False,
                 **values: Any) -> None:
    """Search PertP x DDP layouts, slice size, prefetch depth, block placement and the
    devices used; write the best as a plan."""
    request = optimize_request(config, values)
    if print_config:
        console.file.write(configfile.dumps(request.config()))
        return
    out = request.output
    with optimize_view.search_progress(enabled=not (out.quiet or out.json_out)) as progress:
        plan, plans = search.plan_request(request, progress=progress)
    warning = optimize_view.rough_profile_warning(plan)
    if warning:
        Console(stderr=True).print(warning, style="yellow", highlight=False)
    if out.json_out:
        console.file.write(plan.to_json())
    elif not out.quiet:
        optimize_view.render_optimize(plan, console, top=out.top, output=Path(out.output),
                                      profile_arg=request.hardware.profile,
                                      sweep_nodes=out.sweep_nodes)
        render_short_timeline(plan, console)
        if plans is not None:
            render_tunings(plans, plan.workload.tuning, console, output=out.output)


def optimize_request(config: Path | None, values: dict[str, Any]) -> PlanRequest:
    """The checked request: the --config file's options, then those given on the
    command line over them (None: not given; a field's text parsed by the field)."""
    merged: dict[str, Any] = {}
    if config is not None:
        merged = configfile.read_config(config, config_keys(), field_hints())
    parse = {f.name: f.metadata["parse"] for _, f in all_fields()}
    for name, value in values.items():
        if value is not None:
            merged[name] = parse[name](value) if parse[name] and isinstance(value, str) else value
    return PlanRequest.make(**merged)


_HINTS = field_hints()
optimize_cmd.__signature__ = inspect.Signature([   # type: ignore[attr-defined]
    *(_option_param(f, _HINTS[f.name], section.PANEL) for section, f in all_fields()),
    *CONFIG_PARAMS])
optimize_cmd = command("optimize")(optimize_cmd)


@command("profile")
def profile_cmd(
    output: Annotated[Optional[Path], typer.Option("-o", "--out", "--output", help="Where to write the profile (default hwprofiles/<name>.json)")] = None,
    name: Annotated[Optional[str], typer.Option(help="Profile name (default: derived from the host)")] = None,
    ranks: Annotated[Optional[int], typer.Option(help="CPU only: gloo ranks to measure with (default: cores)")] = None,
    repeats: Annotated[int, typer.Option(help="Repetitions of each measurement")] = 5,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer sizes and repetitions (for tests)")] = False,
    cpu: Annotated[bool, typer.Option("--cpu", help="Profile the CPU/gloo path even where CUDA exists")] = False,
    time_budget: Annotated[Optional[float], typer.Option("--time-budget", metavar="SECONDS", help="How long measuring may take: rounds and retakes of disturbed samples stop there (default: 120 on the CPU, 60 on GPUs; the first round always ends, and the profile says by how much it ran over)")] = None,
) -> None:
    """Measure this machine (CUDA GPUs, or gloo ranks on the CPU) into a hardware profile,
    within a time budget; a progress line per stage with the ETA, and one line at the
    end on how much other processes disturbed the samples."""
    try:
        from zoexec import profiler  # the one import of the executor in the planner (the rule)
    except ModuleNotFoundError as exc:
        raise need_exec_extra(exc, "zoplan profile") from None

    profile, path = profiling.profile_machine(
        profiler=profiler, output=output, name=name, ranks=ranks, repeats=repeats,
        quick=quick, force_cpu=cpu, progress=lambda: profile_progress(console),
        time_budget_s=time_budget)
    render_summary(profile, path, console)


@command("calibrate")
def calibrate_cmd(
    plan: Annotated[Path, typer.Argument(help="plan.json that was run")],
    trace: Annotated[Path, typer.Argument(help="Trace directory written by `zoexec run --trace`")],
    fit: Annotated[bool, typer.Option("--fit", help="Refit the profile's constants to the measurement")] = False,
    output: Annotated[Optional[Path], typer.Option("-o", "--out", "--output", help="With --fit: where to write the refitted profile")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Profile the plan was made with (default: the plan's profile name)")] = None,
    skip: Annotated[int, typer.Option(help="First steps excluded from the medians")] = 1,
) -> None:
    """Predicted vs measured time per task kind and for the whole step."""
    result = calibration.calibrate(plan=plan, trace=trace, profile=profile, skip=skip, fit=fit,
                                   output=output)
    calibrate_view.render(result.calibration, console)
    if result.refit is not None:
        calibrate_view.render_refit(result.refit, result.calibration, console)


@command("show")
def show_cmd(
    plan: Annotated[Path, typer.Argument(help="plan.json")],
    trace: Annotated[Optional[Path], typer.Option(help="Trace directory to draw under the prediction")] = None,
    ranks: Annotated[Optional[str], typer.Option(help="Rank range, e.g. 0-3 or 0,2,5")] = None,
    blocks: Annotated[Optional[str], typer.Option(help="Block range to zoom into, e.g. 0-7")] = None,
    width: Annotated[Optional[int], typer.Option(help="Width of the chart in columns (default: terminal)")] = None,
    chrome: Annotated[Optional[Path], typer.Option(help="Write Chrome/Perfetto trace events here")] = None,
    svg: Annotated[Optional[Path], typer.Option(help="Save the rendered timeline as SVG here")] = None,
) -> None:
    """Draw the step as a Gantt chart: one row per rank and lane."""
    show_command(plan=plan, trace=trace, ranks=ranks, blocks=blocks, width=width,
                 chrome=chrome, svg=svg, console=console)


@command("compare")
def compare_cmd(
    plans: Annotated[list[Path], typer.Argument(help="Two or more plan.json files, or one plan to compare its candidates")],
) -> None:
    """Side-by-side table of plans (or of one plan's ranked candidates)."""
    compare_command(plans=plans, console=console)


@command("distzo2")
def distzo2_cmd(
    model: Annotated[str, typer.Option(help="Catalogue name (see `zoplan models`)")] = "opt-1.3b",
    gpus: Annotated[int, typer.Option(help="GPUs of one node")] = 4,
    profile: Annotated[str, typer.Option(help="Shipped profile name or profile JSON path (a GPU profile)")] = "dgx-a100-80gb",
    batch: Annotated[int, typer.Option(help="Global batch (sequences per step)")] = 4,
    seq: Annotated[int, typer.Option(help="Tokens per sequence")] = 2048,
    pertp: Annotated[int, typer.Option(help="Perturbation-Parallel degree (1 or 2); ddp = gpus / pertp")] = 2,
    precision: Annotated[str, typer.Option(help="fp16, bf16 or fp32")] = "fp16",
    pageable: Annotated[bool, typer.Option("--pageable", help="Blocks in pageable host memory (priced at the profile's pageable copy figures)")] = False,
) -> None:
    """DistZO2's own configurations, naive (every GPU uploads and offloads the whole
    block) and sliced (slices all-gathered over the fast fabric): the step and each
    stream's share of the step's GPU activity (docs/validation.md)."""
    configs = distzo2_configs(model=model, gpus=gpus, profile=profile, batch=batch, seq=seq,
                              pertp=pertp, precision=precision, pageable=pageable)
    render_distzo2(configs, console, title=(
        f"DistZO2 on {model}, {gpus} GPUs of {profile} (pertp {pertp} x ddp {gpus // pertp}), "
        f"batch {batch} x seq {seq}, {precision}, {'pageable' if pageable else 'pinned'}"))


@command("spec")
def spec_cmd(
    gpu: Annotated[str, typer.Option(help="GPU model: h100-sxm, h100-pcie, h200, a100-sxm-80, a100-sxm-40, a100-pcie-80, a100-pcie-40, l40s, rtx4090")],
    count: Annotated[int, typer.Option(help="GPUs in the node")],
    host_memory_gb: Annotated[float, typer.Option(help="Host memory of the node, GB as sold")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="Where to write the profile")],
    sockets: Annotated[int, typer.Option(help="CPU sockets")] = 2,
    cores: Annotated[int, typer.Option(help="Cores per socket")] = 64,
    pcie_gen: Annotated[Optional[int], typer.Option(help="PCIe generation of the GPUs' links (default: the GPU model's)")] = None,
    lanes: Annotated[int, typer.Option(help="PCIe lanes per GPU")] = 16,
    per_switch: Annotated[int, typer.Option(help="GPUs sharing one PCIe switch uplink (1: each GPU its own path to the host)")] = 1,
    nvlink: Annotated[Optional[bool], typer.Option("--nvlink/--no-nvlink", help="NVLink between the GPUs (default: the model's: SXM an NVSwitch, PCIe cards bridged pairs)")] = None,
    memory_gib: Annotated[Optional[float], typer.Option(help="GPU memory in GiB (default: the model's)")] = None,
    name: Annotated[Optional[str], typer.Option(help="Profile name (default: spec-COUNTx-GPU)")] = None,
) -> None:
    """Write a profile from a spec sheet: the GPU model's public figures and the few
    given here; every other figure assumed by a rule the profile records (docs/planner.md)."""
    if name is not None and not spec_name_ok(name):
        raise ZoError(f"--name {name!r}: letters, digits, '.', '_' and '-' only")
    sheet = SpecSheet(gpu=gpu, count=count, host_memory_gb=host_memory_gb, sockets=sockets,
                      cores=cores, pcie_gen=pcie_gen, lanes=lanes, per_switch=per_switch,
                      nvlink=nvlink, memory_gib=memory_gib, name=name)
    data = build_spec_profile(sheet)
    check_writable(output, what="the profile to")
    atomic_write_text(output, dumps_canonical(data), what="the profile to")
    made = counts(load_profile(output).origins)
    console.print(f"profile {data['name']} written to {output}: {made['public']} public "
                  f"figures, {made['assumed']} assumed (each with its rule: the profile's "
                  f"origins and sources)", highlight=False)


@command("rent")
def rent_cmd(
    model: Annotated[str, typer.Option(help="Catalogue name (see `zoplan models`) or path to an HF config.json")],
    on: Annotated[list[str], typer.Option("--on", help="A machine: PROFILE:GPUS or PROFILE:GPUS:PRICE_PER_GPU_HOUR (repeat for each)")],
    batch: Annotated[int, typer.Option(help="Global batch (sequences per step)")] = 16,
    seq: Annotated[int, typer.Option(help="Tokens per sequence")] = 512,
    precision: Annotated[Optional[str], typer.Option(help="Compute precision (default: the model family's dtype)")] = None,
) -> None:
    """What should I rent? One job planned on each machine given: the best layout, the
    step and its range over the assumed figures, memory, ZO2 beside it, time and cost
    of 1,000 steps; the fastest and the cheapest marked."""
    rows = rent([Option.parse(text) for text in on], model=model, batch=batch, seq=seq,
                precision=precision)
    render_rent(rows, console, title=f"{model}, batch {batch} x seq {seq}: where to run it")


def main() -> None:
    """Entry point. Commands turn ZoError into one red line and exit code 2 themselves
    (see `command`); typer's standalone mode gives usage errors exit code 2 too."""
    app()


if __name__ == "__main__":
    main()
