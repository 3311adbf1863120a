"""Layout search behind `zoplan optimize`: enumerate -> is_valid (with a reason) ->
memory -> bound -> simulate -> rank, and the plan of the winner.

Axes: PertP degree (1 or 2; DDP = gpus / pertp, across nodes when the job spans more
than one node), slice group size (divisors of the node's ranks up to the GPUs that share
a fast fabric), prefetch depth (1..4) and stored precision. fp16 and bf16 cost exactly
the same in every formula (2 bytes, one tensor-core rate), so only one of them is
searched - the model family's published dtype - and the plan says so.

Branch and bound: candidates are simulated in order of increasing analytic lower bound
(zoplan.bounds); once a candidate's bound reaches the best simulated time, it and every
later one are pruned. Blocks are identical, so a candidate's step time is extrapolated
from reduced-block simulations (the step grows by the same time per block once the
pipeline is full; two extrapolations must agree, else every block is simulated); the
winner is then simulated in full for its timeline.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from zoplan.bounds import StepBounds, step_bounds
from zoplan.errors import ZoError
from zoplan.graph import StepCosts, build_step_graph, step_costs
from zoplan.hardware import DEFAULT_PROFILE, HardwareProfile, load_profile
from zoplan.layout import Layout
from zoplan.memory import MemoryEstimate, estimate_memory
from zoplan.models import DTYPE_BYTES, ModelSpec, get_model
from zoplan.simulate import SimResult, simulate
from zoplan.workload import Workload

SEARCH_PREFETCH = (1, 2, 3, 4)
# Published dtype of each family's checkpoints: the one of fp16/bf16 that is searched.
FAMILY_PRECISION = {"opt": "fp16", "llama": "bf16", "qwen3": "bf16"}
CPU_PRECISION = "fp32"
ZO2_PREFETCH = 2      # ZO2's three streams: upload i, compute i-1, offload i-2
FULL_SIM_MARGIN = 2   # simulate in full when the model has at most K2 + this many blocks
EXTRAPOLATION_CHECK = 0.005  # the two extrapolations must agree within 0.5%
WINNER_MARGIN = 2e-3  # accepted extrapolations are within ~0.2% of full simulations
UNSLICED_TOLERANCE = 0.01  # the unsliced baseline is the best slices-1 layout within 1%


def fmt_seconds(seconds: float) -> str:
    """4 significant digits in s, ms or us."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-6:.4g} us"


# ---- the request -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Request:
    """Validated inputs of one search."""

    model: ModelSpec
    profile: HardwareProfile
    gpus: int
    workload: Workload
    nodes: int
    fixed: dict                 # axis -> fixed value (pertp, slices, prefetch)
    precision_note: str

    @property
    def local_ranks(self) -> int:
        return self.gpus // self.nodes


def resolve_request(*, model: str, gpus: int, profile: str | None, batch: int, seq: int,
                    param_dtype: str | None = None, pertp: int | None = None,
                    ddp: int | None = None, slices: int | None = None,
                    prefetch: int | None = None) -> Request:
    """Check the inputs; every problem is a ZoError with the numbers."""
    spec = get_model(model)
    hw = load_profile(profile or DEFAULT_PROFILE)
    if batch < 1 or seq < 1:
        raise ZoError(f"batch ({batch}) and seq ({seq}) must be >= 1")
    if seq > spec.max_positions:
        raise ZoError(f"seq ({seq}) exceeds the {spec.max_positions} positions of {spec.name}")
    nodes = _nodes_for(hw, gpus)
    pertp = _fixed_pertp(gpus, pertp, ddp)
    _check_fixed(hw, gpus // nodes, pertp=pertp, slices=slices, prefetch=prefetch)
    dtype, note = _precision(hw, spec, param_dtype)
    workload = Workload(batch=batch, seq=seq, param_dtype=dtype,
                        compute_dtype=CPU_PRECISION if hw.is_cpu else dtype)
    fixed = {k: v for k, v in (("pertp", pertp), ("slices", slices), ("prefetch", prefetch))
             if v is not None}
    return Request(model=spec, profile=hw, gpus=gpus, workload=workload, nodes=nodes,
                   fixed=fixed, precision_note=note)


def _nodes_for(hw: HardwareProfile, gpus: int) -> int:
    gpn, most = hw.gpus_per_node, hw.gpus_per_node * hw.max_nodes
    if gpus < 1:
        raise ZoError(f"gpus must be >= 1, got {gpus}")
    if gpus > most:
        raise ZoError(f"gpus ({gpus}) > {gpn} GPUs per node x {hw.max_nodes} nodes = {most} "
                      f"(profile {hw.name})")
    if gpus > gpn and gpus % gpn:
        raise ZoError(f"gpus ({gpus}) is not a multiple of the {gpn} GPUs of a node "
                      f"(profile {hw.name}): a job that spans nodes uses whole nodes")
    return 1 if gpus <= gpn else gpus // gpn


def _fixed_pertp(gpus: int, pertp: int | None, ddp: int | None) -> int | None:
    if pertp is not None and pertp not in (1, 2):
        raise ZoError(f"pertp must be 1 or 2, got {pertp}")
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


def _check_fixed(hw: HardwareProfile, local: int, *, pertp, slices, prefetch) -> None:
    if prefetch is not None and prefetch < 1:
        raise ZoError(f"prefetch must be >= 1, got {prefetch}")
    if pertp == 2 and local % 2:
        raise ZoError(f"pertp 2 needs an even number of ranks per node, got {local}")
    if slices is not None:
        reason = slices_reason(hw, local, slices)
        if reason:
            raise ZoError(reason)


def _precision(hw: HardwareProfile, spec: ModelSpec, param_dtype: str | None) -> tuple[str, str]:
    if param_dtype is not None:
        if param_dtype not in DTYPE_BYTES:
            raise ZoError(f"unknown precision {param_dtype!r}; use one of "
                          f"{', '.join(DTYPE_BYTES)}")
        return param_dtype, f"{param_dtype}: fixed by --precision"
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
                f"({hw.fabric['kind']}, profile {hw.name})")
    if hw.fabric["kind"] in ("nvswitch", "bridge"):
        for first in range(0, local, slices):
            if set(range(first, first + slices)) - set(hw.fabric_group_of(first)):
                return (f"slice group of ranks {first}..{first + slices - 1} crosses fabric "
                        f"groups {hw.fabric_groups}")
    return None


# ---- candidates --------------------------------------------------------------------
@dataclass(kw_only=True)
class Candidate:
    layout: Layout
    workload: Workload
    memory: MemoryEstimate
    costs: StepCosts | None = None
    bounds: StepBounds | None = None
    step_time_s: float | None = None
    method: str = ""                       # "simulated" or "extrapolated"
    sim: SimResult | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return self.layout.label()

    @property
    def tokens_per_s(self) -> float:
        return self.workload.tokens_per_step / self.step_time_s


@dataclass(frozen=True, kw_only=True)
class Pruned:
    layout: dict
    reason: str
    overshoot: float = math.inf   # memory needed / memory there (for "does not fit")


def enumerate_space(req: Request, fixed: dict) -> tuple[list[Candidate], list[Pruned]]:
    """Every layout of the space (fixed axes held), split into fitting candidates
    and pruned ones with their reasons."""
    candidates, pruned = [], []
    for pertp, slices, prefetch in itertools.product(*axis_values(req, fixed)):
        axes = {"pertp": pertp, "ddp": req.gpus // pertp, "nodes": req.nodes,
                "slices": slices, "prefetch": prefetch}
        reason, overshoot = invalid_reason(req, axes), math.inf
        if reason is None:
            cand = make_candidate(req, Layout(**axes))
            reason, overshoot = cand.memory.reason, cand.memory.overshoot
        if reason is None:
            candidates.append(cand)
        else:
            pruned.append(Pruned(layout=axes, reason=reason, overshoot=overshoot))
    return candidates, pruned


def axis_values(req: Request, fixed: dict) -> tuple[list[int], list[int], list[int]]:
    """Values of (pertp, slices, prefetch) to search: the fixed one, or every value the
    node allows (slice group sizes that divide its ranks and stay on the fast fabric)."""
    local = req.local_ranks
    slices = [s for s in range(1, local + 1) if slices_reason(req.profile, local, s) is None]
    return ([fixed["pertp"]] if "pertp" in fixed else [1, 2] if pertp_pairs(req) else [1],
            [fixed["slices"]] if "slices" in fixed else slices,
            [fixed["prefetch"]] if "prefetch" in fixed else list(SEARCH_PREFETCH))


def pertp_pairs(req: Request) -> bool:
    """Whether PertP 2 can pair the ranks: an even number of GPUs on every node."""
    return req.gpus % 2 == 0 and req.local_ranks % 2 == 0


def invalid_reason(req: Request, axes: dict) -> str | None:
    """Why these axes are not a runnable layout (None when they are)."""
    if axes["pertp"] == 2 and not pertp_pairs(req):
        return f"invalid: pertp 2 needs an even number of GPUs per node, got {req.local_ranks}"
    if req.workload.batch % axes["ddp"]:
        return f"invalid: batch ({req.workload.batch}) is not divisible by ddp ({axes['ddp']})"
    return None


def make_candidate(req: Request, layout: Layout, workload: Workload | None = None) -> Candidate:
    workload = workload or req.workload
    memory = estimate_memory(model=req.model, profile=req.profile, workload=workload,
                             layout=layout)
    cand = Candidate(layout=layout, workload=workload, memory=memory)
    if memory.reason is None:
        cand.costs = step_costs(model=req.model, profile=req.profile, workload=workload,
                                layout=layout)
        cand.bounds = step_bounds(cand.costs)
    return cand


# ---- simulation --------------------------------------------------------------------
def reduced_blocks(prefetch: int) -> tuple[int, int, int]:
    """Block counts of the three reduced simulations: past the pipeline fill, and apart
    by multiples of the buffer-reuse period (prefetch + 1 blocks, even spans so that
    alternating patterns cancel)."""
    return prefetch + 2, 2 * prefetch + 2, 4 * prefetch + 4


def estimate_step_s(costs: StepCosts) -> tuple[float, str, SimResult | None]:
    """Step time of the layout. Blocks are identical, so once the pipeline is full the
    step grows by the same time per block: extrapolate linearly from reduced-block
    simulations, (K1, K2) checked against (K0, K1). Where the two disagree by more than
    EXTRAPOLATION_CHECK (a transient longer than the reduced runs, e.g. peer traffic
    through host memory), or the model is short, simulate every block instead (and
    return that simulation, spans included)."""
    k0, k1, k2 = reduced_blocks(costs.layout.prefetch)
    blocks = costs.num_blocks
    if blocks > k2 + FULL_SIM_MARGIN:
        t0, t1, t2 = (_reduced_s(costs, k) for k in (k0, k1, k2))
        late = t2 + (blocks - k2) * (t2 - t1) / (k2 - k1)
        early = t1 + (blocks - k1) * (t1 - t0) / (k1 - k0)
        if abs(early - late) <= EXTRAPOLATION_CHECK * late:
            return late, "extrapolated", None
    sim = simulate(build_step_graph(costs), record_spans=True)
    return sim.step_time_s, "simulated", sim


def _reduced_s(costs: StepCosts, num_blocks: int) -> float:
    graph = build_step_graph(costs, num_blocks=num_blocks)
    return simulate(graph, record_spans=False).step_time_s


def evaluate(cand: Candidate, cache: dict) -> None:
    """Set the candidate's step time (never below its lower bound)."""
    key = (cand.layout, cand.workload)
    if key not in cache:
        cache[key] = estimate_step_s(cand.costs)
    seconds, method, cand.sim = cache[key]
    cand.step_time_s, cand.method = max(seconds, cand.bounds.lower_bound_s), method


def simulate_full(cand: Candidate, *, record_spans: bool = True) -> None:
    cand.sim = simulate(build_step_graph(cand.costs), record_spans=record_spans)
    cand.step_time_s, cand.method = cand.sim.step_time_s, "simulated"


def rank_key(cand: Candidate) -> tuple:
    """Faster first; on a tie less GPU memory, then less host memory, then the label."""
    return (round(cand.step_time_s, 9), cand.memory.gpu_bytes, cand.memory.host_bytes,
            cand.label)


def branch_and_bound(candidates: list[Candidate], cache: dict, tick=None, *,
                     tolerance: float = 0.0) -> tuple[list[Candidate], list[Pruned]]:
    """Simulate in order of increasing lower bound (deeper prefetch first among equal
    bounds: it usually overlaps more, so a good incumbent comes early); prune once the
    bound reaches the best simulated step (less `tolerance`, a fraction).
    Returns (ranked evaluated candidates, pruned by bound)."""
    order = sorted(candidates, key=lambda c: (c.bounds.lower_bound_s, -c.layout.prefetch,
                                              c.label))
    best, done, pruned = math.inf, [], []
    for cand in order:
        bound = cand.bounds.lower_bound_s
        if bound >= best * (1 - tolerance):
            pruned.append(Pruned(layout=cand.layout.to_dict(), reason=(
                f"bound: lower bound {fmt_seconds(bound)} ({cand.bounds.binding}) >= best "
                f"simulated step {fmt_seconds(best)}")))
        else:
            evaluate(cand, cache)
            best = min(best, cand.step_time_s)
            done.append(cand)
        if tick:
            tick()
    return sorted(done, key=rank_key), pruned


def pick_winner(ranked: list[Candidate]) -> list[Candidate]:
    """Simulate the leader in full; if the full run is slower than the next estimate by
    more than the extrapolation error (WINNER_MARGIN), simulate that one too, until the
    best full run beats every remaining estimate."""
    for i, cand in enumerate(ranked):
        if cand.sim is None:
            simulate_full(cand)
        best = min(ranked[: i + 1], key=rank_key)
        if i + 1 == len(ranked) or (
                best.step_time_s <= ranked[i + 1].step_time_s * (1 + WINNER_MARGIN)):
            break
    return sorted(ranked, key=rank_key)


# ---- the whole search --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SearchResult:
    request: Request
    ranked: list[Candidate]            # winner first
    pruned: list[Pruned]
    zo2: Candidate
    unsliced: Candidate | None
    unsliced_reason: str

    @property
    def winner(self) -> Candidate:
        return self.ranked[0]


def search(req: Request, *, progress=None) -> SearchResult:
    """Run the whole search; `progress(total)` returns a tick function (or None)."""
    candidates, pruned = enumerate_space(req, req.fixed)
    if not candidates:
        raise ZoError(_nothing_fits(req, pruned))
    tick = progress(len(candidates) + 2) if progress else None
    cache: dict = {}
    ranked, by_bound = branch_and_bound(candidates, cache, tick)
    ranked = pick_winner(ranked)
    unsliced, reason = _unsliced_baseline(req, ranked, cache)
    if tick:
        tick()
    zo2 = zo2_baseline(req)
    if tick:
        tick()
    return SearchResult(request=req, ranked=ranked, pruned=pruned + by_bound, zo2=zo2,
                        unsliced=unsliced, unsliced_reason=reason)


def _nothing_fits(req: Request, pruned: list[Pruned]) -> str:
    if not pruned:
        return f"no layout of {req.gpus} GPUs to search"
    chosen = min(pruned, key=lambda p: p.overshoot)  # the closest to fitting, else the first
    return (f"no layout of {req.model.name} on {req.gpus} GPUs ({req.profile.name}) can run; "
            f"the closest, {Layout(**chosen.layout).label()}: {chosen.reason}")


def _unsliced_baseline(req: Request, ranked: list[Candidate], cache: dict
                       ) -> tuple[Candidate | None, str]:
    """Best layout with slices 1 on the same GPUs (other fixed axes held)."""
    mine = [c for c in ranked if c.layout.slices == 1]
    if req.fixed.get("slices") == 1 or (mine and mine[0] is ranked[0]):
        return (mine[0] if mine else None), ""
    candidates, pruned = enumerate_space(req, {**req.fixed, "slices": 1})
    if not candidates:
        return None, pruned[0].reason if pruned else "no layout with slices 1"
    best, _ = branch_and_bound(candidates, cache, tolerance=UNSLICED_TOLERANCE)
    return best[0], ""


def zo2_baseline(req: Request) -> Candidate:
    """ZO2 on one GPU: pertp 1, slices 1, prefetch 2, the whole global batch."""
    layout = Layout(pertp=1, ddp=1, nodes=1, slices=1, prefetch=ZO2_PREFETCH)
    cand = make_candidate(req, layout)
    if cand.costs is None:  # does not fit: still time it, and say so
        cand.costs = step_costs(model=req.model, profile=req.profile, workload=req.workload,
                                layout=layout)
        cand.bounds = step_bounds(cand.costs)
    simulate_full(cand, record_spans=False)
    return cand


# ---- the command ---------------------------------------------------------------------
def optimize_command(*, model: str, gpus: int, profile: str | None, batch: int, seq: int,
                     param_dtype: str | None, pertp: int | None, ddp: int | None,
                     slices: int | None, prefetch: int | None, output: Path,
                     json_out: bool, top: int, quiet: bool, console) -> None:
    """`zoplan optimize`: search, write the plan, show the tables and the timeline."""
    from zoplan.report import build_plan, render_optimize, search_progress

    req = resolve_request(model=model, gpus=gpus, profile=profile, batch=batch, seq=seq,
                          param_dtype=param_dtype, pertp=pertp, ddp=ddp, slices=slices,
                          prefetch=prefetch)
    _check_output(Path(output))
    with search_progress(enabled=not (quiet or json_out)) as progress:
        result = search(req, progress=progress)
    plan = build_plan(result)
    plan.save(output)
    if json_out:
        console.file.write(plan.to_json())
        return
    if quiet:
        return
    render_optimize(plan, console, top=top, output=Path(output), profile_arg=profile)
    _timeline(plan, console)


def _check_output(output: Path) -> None:
    """Fail before searching, and never replace a device or a folder with a plan."""
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise ZoError(f"cannot write {output}: folder {parent} does not exist")
    if output.exists() and not output.is_file():
        raise ZoError(f"cannot write the plan to {output}: it exists and is not a regular file")


def _timeline(plan, console) -> None:
    try:
        import zoplan.view as view
    except ImportError:
        return
    render = getattr(view, "render_short_timeline", None)
    if render is not None:
        render(plan, console)
