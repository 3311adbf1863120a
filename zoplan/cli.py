"""`zoplan` command line: thin typer commands that parse, call one function, render.

Every user-facing problem is a ZoError: one red line on stderr, exit code 2, and no
half-written output file.

The planner never imports torch or zoexec, with one exception: `zoplan profile` calls
the executor package's profiler (zoexec.profiler), which measures with torch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from zoplan import calibrate as calibration
from zoplan import profiling, search
from zoplan.errors import ZoError, exit_with_error, need_exec_extra
from zoplan.estimators import (
    DEFAULT_ESTIMATOR,
    DEFAULT_LOWRANK_EVERY,
    DEFAULT_LOWRANK_RANK,
    DEFAULT_SPARSE_SHARE,
    EstimatorSpec,
)
from zoplan.estimators import DEFAULTS as ESTIMATOR_DEFAULTS
from zoplan.hardware import load_profile
from zoplan.io import atomic_write_text, check_writable, dumps_canonical
from zoplan.lora import DEFAULT_LORA_ALPHA, DEFAULT_LORA_R, DEFAULT_LORA_TARGETS
from zoplan.origins import counts
from zoplan.prefix import DEFAULT_PREFIX_TOKENS
from zoplan.profiling.spec import SpecSheet, build_spec_profile, spec_name_ok
from zoplan.search.rent import Option, rent
from zoplan.search.tuning import TUNING_CHOICES
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


def command(name: str):
    """Register a typer command whose ZoErrors become one red line and exit code 2."""
    def register(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
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


@command("optimize")
def optimize_cmd(
    model: Annotated[str, typer.Option(help="Catalogue name (see `zoplan models`) or path to an HF config.json")],
    gpus: Annotated[int, typer.Option(help="The most GPUs (ranks) the plan may use; fewer when that is faster")],
    profile: Annotated[Optional[str], typer.Option(help="Shipped profile name or profile JSON path")] = None,
    batch: Annotated[int, typer.Option(help="Global batch (sequences per step)")] = 16,
    seq: Annotated[int, typer.Option(help="Tokens per sequence")] = 512,
    precision: Annotated[Optional[str], typer.Option(help="Compute precision: fp16, bf16 or fp32 (default: the model family's dtype on GPUs, fp32 on CPUs)")] = None,
    update: Annotated[Optional[str], typer.Option(help="How updates reach the weights: master (fp32 masters), stochastic (16-bit, stochastic rounding) or plain (16-bit, round to nearest: loses most MeZO updates); default: master and stochastic searched")] = None,
    tf32: Annotated[bool, typer.Option("--tf32/--no-tf32", help="fp32 GEMMs on CUDA may use TF32 tensor cores")] = True,
    pertp: Annotated[Optional[int], typer.Option(help="Fix Perturbation-Parallel degree (1 or 2)")] = None,
    ddp: Annotated[Optional[int], typer.Option(help="Fix Data-Parallel degree")] = None,
    slices: Annotated[Optional[int], typer.Option(help="Fix slice group size (1 = every GPU pulls the whole block)")] = None,
    prefetch: Annotated[Optional[int], typer.Option(help="Fix prefetch depth (block buffers per GPU)")] = None,
    lengths: Annotated[Optional[Path], typer.Option(help="Row lengths of the data (`zoexec lengths DATA ... -o lengths.json`): the step is priced at a batch's expected padded width (at most --seq); memory stays sized for --seq")] = None,
    placement: Annotated[str, typer.Option(help="Where the blocks live: host (every block offloaded, streamed each step) or auto (the search keeps as many resident on the GPUs as fit)")] = "auto",
    tuning: Annotated[str, typer.Option(help="full (every weight), lora (adapters on a frozen, read-only base), prefix (prefix keys and values on a frozen base) or auto (full and lora searched and shown side by side; the faster is written)")] = "full",
    lora_r: Annotated[int, typer.Option(help="LoRA rank r (MeZO's LoRA runs: 8)")] = DEFAULT_LORA_R,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha: the adapters' output is scaled by alpha / r (MeZO's: 16)")] = DEFAULT_LORA_ALPHA,
    lora_targets: Annotated[str, typer.Option(help="Block modules LoRA adapts, comma-separated (default: the attention query and value projections)")] = ",".join(DEFAULT_LORA_TARGETS),
    prefix_tokens: Annotated[int, typer.Option(help="Prefix tuning: keys and values per block (MeZO's prefix runs: 5)")] = DEFAULT_PREFIX_TOKENS,
    estimator: Annotated[str, typer.Option(help="The zeroth-order estimator: mezo (z over every weight), lowrank (U V^T per matrix, V kept for --lowrank-every steps) or sparse (the smallest-magnitude --sparse-share of each tensor); docs/estimators.md")] = DEFAULT_ESTIMATOR,
    lowrank_rank: Annotated[int, typer.Option(help="lowrank: the rank r of U V^T")] = DEFAULT_LOWRANK_RANK,
    lowrank_every: Annotated[int, typer.Option(help="lowrank: steps V is kept before it is redrawn")] = DEFAULT_LOWRANK_EVERY,
    sparse_share: Annotated[float, typer.Option(help="sparse: the share of each tensor perturbed and updated")] = DEFAULT_SPARSE_SHARE,
    directions: Annotated[int, typer.Option(help="Directions a step, each on its equal part of the global batch (each DDP group its own where the layout has groups)")] = 1,
    sweep_nodes: Annotated[bool, typer.Option("--sweep-nodes", help="Also print throughput against node count (the winner's per-node plan)")] = False,
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="Where to write the plan")] = Path("plan.json"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan JSON to stdout instead of the tables")] = False,
    top: Annotated[int, typer.Option(help="Candidates shown in the table")] = 8,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No tables, no timeline: just write the plan")] = False,
    sensitivity: Annotated[bool, typer.Option("--sensitivity/--no-sensitivity", help="Price the winner again with each assumed figure of the profile at the ends of its plausible range: the step as a range, the figures that move it, whether the winner stays the winner (docs/planner.md)")] = True,
) -> None:
    """Search PertP x DDP layouts, slice size, prefetch depth, block placement and the
    devices used; write the best as a plan."""
    optimize_view.check_top(top)
    lora = lora_options(tuning, r=lora_r, alpha=lora_alpha, targets=lora_targets)
    lora.update(prefix_options(tuning, prefix_tokens))
    lora["estimator"] = estimator_options(estimator=estimator, lowrank_rank=lowrank_rank,
                                          lowrank_every=lowrank_every,
                                          sparse_share=sparse_share, directions=directions)
    plans = None
    with optimize_view.search_progress(enabled=not (quiet or json_out)) as progress:
        request = dict(model=model, gpus=gpus, profile=profile, batch=batch, seq=seq,
                       precision=precision, update=update, tf32=tf32, pertp=pertp, ddp=ddp,
                       slices=slices, prefetch=prefetch, placement=placement, output=output,
                       progress=progress, lengths=None if lengths is None else str(lengths),
                       sensitivity=sensitivity, **lora)
        if tuning == "auto":
            plan, plans = search.optimize_tunings(**request)
        else:
            plan = search.optimize(**request)
    warning = optimize_view.rough_profile_warning(plan)
    if warning:
        Console(stderr=True).print(warning, style="yellow", highlight=False)
    if json_out:
        console.file.write(plan.to_json())
    elif not quiet:
        optimize_view.render_optimize(plan, console, top=top, output=Path(output),
                                      profile_arg=profile, sweep_nodes=sweep_nodes)
        render_short_timeline(plan, console)
        if plans is not None:
            render_tunings(plans, plan.workload.tuning, console, output=output)


def lora_options(tuning: str, *, r: int, alpha: int, targets: str) -> dict:
    """optimize's tuning arguments: a ZoError for an unknown --tuning, a --lora-r or
    --lora-alpha below 1, or empty --lora-targets."""
    if tuning not in TUNING_CHOICES:
        raise ZoError(f"--tuning must be one of {', '.join(TUNING_CHOICES)}, got {tuning!r}")
    names = tuple(t.strip() for t in targets.split(",") if t.strip())
    for flag, value in (("--lora-r", r), ("--lora-alpha", alpha)):
        if value < 1:
            raise ZoError(f"{flag} {value}: must be a whole number >= 1")
    if not names:
        raise ZoError(f"--lora-targets {targets!r}: name at least one block module (q_proj)")
    settings = {"lora_r": r, "lora_alpha": alpha, "lora_targets": names}
    if tuning == "full":
        given = [f for f, v, d in (("--lora-r", r, DEFAULT_LORA_R),
                                   ("--lora-alpha", alpha, DEFAULT_LORA_ALPHA),
                                   ("--lora-targets", names, DEFAULT_LORA_TARGETS)) if v != d]
        if given:
            raise ZoError(f"{', '.join(given)}: settings of --tuning lora (or auto), not full")
        return {}
    if tuning == "prefix":
        if settings != {"lora_r": DEFAULT_LORA_R, "lora_alpha": DEFAULT_LORA_ALPHA,
                        "lora_targets": DEFAULT_LORA_TARGETS}:
            raise ZoError("--lora-r, --lora-alpha and --lora-targets are settings of --tuning "
                          "lora, not prefix")
        return {"tuning": "prefix"}
    return settings if tuning == "auto" else {"tuning": "lora", **settings}


def estimator_options(**given) -> dict | None:
    """optimize's estimator arguments: the settings that are not MeZO-SGD's defaults
    (None: plain MeZO-SGD), a ZoError naming a bad one (a setting of another estimator)."""
    changed = {k: v for k, v in given.items() if v != ESTIMATOR_DEFAULTS[k]}
    try:
        EstimatorSpec(**changed)
    except ValueError as exc:
        raise ZoError(f"--{str(exc).replace('_', '-')}") from None
    return changed or None


def prefix_options(tuning: str, tokens: int) -> dict:
    """optimize's --prefix-tokens: a ZoError below 1 or with another --tuning."""
    if tokens < 1:
        raise ZoError(f"--prefix-tokens {tokens}: must be a whole number >= 1")
    if tuning != "prefix":
        if tokens != DEFAULT_PREFIX_TOKENS:
            raise ZoError(f"--prefix-tokens {tokens}: a setting of --tuning prefix, not {tuning}")
        return {}
    return {"prefix_tokens": tokens}


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
