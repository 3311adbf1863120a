"""`zoplan optimize`'s request: ONE declaration of every option, in typed sections
(workload, hardware, layout, tuning, estimator, output), each field with its flag,
help, default, fixed values and check, declared with `option(...)` as zoexec declares
its own (zoexec/fields.py).

Everything else derives from the fields: the command line (zoplan.cli: one typer
option each, in its section's panel), the checks (a section checks its fields when it
is made, then what goes together: `check`), what `--config FILE` accepts and
`--print-config` writes (zoplan.configfile), what the search reads
(zoplan.search.plan_request takes the request itself) and docs/options.md's zoplan
part (scripts/gen_docs.py).
A check that needs the model or the profile (seq against the model's positions, a
slice group against the node's fabric) is the search's (zoplan.search.space).

Adding a planner option: its field here, its use, its test (docs/code.md). Torch-free;
it imports only the contracts.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from zoplan.errors import ZoError
from zoplan.estimators import DEFAULTS as ESTIMATOR_DEFAULTS
from zoplan.estimators import EstimatorSpec
from zoplan.lora import DEFAULT_LORA_ALPHA, DEFAULT_LORA_R, DEFAULT_LORA_TARGETS
from zoplan.models import DTYPE_BYTES
from zoplan.names import (
    AUTO_TUNING,
    ESTIMATOR_WORDS,
    ESTIMATORS,
    TUNING_CHOICES,
    TUNING_WORDS,
    described,
)
from zoplan.prefix import DEFAULT_PREFIX_TOKENS
from zoplan.workload import UPDATE_KERNELS, UPDATE_MODES

PLACEMENTS = ("auto", "host")   # --placement (zoplan.search.placement)
MAX_TOP = 10_000                # --top: the candidates a table may show

Check = Callable[[Any], "str | None"]


def option(default: Any, help: str, *, flags: tuple[str, ...] = (), check: Check | None = None,
           choices: tuple[Any, ...] = (), metavar: str | None = None, shown: str | None = None,
           parse: Callable[[str], Any] | None = None, required: bool = False) -> Any:
    """A field that is an option of `zoplan optimize`. `flags`: its names on the command
    line (default --field-name; "--a/--no-a" for an on/off pair); `check(value)` -> what
    the value must be when it is wrong (None: fine; never called on None); `choices`:
    its fixed set; `shown`: the default as --help words it; `parse`: the command line's
    text to the value; `required`: it must be given (on the command line or in
    --config)."""
    meta = {"help": help, "flags": tuple(flags), "check": check, "choices": tuple(choices),
            "metavar": metavar, "shown": shown, "parse": parse, "required": required}
    return field(default=default, metadata=meta)


def at_least(low: int) -> Check:
    """A whole number's check: >= low."""
    return lambda v: None if v >= low else f"a whole number >= {low}"


def within(low: int, high: int) -> Check:
    return lambda v: None if low <= v <= high else f"in {low}..{high}"


def positive_finite(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "a finite number > 0"


def _targets(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _some_targets(v: tuple[str, ...]) -> str | None:
    return None if v else "at least one block module (q_proj)"


# ---- what a field's metadata says ---------------------------------------------------------
def option_fields(section: type) -> list[Field[Any]]:
    return [f for f in fields(section) if "help" in f.metadata]


def cli_names(f: Field[Any]) -> tuple[str, ...]:
    """The field's names on the command line, as typer takes them ("-o", "--out", ...)."""
    return f.metadata["flags"] or ("--" + f.name.replace("_", "-"),)


def flag_of(f: Field[Any]) -> str:
    """The field's long name (--lora-r; --tf32 of --tf32/--no-tf32)."""
    return next(n.split("/")[0] for n in cli_names(f) if n.startswith("--"))


def key_of(f: Field[Any]) -> str:
    """The field's name in a --config file: its long flag without the dashes."""
    return flag_of(f)[2:]


def config_names(f: Field[Any]) -> tuple[str, ...]:
    """Every name --config accepts for the field: its long flags (with - or _), its
    field name."""
    longs = [n.split("/")[0][2:] for n in cli_names(f) if n.startswith("--")]
    return tuple(dict.fromkeys([*longs, *(n.replace("-", "_") for n in longs), f.name]))


def shown_default(f: Field[Any]) -> str:
    """The default as --help and the docs show it ('' for none)."""
    if f.metadata["shown"] is not None:
        return str(f.metadata["shown"])
    value = f.default
    if value is None or value == () or (value is False and not _is_pair(f)):
        return ""
    if isinstance(value, bool):
        return flag_of(f) if value else "--no-" + flag_of(f)[2:]
    return ",".join(value) if isinstance(value, tuple) else str(value)


def _is_pair(f: Field[Any]) -> bool:
    return any("/" in n for n in cli_names(f))


# ---- the sections ---------------------------------------------------------------------------
class Section:
    """A group of options: its --help panel; its fields are checked when it is made
    (each field's fixed set and check, then `check`: what goes together)."""

    PANEL: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in option_fields(type(self)):
            value = getattr(self, f.name)
            if value is None:
                continue
            choices = f.metadata["choices"]
            if choices and value not in choices:
                raise ZoError(f"{flag_of(f)} must be one of {', '.join(map(str, choices))}, "
                              f"got {value!r}")
            check = f.metadata["check"]
            must = check(value) if check is not None else None
            if must:
                shown = ",".join(value) if isinstance(value, tuple) else value
                raise ZoError(f"{flag_of(f)} {shown!r}: must be {must}" if isinstance(shown, str)
                              else f"{flag_of(f)} {shown}: must be {must}")
        self.check()

    def check(self) -> None:
        """What goes together (a ZoError naming the options)."""


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions(Section):
    PANEL: ClassVar[str] = "Workload"

    model: str | None = option(None, "Catalogue name (see `zoplan models`) or path to an HF "
                               "config.json (required)", required=True)
    batch: int = option(16, "Global batch (sequences per step)", check=at_least(1))
    seq: int = option(512, "Tokens per sequence", check=at_least(1))
    precision: str | None = option(
        None, "Compute precision: fp16, bf16 or fp32 (default: the model family's dtype on "
        "GPUs, fp32 on CPUs)", choices=tuple(DTYPE_BYTES))
    update: str | None = option(
        None, "How updates reach the weights: master (fp32 masters), stochastic (16-bit, "
        "stochastic rounding) or plain (16-bit, round to nearest: loses most MeZO updates); "
        "default: master and stochastic searched", choices=UPDATE_MODES)
    tf32: bool = option(True, "fp32 GEMMs on CUDA may use TF32 tensor cores",
                        flags=("--tf32/--no-tf32",))
    update_kernel: str = option(
        "torch", "How z, the update and the perturbation run on a GPU: torch (torch's kernels, "
        "z drawn into buffers: what the H200's pass 2 measured) or fused (one Triton pass a "
        "block, z regenerated in the kernel; full tuning with MeZO-SGD's one direction); "
        "`zoexec run --zo-kernel auto` runs what the plan priced", choices=UPDATE_KERNELS)
    lengths: Path | None = option(
        None, "Row lengths of the data (`zoexec lengths DATA ... -o lengths.json`): the step "
        "is priced at a batch's expected padded width (at most --seq); memory stays sized "
        "for --seq")


@dataclass(frozen=True, kw_only=True)
class HardwareOptions(Section):
    PANEL: ClassVar[str] = "Hardware"

    gpus: int | None = option(None, "The most GPUs (ranks) the plan may use; fewer when that "
                              "is faster (required)", check=at_least(1), required=True)
    profile: str | None = option(None, "Shipped profile name or profile JSON path",
                                 shown="dgx-a100-80gb")
    max_gpu_memory: float | None = option(
        None, "Plan for at most this much memory per GPU, in GiB (less than the profile's: "
        "room for another process, a smaller card of the same kind); the profile's reserved "
        "share is still left out", metavar="GIB", check=positive_finite)


@dataclass(frozen=True, kw_only=True)
class LayoutOptions(Section):
    PANEL: ClassVar[str] = "Layout (fix an axis of the search)"

    pertp: int | None = option(None, "Fix Perturbation-Parallel degree (1 or 2)",
                               check=lambda v: None if v in (1, 2) else "1 or 2")
    ddp: int | None = option(None, "Fix Data-Parallel degree")
    slices: int | None = option(None, "Fix slice group size (1 = every GPU pulls the whole "
                                "block)")
    prefetch: int | None = option(None, "Fix prefetch depth (block buffers per GPU)",
                                  check=at_least(1))
    placement: str = option(
        "auto", "Where the blocks live: host (every block offloaded, streamed each step) or "
        "auto (the search keeps as many resident on the GPUs as fit)", choices=PLACEMENTS)


@dataclass(frozen=True, kw_only=True)
class TuningOptions(Section):
    PANEL: ClassVar[str] = "Tuning"

    tuning: str = option(
        "full", described({**TUNING_WORDS, AUTO_TUNING: "full and lora searched and shown "
                           "side by side; the faster is written"}), choices=TUNING_CHOICES)
    lora_r: int = option(DEFAULT_LORA_R, "LoRA rank r (MeZO's LoRA runs: 8)", check=at_least(1))
    lora_alpha: int = option(DEFAULT_LORA_ALPHA, "LoRA alpha: the adapters' output is scaled "
                             "by alpha / r (MeZO's: 16)", check=at_least(1))
    lora_targets: tuple[str, ...] = option(
        DEFAULT_LORA_TARGETS, "Block modules LoRA adapts, comma-separated (default: the "
        "attention query and value projections)", parse=_targets, check=_some_targets)
    prefix_tokens: int = option(DEFAULT_PREFIX_TOKENS, "Prefix tuning: keys and values per "
                                "block (MeZO's prefix runs: 5)", check=at_least(1))

    def _lora_changed(self) -> list[str]:
        return [flag for flag, v, d in (("--lora-r", self.lora_r, DEFAULT_LORA_R),
                                        ("--lora-alpha", self.lora_alpha, DEFAULT_LORA_ALPHA),
                                        ("--lora-targets", self.lora_targets,
                                         DEFAULT_LORA_TARGETS)) if v != d]

    def check(self) -> None:
        changed = self._lora_changed()
        if changed and self.tuning == "full":
            raise ZoError(f"{', '.join(changed)}: settings of --tuning lora (or auto), not full")
        if changed and self.tuning == "prefix":
            raise ZoError("--lora-r, --lora-alpha and --lora-targets are settings of --tuning "
                          "lora, not prefix")
        if self.tuning != "prefix" and self.prefix_tokens != DEFAULT_PREFIX_TOKENS:
            raise ZoError(f"--prefix-tokens {self.prefix_tokens}: a setting of --tuning prefix, "
                          f"not {self.tuning}")


@dataclass(frozen=True, kw_only=True)
class EstimatorOptions(Section):
    PANEL: ClassVar[str] = "Estimator"

    estimator: str = option(
        ESTIMATOR_DEFAULTS["estimator"], f"The zeroth-order estimator: "
        f"{described(ESTIMATOR_WORDS)}; docs/estimators.md", choices=ESTIMATORS)
    lowrank_rank: int = option(ESTIMATOR_DEFAULTS["lowrank_rank"],
                               "lowrank: the rank r of U V^T")
    lowrank_every: int = option(ESTIMATOR_DEFAULTS["lowrank_every"],
                                "lowrank: steps V is kept before it is redrawn")
    sparse_share: float = option(ESTIMATOR_DEFAULTS["sparse_share"],
                                 "sparse: the share of each tensor perturbed and updated")
    directions: int = option(
        ESTIMATOR_DEFAULTS["directions"], "Directions a step, each on its equal part of the "
        "global batch (each DDP group its own where the layout has groups)")

    def changed(self) -> dict[str, Any]:
        """The settings that are not MeZO-SGD's defaults."""
        return {f.name: getattr(self, f.name) for f in option_fields(EstimatorOptions)
                if getattr(self, f.name) != ESTIMATOR_DEFAULTS[f.name]}

    def check(self) -> None:
        """The estimator's own checks (zoplan.estimators.EstimatorSpec, which zoexec
        shares): a setting of another estimator, a rank out of range, ..."""
        try:
            EstimatorSpec(**self.changed())
        except ValueError as exc:
            raise ZoError(f"--{str(exc).replace('_', '-')}") from None


@dataclass(frozen=True, kw_only=True)
class OutputOptions(Section):
    PANEL: ClassVar[str] = "Output"

    output: Path = option(Path("plan.json"), "Where to write the plan",
                          flags=("-o", "--out", "--output"))
    json_out: bool = option(False, "Print the plan JSON to stdout instead of the tables",
                            flags=("--json",))
    top: int = option(8, "Candidates shown in the table", check=within(0, MAX_TOP))
    quiet: bool = option(False, "No tables, no timeline: just write the plan",
                         flags=("--quiet", "-q"))
    sweep_nodes: bool = option(False, "Also print throughput against node count (the "
                               "winner's per-node plan)")
    sensitivity: bool = option(
        True, "Price the winner again with each assumed figure of the profile at the ends "
        "of its plausible range: the step as a range, the figures that move it, whether the "
        "winner stays the winner (docs/planner.md)", flags=("--sensitivity/--no-sensitivity",))


SECTIONS: dict[str, type[Section]] = {
    "workload": WorkloadOptions, "hardware": HardwareOptions, "layout": LayoutOptions,
    "tuning": TuningOptions, "estimator": EstimatorOptions, "output": OutputOptions}


def section_of(name: str) -> str | None:
    """The section key holding the field `name` (None: no such option)."""
    for key, section in SECTIONS.items():
        if any(f.name == name for f in option_fields(section)):
            return key
    return None


def all_fields() -> list[tuple[type[Section], Field[Any]]]:
    return [(s, f) for s in SECTIONS.values() for f in option_fields(s)]


def field_hints() -> dict[str, Any]:
    """Field name -> its type (what a --config value must be)."""
    out: dict[str, Any] = {}
    for section in SECTIONS.values():
        out.update(typing.get_type_hints(section))
    return {f.name: out[f.name] for _, f in all_fields()}


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """One `zoplan optimize` request: its sections, each checked."""

    workload: WorkloadOptions
    hardware: HardwareOptions
    layout: LayoutOptions = field(default_factory=LayoutOptions)
    tuning: TuningOptions = field(default_factory=TuningOptions)
    estimator: EstimatorOptions = field(default_factory=EstimatorOptions)
    output: OutputOptions = field(default_factory=OutputOptions)

    @classmethod
    def make(cls, **values: Any) -> PlanRequest:
        """A checked request from flat field names (each sent to its section); a required
        option left out, or a bad value, is a ZoError naming the option."""
        parts: dict[str, dict[str, Any]] = {key: {} for key in SECTIONS}
        for name, value in values.items():
            key = section_of(name)
            if key is None:
                raise TypeError(f"PlanRequest.make: no option field {name}")
            parts[key][name] = value
        for section, f in all_fields():
            if f.metadata["required"] and parts[section_key(section)].get(f.name) is None:
                raise ZoError(f"{flag_of(f)} is required: give it on the command line or as "
                              f"`{key_of(f)}:` in --config")
        made: dict[str, Any] = {key: SECTIONS[key](**given) for key, given in parts.items()}
        return cls(**made)

    def sections(self) -> dict[str, Section]:
        return {key: getattr(self, key) for key in SECTIONS}

    def values(self) -> dict[str, Any]:
        """Every field's value, by field name."""
        return {f.name: getattr(s, f.name) for s in self.sections().values()
                for f in option_fields(type(s))}

    def config(self) -> dict[str, Any]:
        """What --print-config writes: every option set (not None) by its --config name,
        the output options but where the plan goes left out."""
        skip = {f.name for f in option_fields(OutputOptions)}
        return {key_of(f): getattr(self.sections()[section_key(s)], f.name)
                for s, f in all_fields()
                if f.name not in skip and getattr(self.sections()[section_key(s)], f.name)
                is not None}

    def replaced(self, **values: Any) -> PlanRequest:
        return PlanRequest.make(**{**self.values(), **values})


def section_key(section: type[Section]) -> str:
    return next(k for k, s in SECTIONS.items() if s is section)


def config_keys() -> dict[str, str]:
    """Every name --config accepts -> its field."""
    return {name: f.name for _, f in all_fields() for name in config_names(f)}


__all__ = ["MAX_TOP", "PLACEMENTS", "SECTIONS", "EstimatorOptions", "HardwareOptions",
           "LayoutOptions", "OutputOptions", "PlanRequest", "Section", "TuningOptions",
           "WorkloadOptions", "all_fields", "cli_names", "config_keys", "field_hints", "flag_of", "key_of", "option", "option_fields", "section_of",
           "shown_default"]
