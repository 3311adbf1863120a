"""How much the plan's prediction rests on assumed figures: the winner (and the
runner-up, and ZO2) priced again with each assumed figure of the profile
(zoplan.origins) at the low and the high end of its plausible range (RANGES, each with
its reason; docs/planner.md), then with every such figure at the end that makes the step
fastest and at the end that makes it slowest together: the step's range. The winner
"stays the winner" when the runner-up is not faster at any of these points.

Only those few candidates are priced again (reduced-block simulations extrapolated, as
the search does: zoplan.search.evaluate.estimate_step_s), so the whole costs a few times
one candidate's evaluation per assumed figure (benchmarks/planner/bench_sensitivity.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile
from zoplan.plan import Plan
from zoplan.search.evaluate import SearchResult, estimate_step_s, reduced_blocks, zo2_baseline
from zoplan.search.space import Candidate, Request, make_candidate
from zoplan.sim.costs import StepCosts
from zoplan.sim.graph import build_step_graph
from zoplan.sim.simulate import simulate

MOVES = 0.005   # a figure that moves the step or the memory by less than this is left out
# figure (dotted path) -> (how: "x" scales it, "abs" sets it; low, high; why that range)
LAUNCH = "a CUDA launch from Python costs 5-25 us of host time (docs/sources.md: launch)"
RANGES: dict[str, tuple[str, float, float, str]] = {
    "compute.m_half_tokens": ("x", 0.5, 2.0, "rows at which GEMMs reach half their peak: not "
                              "measured on shipped profiles; cuBLAS's curves put it at 128-512"),
    "compute.overhead_us": ("x", 0.5, 2.0, "host time of a block's ~10-15 launches: " + LAUNCH),
    "compute.launch_us": ("abs", 5.0, 25.0, LAUNCH),
    "compute.z_launch_us": ("abs", 5.0, 25.0, LAUNCH),
    "compute.z_ns_per_elem": ("x", 0.55, 1.3, "Philox draws measured at 2.1-3.8 ps a value on "
                              "other GPUs; an older GPU may be slower still"),
    "compute.overlap_slowdown": ("abs", 0.0, 0.3, "no public figure for these kernels: from "
                                 "free overlap to 30% slower"),
    "compute.overlap_gemm_slowdown": ("x", 0.5, 1.5, "measured on one GPU only"),
    "compute.overlap_side_slowdown": ("x", 0.5, 1.5, "measured on one GPU only"),
    "compute.node_spread": ("abs", 0.0, 0.05, "0-5% between nodes (Sinha et al., SC'22: "
                            "8% between GPUs on average)"),
    "compute.slow_node_fraction": ("abs", 0.0, 0.1, "no public share of nodes with a slow GPU"),
    "compute.rank_jitter": ("x", 0.5, 2.0, "one SKU's spread, measured on other clusters"),
    "fabric.p2p_gbps": ("x", 0.85, 1.3, "a share of the NVLink spec assumed; H100s measure "
                        "82-84% of theirs (docs/sources.md: nccl-1264)"),
    "pcie.uplink_h2d_duplex_gbps": ("x", 0.8, 2.0, "a switch uplink splits both ways like one "
                                    "GPU's link (assumed) or not at all"),
    "pcie.uplink_d2h_duplex_gbps": ("x", 0.8, 1.05, "as the H2D one; D2H drops little"),
    "pcie.h2d_duplex_gbps": ("x", 0.5, 1.0, "H2D beside D2H: 11-13 of 25 GB/s on A100 hosts, "
                             "full rate on others (docs/sources.md: nvbw-11)"),
    "pcie.d2h_duplex_gbps": ("x", 0.5, 1.0, "as H2D: the duplex drop depends on the host"),
    "device.reserved_gib": ("x", 0.5, 2.0, "headroom for what the model does not count"),
    "device.context_gib": ("x", 0.6, 1.5, "bare contexts measure 0.27-0.43 GiB, 0.75 with "
                           "the libraries on this project's H200"),
    "device.allocator_slack_gib": ("x", 0.5, 2.0, "one run's slack; it depends on the shapes"),
    "host.batch_us": ("x", 0.4, 4.0, "a rank's batch assembly on the host, not measured"),
    "network.latency_us": ("x", 0.5, 3.0, "a few switch hops over InfiniBand, not measured"),
}
DEFAULT_RANGE = ("x", 0.8, 1.25, "no range documented for this figure: +-20-25%")
FIXED = {"compute.rank_scaling"}   # one GPU per rank: 1 by construction, nothing to move
MEMORY_ONLY = {"device.reserved_gib", "device.context_gib", "device.allocator_slack_gib",
               "host.memory_gib"}     # figures the step does not read: memory alone re-priced
MANY_NODES = {"compute.node_spread", "compute.slow_node_fraction", "compute.slow_node_penalty",
              "network.latency_us", "network.gbps"}   # read only by jobs of several nodes


def plausible_range(path: str, value: Any) -> tuple[Any, Any, str] | None:
    """(low, high, reason) of an assumed figure (None: it has nothing to move)."""
    if path in FIXED:
        return None
    how, low, high, why = RANGES.get(path, DEFAULT_RANGE)
    if isinstance(value, list):   # the all-gather table: its bandwidths scaled
        return ([[s, b * low] for s, b in value], [[s, b * high] for s, b in value], why)
    if how == "abs":
        return (low, high, why) if (low, high) != (value, value) else None
    lo, hi = value * low, value * high
    if isinstance(value, int) and not isinstance(value, bool) and path.endswith(("cores", "sockets")):
        lo, hi = max(1, round(lo)), max(1, round(hi))
    return lo, hi, why


def with_figure(profile: HardwareProfile, changes: dict[str, Any]) -> HardwareProfile | None:
    """The profile with these figures changed (None where it fails the profile's checks)."""
    data = profile.to_dict()
    for path, value in changes.items():
        section, key = path.split(".")
        data[section] = dict(data[section], **{key: value})
    try:
        return HardwareProfile.from_dict(data, origin=f"profile {profile.name} (sensitivity)")
    except ZoError:
        return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Priced:
    """The candidates priced on one profile: step seconds (None: does not fit)."""

    winner: float | None
    gpu_bytes: float | None
    runner_up: float | None
    zo2: float | None
    mezo: float | None = None     # MeZO-SGD on the winner's layout (an estimator's winner)


_SIMULATED: dict[str, float] = {}   # StepCosts -> node step: a figure that leaves a layout's
                                    # costs as they were is not simulated again
_KEPT = 256


def _quick_s(costs: StepCosts) -> float:
    """A node's step from the two smallest reduced-block simulations, extrapolated (the
    screening of one figure: its move against the nominal priced the same way)."""
    k0, k1, _ = reduced_blocks(costs.layout.prefetch, costs.period)
    if not costs.period or costs.num_blocks <= k1:
        return estimate_step_s(costs)[0]
    t0, t1 = (simulate(build_step_graph(costs, num_blocks=k), record_spans=False).step_time_s
              for k in (k0, k1))
    return t1 + (costs.num_blocks - k1) * (t1 - t0) / (k1 - k0)


def _step(req: Request, cand: Candidate, *, quick: bool = False
          ) -> tuple[float | None, float | None]:
    """(step seconds, GPU bytes) of `cand`'s layout on `req`'s profile (`quick`:
    _quick_s)."""
    again = make_candidate(req, cand.layout, cand.workload, resident=cand.resident,
                           period=cand.period)
    if again.costs is None or again.bounds is None:
        return None, None
    key = repr((quick, again.costs))   # StepCosts holds dicts: its repr is its value
    seconds = _SIMULATED.get(key)
    if seconds is None:
        seconds = _quick_s(again.costs) if quick else estimate_step_s(again.costs)[0]
        if len(_SIMULATED) >= _KEPT:
            _SIMULATED.clear()
        _SIMULATED[key] = seconds
    return max(seconds, again.bounds.lower_bound_s) * again.straggler, again.memory.gpu_bytes


def price(req: Request, profile: HardwareProfile, winner: Candidate,
          runner_up: Candidate | None, *, zo2: bool = False, memory_only: bool = False,
          nominal_step: float | None = None, quick: bool = False,
          mezo: Candidate | None = None) -> Priced:
    """The winner, the runner-up and (`zo2`) ZO2 priced on `profile` (`memory_only`:
    the winner's memory, its step taken as `nominal_step`)."""
    req = dataclasses.replace(req, profile=profile)
    if memory_only:
        again = make_candidate(req, winner.layout, winner.workload, resident=winner.resident,
                               period=winner.period)
        fits = again.memory.reason is None
        return Priced(winner=nominal_step if fits else None,
                      gpu_bytes=again.memory.gpu_bytes if fits else None, runner_up=None, zo2=None)
    step, mem = _step(req, winner, quick=quick)
    other = _step(req, runner_up)[0] if runner_up is not None else None
    base = zo2_baseline(req, winner.workload).step_time_s if zo2 else None
    plain = _step(req, mezo)[0] if mezo is not None else None
    return Priced(winner=step, gpu_bytes=mem, runner_up=other, zo2=base, mezo=plain)


def _scaled(p: Priced, screen: float | None, nominal: float | None) -> Priced:
    """A screened price with its step as the nominal step times the screened move."""
    if p.winner is None or not screen or nominal is None:
        return p
    return dataclasses.replace(p, winner=nominal * p.winner / screen)


def _rel(value: float | None, nominal: float | None) -> float:
    if value is None or not nominal:
        return 0.0
    return value / nominal - 1.0


def _shape(cand: Candidate) -> tuple[Any, ...]:
    """What makes a layout another layout: its axes, slices and update on the slice, its
    update mode and whether blocks stay resident (not the prefetch depth: a tie)."""
    lay = cand.layout
    return (lay.pertp, lay.ddp, lay.nodes, lay.slices, lay.slice_update, cand.update,
            cand.num_resident > 0)


def _runner_up(result: SearchResult) -> Candidate | None:
    """The best simulated candidate of another layout than the winner's (_shape): among
    the ranked ones, else the fastest of the rivals the plan shows (every block
    offloaded, every device given, unsliced)."""
    win = _shape(result.winner)
    found = next((c for c in result.ranked[1:] if _shape(c) != win), None)
    if found is not None:
        return found
    rivals = [c for c in (result.offloaded, result.all_devices, result.unsliced)
              if c is not None and c.costs is not None and c.step_time_s is not None
              and _shape(c) != win]
    return min(rivals, key=lambda c: c.step_time_s or 0.0, default=None)


def sensitivity(result: SearchResult) -> dict[str, Any]:
    """The plan's `sensitivity` section (docs/planner.md; module docstring)."""
    req, win = result.request, result.winner
    runner = _runner_up(result)
    nominal = price(req, req.profile, win, runner, zo2=True, mezo=result.mezo)
    screen = price(req, req.profile, win, None, quick=True).winner   # the screening's nominal
    figures, fast, slow, small, big = [], {}, {}, {}, {}
    data = req.profile.to_dict()   # the figures it moves (zoplan.hardware.DATA_READERS)
    values = {f"{s}.{k}": v for s in ("device", "host", "pcie", "fabric", "collective",
                                       "network", "compute")
              for k, v in data[s].items()}
    origins = req.profile.origins
    for path in req.profile.assumed_figures():
        bounds = plausible_range(path, values[path])
        if bounds is None or (path in MANY_NODES and win.layout.nodes == 1):
            continue
        low, high, why = bounds
        at = {}
        for end, value in (("low", low), ("high", high)):
            variant = with_figure(req.profile, {path: value})
            at[end] = _scaled(price(req, variant, win, None, memory_only=path in MEMORY_ONLY,
                                    nominal_step=screen, quick=True), screen, nominal.winner) \
                if variant else None
        ends = [(end, p) for end, p in at.items() if p is not None and p.winner is not None]
        moves = [abs(_rel(p.winner, nominal.winner)) for _, p in ends]
        moves += [abs(_rel(p.gpu_bytes, nominal.gpu_bytes)) for _, p in ends]
        misfit = len(ends) < len(at)
        if not misfit and (not moves or max(moves) < MOVES):
            continue
        entry = {"figure": path, "value": values[path], "low": low, "high": high,
                 "reason": why, "assumed_by": origins[path].by}
        for end, p in at.items():
            entry[f"step_{end}_s"] = None if p is None else p.winner
            entry[f"gpu_mem_{end}_bytes"] = None if p is None or p.gpu_bytes is None else int(p.gpu_bytes)
        figures.append(entry)
        if not ends:
            continue
        by_step = sorted(ends, key=lambda e: e[1].winner or 0.0)
        fast[path], slow[path] = (low if by_step[0][0] == "low" else high), \
            (low if by_step[-1][0] == "low" else high)
        by_mem = sorted(ends, key=lambda e: e[1].gpu_bytes or 0.0)
        small[path], big[path] = (low if by_mem[0][0] == "low" else high), \
            (low if by_mem[-1][0] == "low" else high)
    figures.sort(key=lambda f: -_spread(f, nominal.winner))
    return _section(req, win, runner, nominal, figures, fast, slow, small, big,
                    mezo=result.mezo)


def _spread(entry: dict[str, Any], nominal: float | None) -> float:
    steps = [entry[k] for k in ("step_low_s", "step_high_s") if entry[k] is not None]
    return (max(steps) - min(steps)) / nominal if steps and nominal else 0.0


def _section(req: Request, win: Candidate, runner: Candidate | None, nominal: Priced,
             figures: list[dict[str, Any]], fast: dict[str, Any], slow: dict[str, Any],
             small: dict[str, Any], big: dict[str, Any], *, mezo: Candidate | None = None
             ) -> dict[str, Any]:
    """Every assumed figure at its fast end, then at its slow end, together."""
    combos = {}
    for name, changes in (("fast", fast), ("slow", slow), ("small", small), ("big", big)):
        variant = with_figure(req.profile, changes) if changes else req.profile
        corner = name in ("fast", "slow")
        combos[name] = (price(req, variant, win, runner, zo2=corner,
                              mezo=mezo if corner else None) if variant else nominal)
    points = [nominal, combos["fast"], combos["slow"]]
    stays = runner is None or all(
        p.runner_up is None or p.winner is None or p.runner_up >= p.winner * (1 - 1e-9)
        for p in points)
    steps = [p.winner for p in points if p.winner is not None]
    mems = [p.gpu_bytes for p in (nominal, combos["small"], combos["big"]) if p.gpu_bytes]
    ratios = [p.zo2 / p.winner for p in points if p.zo2 and p.winner]
    over_mezo = [p.mezo / p.winner for p in points if p.mezo and p.winner]
    return {
        "method": "each assumed figure at the low and the high end of its plausible range "
                  "(zoplan.search.sensitivity.RANGES), then all at their fast and at their "
                  "slow ends together; the winner, the runner-up and ZO2 priced again",
        "nominal_step_s": nominal.winner,
        "step_time_s": {"low": min(steps), "high": max(steps)},
        "gpu_mem_bytes": {"low": int(min(mems)), "high": int(max(mems))} if mems else None,
        "zo2_ratio": {"low": min(ratios), "high": max(ratios)} if ratios else None,
        "mezo_ratio": ({"low": min(over_mezo), "high": max(over_mezo)} if over_mezo
                       else None),   # an estimator's winner over MeZO-SGD on its layout
        "runner_up": None if runner is None else runner.label,
        "runner_up_step_s": None if runner is None else {
            "nominal": nominal.runner_up, "fast": combos["fast"].runner_up,
            "slow": combos["slow"].runner_up},
        "winner_stays": bool(stays),
        "figures": figures,
    }


def _rounded(value: Any) -> Any:
    """Floats to the plan's nanosecond (and 1e-9 of a ratio), ints kept: deterministic."""
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def with_sensitivity(plan: Plan, result: SearchResult) -> Plan:
    """The plan with its `sensitivity` section (additive: every other key as it was)."""
    data = dict(plan.data)
    data["sensitivity"] = _rounded(sensitivity(result))
    return Plan.from_dict(data, origin="new plan")
