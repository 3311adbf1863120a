"""The search space of `zoplan optimize`: the validated request, the layouts it
admits (enumerate -> is_valid, each rule with its reason) and the candidates built from
them (memory checked, costs and bounds computed).

Axes: the devices used (world sizes: --gpus is the most; see world_sizes), PertP degree
(1 or 2; DDP = devices / pertp, across nodes when the job spans more than one node),
slice group size (divisors of the node's ranks up to the GPUs that share a fast
fabric), slice_update (on and off where slices > 1), prefetch depth (1..4), the update
mode (docs/precision.md: fp32 masters, or 16-bit storage with stochastic rounding;
plain rounding only when fixed) and the placement of the blocks (--placement: every
block offloaded, and with "auto" also the most resident blocks that fit, see
zoplan.search.placement). The compute precision is not searched: the model family's
published dtype on GPUs (fp16 and bf16 cost the same: 2 bytes, one tensor-core rate),
fp32 on CPU profiles, or --precision.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from zoplan.errors import ZoError
from zoplan.hardware import DEFAULT_PROFILE, HardwareProfile, is_shipped_guess, load_profile
from zoplan.layout import Layout
from zoplan.lengths import load_lengths
from zoplan.lora import check_targets
from zoplan.models import ModelSpec, get_model
from zoplan.names import AUTO_TUNING
from zoplan.pricing.baselines import BaselineStep
from zoplan.pricing.memory import (
    MemoryEstimate,
    estimate_memory,
    resident_capacity,
    with_device_memory,
)
from zoplan.pricing.stragglers import straggler_factor
from zoplan.request import PlanRequest
from zoplan.search.placement import resident_pattern
from zoplan.sim.bounds import StepBounds, step_bounds
from zoplan.sim.costs import StepCosts, step_costs
from zoplan.sim.simulate import SimResult
from zoplan.workload import Workload

SEARCH_PREFETCH = (1, 2, 3, 4)
# Published dtype of each family's checkpoints: the one of fp16/bf16 that is searched.
FAMILY_PRECISION = {"opt": "fp16", "llama": "bf16", "qwen3": "bf16", "qwen2": "bf16",
                    "mistral": "bf16", "gemma": "bf16", "gemma2": "bf16", "gpt2": "fp16",
                    "gpt_neox": "fp16"}
CPU_PRECISION = "fp32"
TRAINING_UPDATES = ("master", "stochastic")   # the update modes that train (searched)
_T = TypeVar("_T")


def known(value: _T | None) -> _T:
    """A figure of a candidate the search has set by the time it is read (its costs and
    bounds once it fits, its step once evaluated, its simulation once simulated in
    full), narrowed from Optional for the type checker."""
    assert value is not None, "a candidate's figure read before the search set it"
    return value


class FixedAxes(TypedDict, total=False):
    """The axes a request fixes (the options given), the rest searched."""

    pertp: int
    slices: int
    prefetch: int
    update: str
    max_gpu_memory: float
    placement: str


# A layout's axes by name (Layout's fields; also those of one that is not valid):
# slice_update is a bool, the others counts.
Axes = dict[str, int]


# What makes two candidates the same step (the search simulates each once).
CandidateKey = tuple[Layout, Workload, tuple[bool, ...]]


class _Settings(TypedDict):
    """What every workload of a request shares."""

    batch: int
    seq: int
    compute_dtype: str
    tf32: bool


@dataclass(frozen=True, kw_only=True)
class Request:
    """Validated inputs of one search."""

    model: ModelSpec
    profile: HardwareProfile
    gpus: int                   # the most devices the plan may use (--gpus)
    workloads: tuple[Workload, ...]   # one per update mode searched
    nodes: int                  # nodes of `gpus`
    fixed: FixedAxes            # axis -> fixed value (pertp, slices, prefetch, update, ...)
    precision_note: str
    placement: str = "auto"     # "host": every block offloaded; "auto": the search decides
    worlds: tuple[tuple[int, int], ...] = ()   # (devices, nodes) searched; () = (gpus, nodes)
    rough_profile: bool = False  # planned on the shipped cpu profile (a guess)
    max_gpu_memory_gib: float | None = None   # --max-gpu-memory: below the profile's

    @functools.cached_property
    def memory_profile(self) -> HardwareProfile:
        """The profile the memory check reads: the profile, its device's memory capped at
        --max-gpu-memory (pricing and the plan's record keep the profile itself)."""
        cap = self.max_gpu_memory_gib
        return self.profile if cap is None else with_device_memory(self.profile, cap)

    @property
    def local_ranks(self) -> int:
        return self.gpus // self.nodes

    @property
    def world_sizes(self) -> tuple[tuple[int, int], ...]:
        return self.worlds or ((self.gpus, self.nodes),)

    @property
    def workload(self) -> Workload:
        """The first workload searched (batch, seq and compute precision are common)."""
        return self.workloads[0]


def resolve_request(*, fewer: bool = True, estimator: dict[str, Any] | None = None,
                    **values: Any) -> Request:
    """The search's request of `values`, zoplan.request's fields by name (model, gpus,
    profile, batch, seq, ..., tuning "full", "lora" or "prefix"; `estimator`: the
    estimator's settings, zoplan.estimators, default MeZO-SGD), checked there: see
    `resolve`. `fewer`: search smaller world sizes too (world_sizes; off when --ddp
    fixes the world)."""
    return resolve(PlanRequest.make(**values, **(estimator or {})), fewer=fewer)


def resolve(request: PlanRequest, *, fewer: bool = True) -> Request:
    """The search's request: the options checked by their fields (zoplan.request), then
    what needs the model and the profile; every problem is a ZoError with the numbers.
    `lengths`: a lengths file (`zoexec lengths`): the step priced at the batches'
    padded width. `tuning` "lora" or "prefix": that workload (zoplan.lora, zoplan.prefix)
    instead of the update modes."""
    w, lay, tune = request.workload, request.layout, request.tuning
    gpus, update, tuning = request.hardware.gpus, w.update, tune.tuning
    assert w.model is not None and gpus is not None   # required: PlanRequest.make
    if tuning == AUTO_TUNING:
        raise ValueError("resolve: --tuning auto is two requests (zoplan.search.plan_request)")
    spec = get_model(w.model)
    hw = load_profile(request.hardware.profile or DEFAULT_PROFILE)
    if w.seq > spec.max_positions:
        raise ZoError(f"seq ({w.seq}) exceeds the {spec.max_positions} positions of {spec.name}")
    nodes = _nodes_for(hw, gpus)
    pertp = _fixed_pertp(gpus, lay.pertp, lay.ddp)
    _check_fixed(hw, gpus // nodes, pertp=pertp, slices=lay.slices)
    dtype, note = _precision(hw, spec, w.precision)
    rows = load_lengths(str(w.lengths)) if w.lengths is not None else None
    settings: _Settings = {"batch": w.batch, "seq": w.seq, "compute_dtype": dtype,
                           "tf32": w.tf32}
    workloads: tuple[Workload, ...]
    if tuning == "lora":
        lora = _lora_workload(spec, update, r=tune.lora_r, alpha=tune.lora_alpha,
                              targets=tune.lora_targets, **settings)
        workloads = (lora if rows is None else dataclasses.replace(lora, lengths=rows),)
        note += (f"; tuning lora (r {tune.lora_r}, alpha {tune.lora_alpha}, targets "
                 f"{','.join(tune.lora_targets)}): a frozen {dtype} base, fp32 adapters")
    elif tuning == "prefix":
        prefix = _prefix_workload(spec, update, tokens=tune.prefix_tokens, **settings)
        workloads = (prefix if rows is None else dataclasses.replace(prefix, lengths=rows),)
        note += (f"; tuning prefix ({tune.prefix_tokens} tokens): a frozen {dtype} base, fp32 "
                 f"prefix keys and values")
    else:
        modes = _update_modes(dtype, update)
        note += (f"; update {modes[0]}: fixed by --update" if update else
                 f"; update modes searched: {', '.join(modes)} (docs/precision.md)")
        workloads = tuple(Workload.for_update(**settings, update=mode, lengths=rows)
                          for mode in modes)
    estimator = request.estimator.changed()
    if estimator:
        workloads = _with_estimator(workloads, estimator)
        note += f"; estimator {workloads[0].estimator_spec.describe()}"
    if w.update_kernel != "torch":
        workloads = _with_update_kernel(workloads, w.update_kernel)
        note += f"; update kernel {w.update_kernel}"
    fixed = _fixed_axes(pertp=pertp, slices=lay.slices, prefetch=lay.prefetch, update=update,
                        max_gpu_memory=request.hardware.max_gpu_memory)
    if lay.placement != "auto":
        fixed["placement"] = lay.placement
    worlds = world_sizes(hw, gpus) if fewer and lay.ddp is None else ((gpus, nodes),)
    if lay.slices is not None:   # a fixed slice group must divide the node's ranks
        worlds = tuple((g, n) for g, n in worlds if (g // n) % lay.slices == 0)
    if pertp == 2:
        worlds = tuple((g, n) for g, n in worlds if (g // n) % 2 == 0)
    return Request(model=spec, profile=hw, gpus=gpus, workloads=workloads, nodes=nodes,
                   fixed=fixed, precision_note=note, placement=lay.placement, worlds=worlds,
                   rough_profile=is_shipped_guess(hw),
                   max_gpu_memory_gib=request.hardware.max_gpu_memory)


def _fixed_axes(*, pertp: int | None, slices: int | None, prefetch: int | None,
                update: str | None, max_gpu_memory: float | None) -> FixedAxes:
    """The axes given (those not None)."""
    fixed: FixedAxes = {}
    if pertp is not None:
        fixed["pertp"] = pertp
    if slices is not None:
        fixed["slices"] = slices
    if prefetch is not None:
        fixed["prefetch"] = prefetch
    if update is not None:
        fixed["update"] = update
    if max_gpu_memory is not None:
        fixed["max_gpu_memory"] = max_gpu_memory
    return fixed


def world_sizes(hw: HardwareProfile, gpus: int) -> tuple[tuple[int, int], ...]:
    """(devices, nodes) the search may use, largest first: --gpus is the most. On one
    node every size from 1 to gpus; across nodes whole nodes only, at every power of
    two of nodes below the request's and the request's own (a job of 3 nodes when 4
    were given is no likelier to win than one of 2, and the sizes stay few at 8,192
    nodes), and the one-node sizes that divide the node."""
    gpn = hw.gpus_per_node
    if gpus <= gpn:
        return tuple((g, 1) for g in range(gpus, 0, -1))
    nodes = gpus // gpn
    counts = sorted({nodes} | {1 << k for k in range(nodes.bit_length()) if 1 << k < nodes},
                    reverse=True)
    out = [(n * gpn, n) for n in counts]
    return tuple(out + [(g, 1) for g in range(gpn - 1, 0, -1) if gpn % g == 0])


def _with_estimator(workloads: tuple[Workload, ...],
                    estimator: dict[str, Any]) -> tuple[Workload, ...]:
    """The workloads with the estimator's settings (a ZoError naming a bad one)."""
    try:
        return tuple(dataclasses.replace(w, **estimator) for w in workloads)
    except ValueError as exc:
        raise ZoError(f"--{str(exc).replace('_', '-')}") from None


def _prefix_workload(spec: ModelSpec, update: str | None, *, tokens: int, batch: int,
                     seq: int, compute_dtype: str, tf32: bool) -> Workload:
    """The prefix workload: its prefix and the sequence within the model's positions
    (the input sits after the prefix), its update the prefix's own (fp32 masters)."""
    if update is not None:
        raise ZoError(f"--update {update} is for full tuning: the prefixes are fp32 masters "
                      f"and the base is never updated")
    if seq + tokens > spec.max_positions:
        raise ZoError(f"seq ({seq}) + --prefix-tokens ({tokens}) exceeds the "
                      f"{spec.max_positions} positions of {spec.name} (the input sits after "
                      f"the prefix)")
    try:
        return Workload.for_prefix(tokens=tokens, batch=batch, seq=seq,
                                   compute_dtype=compute_dtype, tf32=tf32)
    except ValueError as exc:
        raise ZoError(f"tuning prefix: {exc}") from None


def _lora_workload(spec: ModelSpec, update: str | None, *, r: int, alpha: int,
                   targets: tuple[str, ...], batch: int, seq: int, compute_dtype: str,
                   tf32: bool) -> Workload:
    """The LoRA workload: its targets linear modules of the model's blocks, its update
    the adapters' own (fp32 masters, no --update)."""
    if update is not None:
        raise ZoError(f"--update {update} is for full tuning: LoRA's adapters are fp32 "
                      f"masters and the base is never updated")
    try:
        check_targets(spec, tuple(targets))
        return Workload.for_lora(targets=tuple(targets), batch=batch, seq=seq,
                                 compute_dtype=compute_dtype, tf32=tf32, r=r, alpha=alpha)
    except ValueError as exc:
        raise ZoError(f"tuning lora: {exc}") from None


def _update_modes(compute_dtype: str, update: str | None) -> tuple[str, ...]:
    """The update modes to search: the fixed one, else those that train (fp32
    compute: only fp32 masters)."""
    if update is not None:
        if compute_dtype == "fp32" and update != "master":
            raise ZoError(f"--update {update} rounds to 16-bit storage, but the compute "
                          f"precision is fp32: use --update master or a 16-bit --precision")
        return (update,)
    return ("master",) if compute_dtype == "fp32" else TRAINING_UPDATES


MAX_GPUS = 2**20   # zoplan.layout.MAX_RANKS: the most ranks a plan may hold


def _nodes_for(hw: HardwareProfile, gpus: int) -> int:
    """Nodes of a job of `gpus` devices: a profile describes one node, the count of
    nodes comes from --gpus."""
    gpn = hw.gpus_per_node
    if gpus > MAX_GPUS:
        raise ZoError(f"gpus ({gpus}) > {MAX_GPUS}: more ranks than a plan may hold")
    if gpus > gpn and gpus % gpn:
        raise ZoError(f"gpus ({gpus}) is not a multiple of the {gpn} GPUs of a node "
                      f"(profile {hw.name}): a job that spans nodes uses whole nodes")
    return 1 if gpus <= gpn else gpus // gpn


def _fixed_pertp(gpus: int, pertp: int | None, ddp: int | None) -> int | None:
    if pertp == 2 and gpus % 2:
        raise ZoError(f"pertp 2 needs an even number of GPUs, got gpus ({gpus})")
    if ddp is None:
        return pertp
    if ddp < 1 or gpus % ddp or gpus // ddp not in (1, 2):
        raise ZoError(f"ddp ({ddp}) must be gpus ({gpus}) or gpus / 2: pertp = gpus / ddp "
                      "is 1 or 2")
    if pertp is not None and pertp * ddp != gpus:
        raise ZoError(f"pertp ({pertp}) x ddp ({ddp}) = {pertp * ddp} != gpus ({gpus})")
    return gpus // ddp


def _check_fixed(hw: HardwareProfile, local: int, *, pertp: int | None,
                 slices: int | None) -> None:
    if pertp == 2 and local % 2:
        raise ZoError(f"pertp 2 needs an even number of ranks per node, got {local}")
    if slices is not None:
        reason = slices_reason(hw, local, slices)
        if reason:
            raise ZoError(reason)


def _precision(hw: HardwareProfile, spec: ModelSpec, precision: str | None) -> tuple[str, str]:
    """The compute precision and how it was chosen."""
    if precision is not None:
        return precision, f"{precision}: fixed by --precision"
    if hw.is_cpu:
        return CPU_PRECISION, "fp32: the CPU default (gloo ranks compute in fp32)"
    dtype = FAMILY_PRECISION[spec.family]
    return dtype, (f"{dtype}: fp16 and bf16 cost the same (2 bytes, same tensor-core rate), so "
                   f"only {dtype}, the {spec.family} family's published dtype, was searched")


def slices_reason(hw: HardwareProfile, local: int, slices: int) -> str | None:
    """Why a slice group size is impossible on this node (None when it is fine)."""
    if slices < 1 or local % slices:
        return f"slices ({slices}) does not divide the {local} ranks of a node"
    most = hw.max_slices(local)
    if slices > most:
        return (f"slices ({slices}) > {most}: only {most} GPUs share a fast fabric "
                f"({hw.fabric_kind}, profile {hw.name})")
    if hw.fabric_kind in ("nvswitch", "bridge"):
        for first in range(0, local, slices):
            if set(range(first, first + slices)) - set(hw.fabric_group_of(first)):
                return (f"slice group of ranks {first}..{first + slices - 1} crosses fabric "
                        f"groups {hw.fabric_groups}")
    return None


@dataclass(kw_only=True)
class Candidate:
    layout: Layout
    workload: Workload
    memory: MemoryEstimate
    costs: StepCosts | None = None
    bounds: StepBounds | None = None
    step_time_s: float | None = None       # the whole job's step (stragglers included)
    method: str = ""                       # "simulated" or "extrapolated"
    sim: SimResult | None = field(default=None, repr=False)
    resident: tuple[bool, ...] = ()        # per block: kept on the devices
    period: int = 1                        # blocks after which `resident` repeats
    node_step_s: float | None = None       # one node's step (the simulation)
    straggler: float = 1.0                 # step / node step: the slowest node's pace
    program: BaselineStep | None = None    # a baseline priced as its own code runs

    @property
    def label(self) -> str:
        return self.layout.label() + (f" r{self.num_resident}" if self.num_resident else "")

    @property
    def update(self) -> str:
        return self.workload.update

    @property
    def num_resident(self) -> int:
        return sum(self.resident)

    @property
    def lower_bound_s(self) -> float:
        """A lower bound on the job's step: the node's, at the slowest node's pace."""
        return known(self.bounds).lower_bound_s * self.straggler

    @property
    def tokens_per_s(self) -> float:
        return self.workload.tokens_per_step / known(self.step_time_s)

    @property
    def key(self) -> CandidateKey:
        return (self.layout, self.workload, self.resident)


@dataclass(frozen=True, kw_only=True)
class Pruned:
    layout: Axes
    update: str
    reason: str
    overshoot: float = math.inf   # memory needed / memory there (for "does not fit")
    resident: int = 0


def enumerate_space(req: Request, fixed: FixedAxes) -> tuple[list[Candidate], list[Pruned]]:
    """Every layout of the space (fixed axes held), on every world size searched,
    split into fitting candidates and pruned ones with their reasons; with placement
    "auto" each fitting layout also comes with the most resident blocks that fit."""
    candidates: list[Candidate] = []
    pruned: list[Pruned] = []
    for gpus, nodes in req.world_sizes:
        for workload in req.workloads:
            for pertp, slices, prefetch, su in layout_axes(req, fixed, gpus, nodes,
                                                           read_only=workload.frozen_base):
                axes: Axes = {"pertp": pertp, "ddp": gpus // pertp, "nodes": nodes,
                              "slices": slices, "prefetch": prefetch, "slice_update": su}
                reason, overshoot = invalid_reason(req, axes, gpus=gpus), math.inf
                if reason is None:
                    layout = Layout(pertp=pertp, ddp=gpus // pertp, nodes=nodes, slices=slices,
                                    prefetch=prefetch, slice_update=su)
                    cand = make_candidate(req, layout, workload)
                    reason, overshoot = cand.memory.reason, cand.memory.overshoot
                if reason is not None:
                    if gpus == req.gpus or not reason.startswith("invalid"):
                        pruned.append(Pruned(layout=axes, update=workload.update,
                                             reason=reason, overshoot=overshoot))
                    continue
                candidates.append(cand)
                if fixed.get("placement", req.placement) == "auto":
                    resident = resident_candidate(req, cand)
                    if resident is not None:
                        candidates.append(resident)
    return candidates, pruned


def layout_axes(req: Request, fixed: FixedAxes, gpus: int, nodes: int, *,
                read_only: bool = False) -> Iterator[tuple[int, int, int, bool]]:
    """(pertp, slices, prefetch, slice_update) of every layout of this world size
    (`read_only`, LoRA: the base is never updated, slice_update has nothing to do)."""
    pertps, slices, prefetches = axis_values(req, fixed, gpus=gpus, nodes=nodes)
    for pertp, s, prefetch in itertools.product(pertps, slices, prefetches):
        for su in ((False, True) if s > 1 and not read_only else (False,)):
            yield pertp, s, prefetch, su


def axis_values(req: Request, fixed: FixedAxes, *, gpus: int | None = None,
                nodes: int | None = None) -> tuple[list[int], list[int], list[int]]:
    """Values of (pertp, slices, prefetch) to search: the fixed one, or every value the
    node allows (slice group sizes that divide its ranks and stay on the fast fabric)."""
    gpus, nodes = gpus or req.gpus, nodes or req.nodes
    local = gpus // nodes
    slices = [s for s in range(1, local + 1) if slices_reason(req.profile, local, s) is None]
    pairs = gpus % 2 == 0 and local % 2 == 0
    return ([fixed["pertp"]] if "pertp" in fixed else [1, 2] if pairs else [1],
            [fixed["slices"]] if "slices" in fixed else slices,
            [fixed["prefetch"]] if "prefetch" in fixed else list(SEARCH_PREFETCH))


def invalid_reason(req: Request, axes: Axes, *, gpus: int | None = None) -> str | None:
    """Why these axes are not a runnable layout on `gpus` devices (None when they are)."""
    gpus = gpus or axes["pertp"] * axes["ddp"]
    local = gpus // axes["nodes"]
    if axes["pertp"] == 2 and (gpus % 2 or local % 2):
        return f"invalid: pertp 2 needs an even number of GPUs per node, got {local}"
    if req.workload.batch % axes["ddp"]:
        return f"invalid: batch ({req.workload.batch}) is not divisible by ddp ({axes['ddp']})"
    return None


def make_candidate(req: Request, layout: Layout, workload: Workload | None = None, *,
                   resident: tuple[bool, ...] = (), period: int = 1) -> Candidate:
    workload = workload or req.workload
    memory = estimate_memory(model=req.model, profile=req.memory_profile, workload=workload,
                             layout=layout, resident_blocks=sum(resident))
    cand = Candidate(layout=layout, workload=workload, memory=memory, resident=resident,
                     period=period, straggler=straggler_factor(req.profile, layout.nodes))
    if memory.reason is None:
        cand.costs = step_costs(model=req.model, profile=req.profile, workload=workload,
                                layout=layout, resident=resident, period=period)
        cand.bounds = step_bounds(cand.costs)
    return cand


def resident_candidate(req: Request, cand: Candidate) -> Candidate | None:
    """The layout of `cand` with the most resident blocks its devices hold (None when
    not one fits)."""
    capacity = resident_capacity(model=req.model, profile=req.memory_profile,
                                 workload=cand.workload, layout=cand.layout, base=cand.memory)
    resident, period = resident_pattern(req.model.num_layers, capacity)
    if not any(resident):
        return None
    memory = estimate_memory(model=req.model, profile=req.memory_profile,
                             workload=cand.workload, layout=cand.layout,
                             resident_blocks=sum(resident))
    assert memory.reason is None, memory.reason
    costs = dataclasses.replace(known(cand.costs), resident=resident, period=period)
    return dataclasses.replace(cand, memory=memory, costs=costs, bounds=step_bounds(costs),
                               resident=resident, period=period)


def _with_update_kernel(workloads: tuple[Workload, ...], kernel: str) -> tuple[Workload, ...]:
    """The workloads priced with `kernel`'s zo passes (zoplan.pricing.zo); ZoError where
    that kernel does not run the workload (LoRA, prefix, another estimator, directions)."""
    try:
        return tuple(dataclasses.replace(wl, update_kernel=kernel) for wl in workloads)
    except ValueError as exc:
        raise ZoError(f"--update-kernel {kernel}: {exc}") from None
