"""Evaluating the candidates: branch and bound over the search space, the baselines,
the winner.

Candidates are simulated in order of increasing analytic lower bound
(zoplan.sim.bounds); once a candidate's bound reaches the best simulated time, it and
every later one are pruned. Blocks are identical, or their placement repeats every few
blocks (zoplan.search.placement), so a candidate's step time is extrapolated from
reduced-block simulations (the step grows by the same time per block, or per period of
the pattern, once the pipeline is full; two extrapolations must agree, else every block
is simulated); the winner is then simulated in full for its timeline. One node is
simulated; a job of several nodes runs at the pace of its slowest node
(zoplan.sim.nodes: the candidate's `straggler` factor).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zoplan.errors import ZoError
from zoplan.estimators import DEFAULTS as ESTIMATOR_DEFAULTS
from zoplan.layout import Layout, axes_label
from zoplan.pricing.baselines import zo2_step
from zoplan.pricing.memory import NVML_LABELS, zo2_memory
from zoplan.search.space import (
    Candidate,
    CandidateKey,
    Pruned,
    Request,
    enumerate_space,
    known,
    make_candidate,
)
from zoplan.sim.bounds import step_bounds
from zoplan.sim.costs import StepCosts, step_costs
from zoplan.sim.graph import build_step_graph
from zoplan.sim.simulate import SimResult, simulate
from zoplan.workload import Workload, default_update

ZO2_PREFETCH = 2      # ZO2's three streams: upload i, compute i-1, offload i-2


FULL_SIM_MARGIN = 2   # simulate in full when the model has at most K2 + this many blocks


EXTRAPOLATION_CHECK = 0.005  # the two extrapolations must agree within 0.5%


WINNER_MARGIN = 2e-3  # accepted extrapolations are within ~0.2% of full simulations


UNSLICED_TOLERANCE = 0.01  # the unsliced baseline is the best slices-1 layout within 1%

# what estimate_step_s found for a candidate's key: (step, method, the full simulation)
Cache = dict[CandidateKey, tuple[float, str, SimResult | None]]
Tick = Callable[[], None]
Progress = Callable[[int], Tick | None]   # progress(total) -> tick, called as the search starts

def fmt_seconds(seconds: float) -> str:
    """4 significant digits in s, ms or us."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-6:.4g} us"


def reduced_blocks(prefetch: int, period: int = 1) -> tuple[int, int, int]:
    """Block counts of the three reduced simulations: past the pipeline fill, and apart
    by multiples of the buffer-reuse period (prefetch + 1 blocks, even spans so that
    alternating patterns cancel); with a placement that repeats every `period` blocks,
    each rounded up to whole periods (and apart by at least one)."""
    counts = (prefetch + 2, 2 * prefetch + 2, 4 * prefetch + 4)
    if period <= 1:
        return counts
    k0 = -(-counts[0] // period) * period
    k1 = max(-(-counts[1] // period) * period, k0 + period)
    k2 = max(-(-counts[2] // period) * period, 2 * k1 - k0)
    return k0, k1, k2


def estimate_step_s(costs: StepCosts) -> tuple[float, str, SimResult | None]:
    """Step time of the layout. Blocks are identical, so once the pipeline is full the
    step grows by the same time per block: extrapolate linearly from reduced-block
    simulations, (K1, K2) checked against (K0, K1). Where the two disagree by more than
    EXTRAPOLATION_CHECK (a transient longer than the reduced runs, e.g. peer traffic
    through host memory), or the model is short, simulate every block instead (and
    return that simulation, spans included)."""
    k0, k1, k2 = reduced_blocks(costs.layout.prefetch, costs.period)
    blocks = costs.num_blocks
    if costs.period and blocks > k2 + FULL_SIM_MARGIN:
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


def evaluate(cand: Candidate, cache: Cache) -> None:
    """Set the candidate's step time: one node's (never below its lower bound) at the
    pace of the slowest of the job's nodes."""
    if cand.key not in cache:
        cache[cand.key] = estimate_step_s(known(cand.costs))
    seconds, method, cand.sim = cache[cand.key]
    _set_step(cand, max(seconds, known(cand.bounds).lower_bound_s), method)


def _set_step(cand: Candidate, node_step_s: float, method: str) -> None:
    cand.node_step_s, cand.method = node_step_s, method
    cand.step_time_s = node_step_s * cand.straggler


def simulate_full(cand: Candidate, *, record_spans: bool = True) -> None:
    cand.sim = sim = simulate(build_step_graph(known(cand.costs)), record_spans=record_spans)
    _set_step(cand, sim.step_time_s, "simulated")


def rank_key(cand: Candidate) -> tuple[float, int, float, float, str, str]:
    """Faster first; on a tie fewer devices, less GPU memory, then less host memory,
    then the label and the update mode."""
    return (round(known(cand.step_time_s), 9), cand.layout.world_size, cand.memory.gpu_bytes,
            cand.memory.host_bytes, cand.label, cand.update)


def branch_and_bound(candidates: list[Candidate], cache: Cache, tick: Tick | None = None, *,
                     tolerance: float = 0.0) -> tuple[list[Candidate], list[Pruned]]:
    """Simulate in order of increasing lower bound (deeper prefetch first among equal
    bounds: it usually overlaps more, so a good incumbent comes early); prune once the
    bound passes the best simulated step (less `tolerance`, a fraction; a bound equal
    to it is simulated: it may tie with less memory).
    Returns (ranked evaluated candidates, pruned by bound)."""
    order = sorted(candidates, key=lambda c: (c.lower_bound_s, -c.layout.prefetch,
                                              c.label, c.update))
    best = math.inf
    done: list[Candidate] = []
    pruned: list[Pruned] = []
    for cand in order:
        bound = cand.lower_bound_s
        if bound > best * (1 - tolerance):   # a bound equal to the best may tie it
            pruned.append(Pruned(layout=cand.layout.to_dict(), update=cand.update,
                                 resident=cand.num_resident, reason=(
                f"bound: lower bound {fmt_seconds(bound)} ({known(cand.bounds).binding}) > best "
                f"simulated step {fmt_seconds(best)}")))
        else:
            evaluate(cand, cache)
            best = min(best, known(cand.step_time_s))
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
                known(best.step_time_s)
                <= known(ranked[i + 1].step_time_s) * (1 + WINNER_MARGIN)):
            break
    out = sorted(ranked, key=rank_key)
    while out[0].sim is None:   # an estimate within the margin leads: its full run decides
        simulate_full(out[0])
        out = sorted(out, key=rank_key)
    return out


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    request: Request
    ranked: list[Candidate]            # winner first
    pruned: list[Pruned]
    zo2: Candidate
    unsliced: Candidate | None
    unsliced_reason: str
    offloaded: Candidate | None = None   # the best plan with every block offloaded
    offloaded_reason: str = ""
    all_devices: Candidate | None = None  # the best on every device given (--gpus)
    all_devices_reason: str = ""
    mezo: Candidate | None = None         # an estimator's winner: MeZO-SGD on its layout

    @property
    def winner(self) -> Candidate:
        return self.ranked[0]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused inside: a search makes millions of small
    objects it keeps, and the collector's passes over them took a third of its time
    (benchmarks/planner/bench_search.py); whatever cycles it leaves are collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def search(req: Request, *,
           progress: Progress | None = None) -> SearchResult:
    """Run the whole search (the garbage collector paused: paused_gc); `progress(total)`
    returns a tick function (or None)."""
    with paused_gc():
        return _search(req, progress=progress)


def _search(req: Request, *,
            progress: Progress | None = None) -> SearchResult:
    candidates, pruned = enumerate_space(req, req.fixed)
    if not candidates:
        raise ZoError(_nothing_fits(req, pruned))
    tick = progress(len(candidates) + 2) if progress else None
    cache: Cache = {}
    ranked, by_bound = branch_and_bound(candidates, cache, tick)
    ranked = pick_winner(ranked)
    unsliced, reason = _unsliced_baseline(req, ranked, cache)
    offloaded, off_reason = _best_among(req, ranked, candidates, cache,
                                        lambda c: not c.num_resident, "offloaded")
    everything, all_reason = _best_among(req, ranked, candidates, cache,
                                         lambda c: c.layout.world_size == req.gpus,
                                         f"on all {req.gpus}")
    if tick:
        tick()
    zo2 = zo2_baseline(req, ranked[0].workload)
    if tick:
        tick()
    return SearchResult(request=req, ranked=ranked, pruned=pruned + by_bound, zo2=zo2,
                        unsliced=unsliced, unsliced_reason=reason, offloaded=offloaded,
                        offloaded_reason=off_reason, all_devices=everything,
                        all_devices_reason=all_reason, mezo=mezo_baseline(req, ranked[0]))


def mezo_baseline(req: Request, winner: Candidate) -> Candidate | None:
    """An estimator's winner (zoplan.estimators) against MeZO-SGD with one direction on
    the same layout, placement and update mode: what the estimator's draws and
    directions cost per step (None for a MeZO-SGD winner)."""
    if winner.workload.estimator_spec.is_default:
        return None
    defaults: dict[str, Any] = ESTIMATOR_DEFAULTS   # field -> MeZO-SGD's value
    workload = dataclasses.replace(winner.workload, **defaults)
    cand = make_candidate(req, winner.layout, workload, resident=winner.resident,
                          period=winner.period)
    if cand.costs is None:
        return None
    simulate_full(cand, record_spans=False)
    return cand


def _best_among(req: Request, ranked: list[Candidate], candidates: list[Candidate],
                cache: Cache, wanted: Callable[[Candidate], bool],
                what: str) -> tuple[Candidate | None, str]:
    """The best candidate that satisfies `wanted` (the winner's rivals the report shows
    beside it), within UNSLICED_TOLERANCE: the winner itself when it qualifies, else a
    branch and bound of its own over those candidates."""
    mine = [c for c in candidates if wanted(c)]
    if not mine:
        return None, f"no layout {what} fits"
    best = next((c for c in ranked if wanted(c)), None)
    if best is not None and best is ranked[0]:
        return best, ""
    found, _ = branch_and_bound(mine, cache, tolerance=UNSLICED_TOLERANCE)
    return found[0], ""


def _nothing_fits(req: Request, pruned: list[Pruned]) -> str:
    devices = f"{req.gpus} {req.profile.device_word}" + ("s" if req.gpus != 1 else "")
    if not pruned:
        return f"no layout of {devices} to search"
    chosen = min(pruned, key=lambda p: p.overshoot)  # the closest to fitting, else the first
    return (f"no layout of {req.model.name} on {devices} ({req.profile.name}) can run; "
            f"the closest, {axes_label(chosen.layout)} {chosen.update}: {chosen.reason}")


def _unsliced_baseline(req: Request, ranked: list[Candidate], cache: Cache
                       ) -> tuple[Candidate | None, str]:
    """Best layout with slices 1 and every block offloaded (DistZO2 without its sliced
    upload) on all the GPUs given (other fixed axes held)."""
    def unsliced(c: Candidate) -> bool:
        return c.layout.slices == 1 and not c.num_resident and c.layout.world_size == req.gpus
    mine = [c for c in ranked if unsliced(c)]
    if req.fixed.get("slices") == 1 or (mine and mine[0] is ranked[0]):
        return (mine[0] if mine else None), ""
    req = dataclasses.replace(req, worlds=((req.gpus, req.nodes),))
    candidates, pruned = enumerate_space(req, {**req.fixed, "slices": 1, "placement": "host"})
    if not candidates:
        return None, pruned[0].reason if pruned else "no layout with slices 1"
    best, _ = branch_and_bound(candidates, cache, tolerance=UNSLICED_TOLERANCE)
    return best[0], ""


def zo2_baseline(req: Request, workload: Workload) -> Candidate:
    """ZO2 on one GPU, the whole global batch, in the winner's precision. On a GPU
    profile, ZO2 as its own code runs (zoplan.pricing.baselines.zo2_step: three streams
    whose tasks wait on the host for the task before them, the zo maths as torch ops per
    tensor, HF's eager attention) and its memory as NVML reports it (zo2_memory). On a
    CPU profile (ZO2 needs CUDA streams: no real program to price) zoexec's schedule
    with ZO2's zo maths: +eps, -2eps, +eps in place and the update, z drawn four times
    per block and step (zoplan.pricing.tasks.task_times, schedule "zo2"). ZO2 trains
    every weight: against a LoRA or prefix winner it is ZO2 in the same precision, full-parameter."""
    if workload.frozen_base:
        workload = Workload.for_update(batch=workload.batch, seq=workload.seq,
                                       compute_dtype=workload.compute_dtype,
                                       update=default_update(workload.compute_dtype),
                                       tf32=workload.tf32)
    layout = Layout(pertp=1, ddp=1, nodes=1, slices=1, prefetch=ZO2_PREFETCH)
    cand = make_candidate(req, layout, workload)
    cand.costs = step_costs(model=req.model, profile=req.profile, workload=workload,
                            layout=layout, schedule="zo2")
    cand.bounds = step_bounds(cand.costs)   # computed even when it does not fit: say so
    if req.profile.is_cpu:
        simulate_full(cand, record_spans=False)
        return cand
    return _as_zo2_runs(req, cand)


def _as_zo2_runs(req: Request, cand: Candidate) -> Candidate:
    """The candidate priced as ZO2's code runs: its step and its NVML memory."""
    wl = cand.workload
    rows = wl.batch * wl.rows_per_example
    step = zo2_step(req.model, req.profile, batch=rows, seq=wl.seq, dtype=wl.compute_dtype)
    parts = zo2_memory(req.model, req.profile, batch=rows, seq=wl.seq, dtype=wl.compute_dtype)
    labels = {"resident": "resident embeddings, final norm and head",
              "blocks": "two blocks (the one computing, the one arriving)",
              "compute_stream": "compute stream's pool (ZO2's largest phase)", **NVML_LABELS}
    memory = dataclasses.replace(cand.memory, gpu_parts=parts, labels={**cand.memory.labels, **labels})
    cand = dataclasses.replace(cand, memory=memory, program=step)
    _set_step(cand, step.step_s, "zo2 as its code runs")
    return cand
