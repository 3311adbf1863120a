"""The plan of a search (plan.json): the winner's layout, rank table and prediction, the
baselines and the ranked candidates.

Plans are deterministic: no timestamps, times rounded to the nanosecond, fractions to
1e-6, lists in a fixed order; the same inputs give the same bytes.
"""

from __future__ import annotations

from zoplan.io import sha256_json
from zoplan.plan import PLAN_SCHEMA_VERSION, Plan, tool_info
from zoplan.search.evaluate import UNSLICED_TOLERANCE, SearchResult
from zoplan.search.space import Candidate
from zoplan.sim.bounds import StepBounds
from zoplan.trace import Span

NS = 9   # decimals of seconds kept in the plan


SEARCH_METHOD = (
    "branch and bound over layouts in order of increasing analytic lower bound; step times "
    "of candidates extrapolated from reduced-block simulations (checked, else simulated in "
    "full); the winner simulated in full; the unsliced baseline is the best slices-1 layout "
    f"within {UNSLICED_TOLERANCE:.0%}; one node simulated, the inter-node all-reduce added "
    "analytically")


def _t(seconds: float) -> float:
    return round(float(seconds), NS)


def build_plan(result: SearchResult) -> Plan:
    req, win = result.request, result.winner
    spec = req.model.to_dict()
    data = {
        "schema_version": PLAN_SCHEMA_VERSION,
        "tool": tool_info(),
        "model": {"name": req.model.name, "spec": spec, "sha256": sha256_json(spec)},
        "profile": {"name": req.profile.name, "sha256": req.profile.sha256,
                    "device_kind": req.profile.device["kind"],
                    "gpus_per_node": req.profile.gpus_per_node},
        "workload": win.workload.to_dict(),
        "layout": win.layout.to_dict(),
        "ranks": win.layout.rank_table(),
        "blocks": [{"block": b, "placement": "host",
                    "bytes": req.model.block_bytes(win.workload.param_dtype)}
                   for b in range(req.model.num_layers)],
        "predicted": predicted(win),
        "baselines": {"zo2": baseline_entry(result.zo2),
                      "unsliced": baseline_entry(result.unsliced, result.unsliced_reason)},
        "candidates": [candidate_entry(c) for c in result.ranked],
        "pruned": [{"layout": p.layout, "update": p.update, "reason": p.reason}
                   for p in result.pruned],
        "search": {"gpus": req.gpus, "nodes": req.nodes, "fixed": dict(sorted(req.fixed.items())),
                   "precision": req.precision_note, "evaluated": len(result.ranked),
                   "pruned": len(result.pruned), "method": SEARCH_METHOD},
    }
    return Plan.from_dict(data, origin="new plan")


def bottleneck(bounds: StepBounds, step_time_s: float) -> tuple[str, float]:
    """The resource (or buffer chain) busiest in the step, and its busy fraction."""
    name = bounds.binding
    busy = bounds.chain_s if name not in bounds.resources else bounds.resources[name]
    return name, busy / step_time_s


def predicted(win: Candidate) -> dict:
    t = win.step_time_s
    name, _ = bottleneck(win.bounds, t)
    return {
        "step_time_s": _t(t),
        "tokens_per_s": round(win.tokens_per_s, 6),
        "gpu_mem_bytes": int(win.memory.gpu_bytes),
        "host_mem_bytes": int(win.memory.host_bytes),
        "bottleneck": name,
        "lower_bound_s": _t(win.bounds.lower_bound_s),
        "serial_upper_bound_s": _t(win.bounds.serial_s),
        "utilisation": {k: round(v, 6) for k, v in win.bounds.utilisation(t).items()},
        "memory": {"gpu": _rounded_parts(win.memory.gpu_parts),
                   "gpu_usable_bytes": int(win.memory.gpu_limit_bytes),
                   "host": _rounded_parts(win.memory.host_parts),
                   "host_bytes_limit": int(win.memory.host_limit_bytes)},
        "simulated_ranks": list(range(win.layout.local_ranks)),
        "internode_allreduce_s": _t(win.costs.internode_s),
        "spans": [_span_dict(s) for s in win.sim.spans],
    }


def _rounded_parts(parts: dict) -> dict:
    return {k: int(v) for k, v in parts.items()}


def _span_dict(span: Span) -> dict:
    start, end = _t(span.start_s), _t(span.end_s)
    return {"kind": span.kind, "rank": span.rank, "block": span.block, "step": span.step,
            "lane": span.lane, "start_s": start, "dur_s": _t(end - start)}


def candidate_entry(cand: Candidate) -> dict:
    name, util = bottleneck(cand.bounds, cand.step_time_s)
    return {"layout": cand.layout.to_dict(), "label": cand.label, "update": cand.update,
            "step_time_s": _t(cand.step_time_s), "tokens_per_s": round(cand.tokens_per_s, 6),
            "gpu_mem_bytes": int(cand.memory.gpu_bytes),
            "host_mem_bytes": int(cand.memory.host_bytes), "bottleneck": name,
            "bottleneck_utilisation": round(util, 6),
            "lower_bound_s": _t(cand.bounds.lower_bound_s), "method": cand.method}


def baseline_entry(cand: Candidate | None, reason: str = "") -> dict:
    if cand is None:
        return {"step_time_s": None, "layout": None, "reason": reason}
    entry = candidate_entry(cand)
    entry["fits"] = cand.memory.reason is None
    if cand.memory.reason:
        entry["reason"] = cand.memory.reason
    entry["workload"] = cand.workload.to_dict()
    return entry
