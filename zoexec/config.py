"""A run's configuration: ONE typed declaration of every `zoexec run` option, and the
bookkeeping a rank needs besides (the plan, where a resume starts).

RunConfig is frozen and picklable (the launcher sends it to the ranks). Its options sit
in sections (model, task, optim, checkpoint, logging, runtime, tuning, zo: the
estimator), each a keyword-only
dataclass whose fields are declared with `option(...)` (zoexec.fields): the field's name, type and
default, the option's help, other names (HF Trainer's spellings), the check and, for
settings with an environment default, the variable's name. zoexec.flags makes the
command line from these fields; zoexec.options builds a RunConfig from what was given.
A bad value raises FieldError (a ValueError naming the field and the value); the
command line names the option instead. Torch-free (`zoexec --help` imports it). The
sections the plan decides (tuning, zo) are declared in zoexec.planned.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import Field, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypedDict

from zoexec.data.presets import with_preset
from zoexec.data.section import TaskOptions, task_options
from zoexec.data.tasktypes import METRICS
from zoexec.fields import (  # noqa: F401 - FieldError, parse_* and the checks are used through this module too
    FieldError,
    Section,
    _every,
    _size,
    at_least,
    check_fields,
    check_value,
    choices_of,
    finite_at_least,
    flag_of,
    literal_choices,
    option,
    option_fields,
    parse_every,
    parse_size,
    positive_finite,
    within,
)
from zoexec.maths.history import Update
from zoexec.maths.schedule import lr_from
from zoexec.planned import EstimatorOptions, TuningOptions
from zoplan.errors import ZoError
from zoplan.execrules import DEFAULT_STEPS
from zoplan.layout import Layout
from zoplan.models import ModelSpec
from zoplan.plan import Plan
from zoplan.workload import Workload

# The module's names, those it passes on included: the option declaration's tools and
# the sections declared elsewhere, which the CLI and the tests read through it
__all__ = [
    "KEPT", "MAX_SEED", "MAX_THREADS", "RUN_KEPT", "SECTIONS", "SETTINGS", "TASK_FIELDS",
    "CheckpointOptions", "EstimatorOptions", "EvalOptions", "Extension", "FieldError", "Json",
    "LoggingOptions", "ModelOptions", "OptimOptions", "RunConfig", "RuntimeOptions", "Section",
    "TaskOptions", "TuningOptions", "Values", "check_given", "check_value", "choices_of", "env_defaults", "field_named",
    "flag_of", "kept", "option_error", "option_fields", "parse_best", "section_of",
]

# Flat option values by field name, as given or recorded: each value of its field's type
# (zoexec.flags parses them; the sections' fields check them)
Values = dict[str, Any]
Json = dict[str, Any]   # a JSON object read back (a plan, run.json and its parts)

MAX_THREADS = 1024   # --threads: far past any node's cores; OpenMP fails creating ~30,000


@dataclass(frozen=True, kw_only=True)
class ModelOptions(Section):
    PANEL: ClassVar[str] = "Model"

    model_path: str | None = option(
        None, "Local HF model directory (config.json + weights), or a Hub id in the local HF "
        "cache (HuggingFaceTB/SmolLM2-135M: $HF_HUB_CACHE, $HF_HOME; never downloaded); "
        "default: random init", metavar="DIR")
    init: Literal["random"] | None = option(
        None, "'random': seeded random weights (the default without --model-path)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model_path is not None and self.init is not None:
            raise FieldError("init", self.init, "unset when model_path is given (not both)")

    @property
    def start(self) -> str:
        """What run.json records as the run's start: the model folder or "random"."""
        return self.model_path or "random"


MAX_SEED = 2**64 - 1


def _seed_range(v: int) -> str | None:
    return None if 0 <= v <= MAX_SEED else f"a whole number in 0..2^64-1 ({MAX_SEED})"


@dataclass(frozen=True, kw_only=True)
class OptimOptions(Section):
    PANEL: ClassVar[str] = "Optimisation"

    steps: int = option(
        DEFAULT_STEPS, "Training steps in all (with --trace, enough of the plan's predicted "
        "steps for 25 s; with --resume, the run's)", aliases=("--max-steps", "--max_steps"),
        check=at_least(1))
    seed: int = option(0, "Base seed: z, data order and random init", check=_seed_range,
                       kept="setting")
    lr: float = option(1e-6, "Learning rate", aliases=("--learning-rate", "--learning_rate"),
                       check=finite_at_least(0), kept="setting")
    lr_schedule: Literal["constant", "linear", "cosine"] = option(
        "constant", "The learning rate over the steps (linear, cosine: decay to 0)",
        aliases=("--lr-scheduler-type", "--lr_scheduler_type"), kept="setting")
    warmup_steps: int = option(0, "Steps of linear warm-up from 0", aliases=("--warmup_steps",),
                               check=at_least(0), kept="setting")
    eps: float = option(1e-3, "Perturbation scale", check=positive_finite, kept="setting")
    weight_decay: float = option(0.0, "Weight decay, not on biases and norms",
                                 aliases=("--weight_decay",), check=finite_at_least(0),
                                 kept="setting")
    on_nonfinite: Literal["stop", "skip"] = option(
        "stop", "A non-finite loss: 'stop' the run (saving the weights before it) or 'skip' "
        "the step", kept="run")
    on_divergence: Literal["stop", "warn"] = option(
        "stop", "A climbing loss (the mean of the last --divergence-window steps above twice "
        "the mean of the run's first quarter-window of steps and 1.0 above it): 'stop' the "
        "run (saving a snapshot) or 'warn' once and go on", kept="run")
    divergence_window: int = option(
        20, "Steps the divergence check averages now (W; the start it compares with: the "
        "first max(1, W // 4) steps)", check=at_least(2), kept="run")
    new_schedule: bool = option(
        False, "With --resume and another --steps: a new linear or cosine schedule from the "
        "step the run resumes at, over the steps left, from --lr (a constant lr just "
        "continues; a decaying one is refused without this)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.warmup_steps < self.steps:
            raise FieldError("warmup_steps", self.warmup_steps, f"< steps ({self.steps})")


def parse_best(text: str) -> tuple[str, bool]:
    """--save-best "eval_accuracy:max" -> ("eval_accuracy", True), the name one of the
    task types' metrics (zoexec.data.tasktypes.METRICS); ValueError if bad."""
    name, colon, way = text.strip().partition(":")
    if name not in METRICS or (colon and way not in ("max", "min")):
        raise ValueError(f"not a metric[:max|min]: {text!r}")
    return name, (way == "max") if way else name != "eval_loss"


def _best(text: str) -> str | None:
    try:
        parse_best(text)
    except ValueError:
        return f"one of {', '.join(METRICS)}, then :max or :min (e.g. eval_accuracy:max)"
    return None


@dataclass(frozen=True, kw_only=True)
class CheckpointOptions(Section):
    PANEL: ClassVar[str] = "Run folder and checkpoints"

    out: str | None = option(
        None, "Run folder: run.json, losses.jsonl, metrics.jsonl, snapshots/, final/ (HF "
        "model + tokenizer)", aliases=("--output-dir", "--output_dir"), metavar="DIR")
    resume: str | None = option(
        None, "Continue the run in this folder from its newest snapshot and log", metavar="DIR")
    overwrite: bool = option(False, "Replace the run an existing --out folder holds")
    save_every: str = option(
        "30m", "Snapshot every N steps (500) or every duration (30m, 2h)", check=_every,
        kept="default")
    save_steps: int | None = option(
        None, "Snapshot every N steps (HF Trainer's name; instead of --save-every)",
        aliases=("--save_steps",), check=at_least(1), kept="default")
    keep: int = option(2, "Snapshots kept (the newest)",
                       aliases=("--save-total-limit", "--save_total_limit"), check=at_least(1),
                       kept="default")
    max_shard_size: str = option(
        "5GB", "Saved weights in safetensors shards of at most this size", check=_size, kept="run")
    save_best: str | None = option(
        None, "Keep the weights of the best evaluation as OUT/best/ (needs --eval-data): a "
        "metric and a direction, e.g. eval_accuracy:max, eval_loss:min (the direction may "
        "be left out: min for eval_loss, max otherwise)",
        aliases=("--metric-for-best-model", "--metric_for_best_model"),
        check=_best, metavar="METRIC[:max|min]", kept="run")

    @property
    def best(self) -> tuple[str, bool] | None:
        """(metric, greater is better) of --save-best; None without it."""
        return None if self.save_best is None else parse_best(self.save_best)
    check_nodes_every: int | None = option(
        None, "Several nodes: every node checksums its block store every N steps too (always "
        "at each snapshot and at the end); a mismatch stops the run naming the nodes",
        check=at_least(1), kept="run")
    accept_moved_inputs: bool = option(
        False, "With --resume: take a --data or --model-path at another path than the run "
        "recorded when its content fingerprint is the recorded one")

    @property
    def every_steps(self) -> int | None:
        """Snapshots every this many steps (None: by time)."""
        return self.save_steps if self.save_steps is not None else self._every()[0]

    @property
    def every_s(self) -> float | None:
        """Snapshots every this many seconds (None: by steps)."""
        return None if self.save_steps is not None else self._every()[1]

    def _every(self) -> tuple[int | None, float | None]:
        return parse_every(self.save_every)

    @property
    def max_shard_bytes(self) -> int:
        return parse_size(self.max_shard_size)


@dataclass(frozen=True, kw_only=True)
class LoggingOptions(Section):
    PANEL: ClassVar[str] = "Logging and evaluation"

    trace: str | None = option(
        None, "Trace folder: measured spans (zoplan show/calibrate)", metavar="DIR")
    report_to: Literal["none", "tensorboard", "wandb", "mlflow"] = option(
        "none", "Metrics besides OUT/metrics.jsonl: 'tensorboard' (OUT/runs/), 'wandb' (offline: "
        "OUT/wandb/) or 'mlflow' (a file store OUT/mlruns/); each needs its package (docs/watch.md)",
        kept="run")
    log_every: int | None = option(
        None, "Off a terminal, a progress line every N steps (default: about every 30 s)",
        aliases=("--logging-steps", "--logging_steps"), check=at_least(1), kept="run")
    eval_every: int | None = option(
        None, "Evaluate --eval-data every N steps too (default: after the last step only)",
        aliases=("--eval-steps", "--eval_steps"), check=at_least(1), kept="run")
    quiet: bool = option(
        False, "No progress and no summary (errors and warnings only); silences "
        "transformers' bars too", aliases=("-q",))

    @property
    def progress(self) -> bool:
        return not self.quiet


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions(Section):
    PANEL: ClassVar[str] = "Runtime"

    threads: int | None = option(
        None, "torch threads per rank (default: cores / local ranks)",
        check=within(1, MAX_THREADS))
    timeout_s: float = option(
        600.0, "Seconds any wait of a rank may take (process groups, collectives, the node's "
        "loading) before the run fails", env="ZOEXEC_TIMEOUT_S", check=positive_finite)
    stop_grace_s: float = option(
        120.0, "After SIGINT / SIGTERM, seconds the ranks get to save a snapshot and exit",
        env="ZOEXEC_STOP_GRACE_S", check=finite_at_least(0))
    shm_dir: str = option(
        "/dev/shm", "Folder of the node's shared block store (tmpfs; a disk folder works, "
        "slower)", env="ZOEXEC_SHM_DIR", metavar="DIR")
    start_method: Literal["forkserver", "spawn", "fork"] = option(
        "forkserver", "How local ranks are started (multiprocessing)",
        env="ZOEXEC_START_METHOD")
    zo_kernel: Literal["auto", "torch", "counter", "fused"] = option(
        "auto", "How z, the update and the perturbation are computed: torch (z from torch's "
        "generators into buffers), counter (a counter-based z regenerated per element, plain "
        "torch), fused (the counter maths as one Triton pass, CUDA); auto: what the plan "
        "priced (zoplan optimize --update-kernel): fused where the plan priced it and the "
        "rank's device runs it (CUDA with triton), torch otherwise. run.json records the path taken; "
        "a resume must take the same one (docs/gpu.md)")
    debug: bool = option(False, "A failing rank prints its traceback too", env="ZOEXEC_DEBUG")
    backend: Literal["auto", "gloo"] = option(
        "auto", "Collectives' backend: auto (NCCL for CUDA jobs of several ranks, gloo "
        "otherwise); gloo on CUDA too, so that several ranks may share one GPU (the block "
        "all-gather composed from broadcasts): the GPU check's two ranks on one GPU")


@dataclass(frozen=True, kw_only=True)
class EvalOptions(Section):
    """`zoexec eval`'s own options (besides the task's and --threads)."""

    PANEL: ClassVar[str] = "Evaluation"

    eval_batch: int = option(8, "Rows per forward pass", aliases=("--batch",),
                             check=at_least(1))
    seq: int | None = option(
        None, "Longest row in tokens (default: the model's positions, at most 512)",
        check=at_least(2))
    precision: Literal["fp32", "bf16", "fp16"] = option(
        "fp32", "Precision of the weights and the forward", aliases=("--dtype",))
    base: str | None = option(
        None, "An adapter folder's base model folder (default: the base_model_name_or_path "
        "of its adapter_config.json)", metavar="DIR")


SECTIONS = {"model": ModelOptions, "task": TaskOptions, "optim": OptimOptions,
            "checkpoint": CheckpointOptions, "logging": LoggingOptions,
            "runtime": RuntimeOptions, "tuning": TuningOptions, "zo": EstimatorOptions}


def kept(kind: str) -> tuple[str, ...]:
    """The options whose `kept` is `kind` (zoexec.fields.KEPT_WORDS), in section order."""
    return tuple(f.name for section in SECTIONS.values() for f in option_fields(section)
                 if f.metadata["kept"] == kind)


# what a resume keeps, from the fields' `kept` (zoexec.run.folder reads run.json by these):
# the settings run.json records and a resume refuses to change (besides the options:
# `init`, the weights the run started from, and `task`, TaskOptions.record()) ...
SETTINGS = (*kept("setting"), "init", "task")
KEPT = kept("default")        # ... the checkpoint options a resume keeps unless given
TASK_FIELDS = task_options()  # ... the options recorded in the task
RUN_KEPT = kept("run")        # ... and the others (evaluation, reporting): kept unless given
def check_given(values: Values) -> None:
    """Each option's own check on its own (no check across fields): the builder runs it
    before it touches the run folder."""
    for section in (*SECTIONS.values(), EvalOptions):
        hints = typing.get_type_hints(section)
        for f in option_fields(section):
            if f.name in values:
                check_value(f, hints[f.name], values[f.name])


def field_named(name: str) -> Field[Any] | None:
    """The option field `name` (any section), None if none is."""
    for section in (*SECTIONS.values(), EvalOptions):
        for f in option_fields(section):
            if f.name == name:
                return f
    return None


def option_error(exc: FieldError) -> str:
    """A field's error as the command line's: "--lr -1.0: must be a finite number >= 0"."""
    f = field_named(exc.name)
    if f is None:
        return str(exc)
    value = ",".join(exc.value) if isinstance(exc.value, tuple) else exc.value
    return f"{flag_of(f)} {value}: must be {exc.must}"


# ---- the run's configuration ----------------------------------------------------------------
class Extension(TypedDict):
    """run.json's record of a resume that changed --steps (zoexec.run.folder.extend)."""

    at_step: int
    from_steps: int
    to_steps: int
    new_schedule: bool


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """The options (by section) and what the builder derived; picklable."""

    plan: Json
    model: ModelOptions = field(default_factory=ModelOptions)
    task: TaskOptions = field(default_factory=TaskOptions)
    optim: OptimOptions = field(default_factory=OptimOptions)
    checkpoint: CheckpointOptions = field(default_factory=CheckpointOptions)
    logging: LoggingOptions = field(default_factory=LoggingOptions)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    tuning: TuningOptions = field(default_factory=TuningOptions)
    zo: EstimatorOptions = field(default_factory=EstimatorOptions)
    # bookkeeping, not options: a resume starts at `start_step` from `load_from` (a
    # snapshot; None: the model or random weights) after applying `replay` (the logged
    # updates, zoexec.maths.history.Update)
    plan_path: str = "plan.json"
    run_id: str = "run"
    load_from: str | None = None
    start_step: int = 0
    replay: tuple[Update, ...] = ()
    resumed: bool = False
    inputs: Json | None = None     # run.json's inputs: absolute paths and fingerprints
    schedule: tuple[tuple[int, int], ...] = ()   # run.json's lr schedule segments ((start, total), ...)
    extensions: tuple[Extension, ...] = ()   # run.json's record of --steps changes on resumes
    identity: Json | None = None   # a resume: run.json as rank 0 rewrites it (unsealed)
    log_bytes: int | None = None   # a resume: the log's whole lines (a torn one after: cut)
    history: str | None = None     # a resume: the digest of the logged history (saved weights record it)
    notes: tuple[str, ...] = ()    # lines for the terminal once the checks passed
    resume_cmd: str | None = None  # the whole resume command (zoexec.flags.resume_command)
    evaluate_first: bool = False   # a resume: the evaluation after start_step - 1 is missing (killed before it)
    speed_checks: bool = True   # traced CPU runs: speed checks and probes (SpeedMonitor)
    fail_at: tuple[int, int] | None = None   # for tests: rank `fail_at[0]` raises at step `fail_at[1]`
    alter_store_at: tuple[int, int] | None = None   # for tests: (node, step): a bit of that node's store flipped after it
    delay_h2d: tuple[int, int, float] | None = None   # for tests: (rank, block, seconds) slept before each h2d of it

    def __post_init__(self) -> None:
        steps = self.optim.steps
        if not 0 <= self.start_step <= steps:   # == steps: a resume that only saves
            raise FieldError("start_step", self.start_step, f"in 0..{steps}")
        if self.tuning.given:
            self.tuning.check_plan(self.workload)
        if self.zo.given:
            self.zo.check_plan(self.workload)

    @classmethod
    def make(cls, *, plan: Json, **values: Any) -> RunConfig:
        """A RunConfig from flat names (the builder, tests, benchmarks): each option goes
        to its section, the rest to the bookkeeping fields."""
        parts, rest = _by_section(with_preset(values))
        return cls(plan=plan, **{name: SECTIONS[name](**kw) for name, kw in parts.items()},
                   **rest)

    def replaced(self, **values: Any) -> RunConfig:
        """This config with the named fields (flat names, as `make`) changed."""
        parts, rest = _by_section(values)
        return dataclasses.replace(self, **rest, **{
            name: dataclasses.replace(getattr(self, name), **kw) for name, kw in parts.items()})

    @property
    def schedule_start(self) -> int:
        """The step the current lr schedule starts at (0; later after --new-schedule)."""
        return self.schedule[-1][0] if self.schedule else 0

    def lr_of(self, step: int) -> float:
        """The learning rate of `step` (zoexec.maths.schedule)."""
        o = self.optim
        return lr_from(step, start=self.schedule_start, lr=o.lr, schedule=o.lr_schedule,
                       warmup=o.warmup_steps, total=o.steps)

    def settings(self) -> Values:
        """The settings run.json records and a resume keeps (SETTINGS): the options kept
        as settings, the weights the run started from, the task."""
        out = {name: getattr(getattr(self, str(section_of(name))), name)
               for name in kept("setting")}
        return {**out, "init": self.model.start, "task": self.task.record()}

    def run_options(self) -> Values:
        """The run's other options run.json records (RUN_KEPT): evaluation, reporting, ..."""
        out = {name: getattr(getattr(self, str(section_of(name))), name) for name in RUN_KEPT}
        return {**out, "eval_data": out["eval_data"] and str(Path(out["eval_data"]).resolve())}

    def resume_command(self) -> str:
        """The command that resumes this run (the builder's, else the plain one)."""
        return self.resume_cmd or f"zoexec run {self.plan_path} --resume {self.checkpoint.out}"

    @property
    def weights(self) -> str:
        """What the ranks load: a snapshot, the model folder, or "random" (LoRA and
        prefix: the frozen base, always the run's start; a snapshot holds adapters or
        prefixes only)."""
        if self.workload.frozen_base:
            return self.model.start
        return self.load_from or self.model.start

    @property
    def source_dir(self) -> str | None:
        """The model folder the run started from (its tokenizer; None: random weights)."""
        return self.model.model_path

    @property
    def tokenizer_dir(self) -> str | None:
        """Where the run's tokenizer is: the model folder it started from, else the
        weights it loads (None with random weights)."""
        return self.source_dir or (self.weights if self.weights != "random" else None)

    # typed views of the plan: zoplan.plan.Plan reads them (the plan is validated on load)
    @property
    def layout(self) -> Layout:
        return Plan(self.plan).layout

    @property
    def workload(self) -> Workload:
        return Plan(self.plan).workload

    @property
    def device_kind(self) -> str:
        return Plan(self.plan).device_kind

    @property
    def model_spec(self) -> ModelSpec:
        return Plan(self.plan).model


def env_defaults(given: Values, *, keep: tuple[str, ...] | None = None) -> Values:
    """The runtime options (those in `keep`) not given whose environment variable is
    set, read as the option's type."""
    out: Values = {}
    for f in option_fields(SECTIONS["runtime"]):
        name = f.metadata["env"]
        if keep is not None and f.name not in keep:
            continue
        if f.name in given or not name or not os.environ.get(name):
            continue
        text = os.environ[name]
        try:
            kind: type = type(f.default)
            out[f.name] = (text not in ("0", "false", "no") if isinstance(f.default, bool)
                           else kind(text))
        except ValueError:
            raise ZoError(f"${name} {text!r}: not a {type(f.default).__name__} "
                          f"(the default of --{f.name.replace('_', '-')})") from None
    return out


def _by_section(values: Values) -> tuple[dict[str, Values], Values]:
    """Flat names split into ({section: {field: value}}, {bookkeeping field: value})."""
    parts: dict[str, Values] = {}
    rest: Values = {}
    for key, value in values.items():
        section = section_of(key)
        if section is None:
            rest[key] = value
        else:
            parts.setdefault(section, {})[key] = value
    return parts, rest


def section_of(name: str) -> str | None:
    """The section holding the option field `name` (None: not an option)."""
    for section, cls in SECTIONS.items():
        if any(f.name == name for f in option_fields(cls)):
            return section
    return None
