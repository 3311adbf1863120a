"""The plan of a search (plan.json): the winner's layout, rank table and prediction, the
baselines and the ranked candidates.

Plans are deterministic: no timestamps, times rounded to the nanosecond, fractions to
1e-6, lists in a fixed order; the same inputs give the same bytes.
"""

from __future__ import annotations

from typing import Any

from zoplan.io import sha256_json
from zoplan.plan import PLAN_SCHEMA_VERSION, Plan, compact_ranks, tool_info
from zoplan.pricing.collectives import internode_allreduce_s
from zoplan.pricing.memory import RESIDENT_MARGIN, resident_margin_bytes
from zoplan.pricing.stragglers import node_spread
from zoplan.search.evaluate import UNSLICED_TOLERANCE, SearchResult
from zoplan.search.space import Axes, Candidate, Pruned, Request, known
from zoplan.sim.bounds import StepBounds
from zoplan.sim.nodes import job_step_s, one_node_step_s, scaling_efficiency, sweep_counts
from zoplan.trace import Span

NS = 9   # decimals of seconds kept in the plan


SEARCH_METHOD = (
    "branch and bound over layouts in order of increasing analytic lower bound; step times "
    "of candidates extrapolated from reduced-block simulations (checked, else simulated in "
    "full); the winner simulated in full; the unsliced baseline is the best slices-1 layout "
    f"within {UNSLICED_TOLERANCE:.0%}; one node simulated, the inter-node all-reduce added "
    "analytically, the step paced by the expected slowest node (compute.node_spread)")

# What ZO-DDP buys (zo-algorithms.md): every rank draws the same z, so more data shards
# average the loss difference over a larger batch; they do not add perturbations.
DDP_NOTE = (
    "ZO-DDP raises the batch per perturbation, not the number of perturbations: each step "
    "still estimates the gradient along one random direction z, from a larger batch. "
    "Tokens/s grows with the data shards (nodes), but the steps to a given loss need not "
    "fall in proportion.")


def _t(seconds: float) -> float:
    return round(float(seconds), NS)


def build_plan(result: SearchResult) -> Plan:
    req, win = result.request, result.winner
    spec = req.model.to_dict()
    data: dict[str, Any] = {
        "schema_version": PLAN_SCHEMA_VERSION,
        "tool": tool_info(),
        "model": {"name": req.model.name, "spec": spec, "sha256": sha256_json(spec)},
        "profile": {"name": req.profile.name, "sha256": req.profile.sha256,
                    "device_kind": req.profile.device_kind,
                    "gpus_per_node": req.profile.gpus_per_node},
        "workload": win.workload.to_dict(),
        "layout": win.layout.to_dict(),
        "ranks": compact_ranks(),
        "blocks": [{"block": b, "placement": "resident" if win.resident and win.resident[b]
                    else "host", "bytes": req.model.block_bytes(win.workload.param_dtype)}
                   for b in range(req.model.num_layers)],
        "predicted": predicted(win, req),
        "baselines": {"zo2": baseline_entry(result.zo2),
                      "unsliced": baseline_entry(result.unsliced, result.unsliced_reason),
                      "offloaded": baseline_entry(result.offloaded, result.offloaded_reason),
                      "all_devices": baseline_entry(result.all_devices,
                                                    result.all_devices_reason),
                      **_mezo_entry(result)},
        "candidates": [candidate_entry(c) for c in result.ranked],
        "pruned": [_pruned_entry(p) for p in result.pruned
                   if _world(p.layout) in (req.gpus, win.layout.world_size)],
        "search": {"gpus": req.gpus, "nodes": req.nodes,
                   "used_gpus": win.layout.world_size, "used_nodes": win.layout.nodes,
                   "world_sizes": [g for g, _ in req.world_sizes],
                   "placement": req.placement,
                   "fixed": dict(sorted(req.fixed.items())),
                   "precision": req.precision_note, "evaluated": len(result.ranked),
                   "pruned": len(result.pruned), "method": SEARCH_METHOD,
                   "pruned_listed": "layouts of the GPUs given and of the winner's",
                   "rough_profile": req.rough_profile},
        "notes": {"ddp": DDP_NOTE},
        "scaling": scaling(win, req),
    }
    return Plan.from_dict(data, origin="new plan")


def _mezo_entry(result: SearchResult) -> dict[str, Any]:
    """An estimator's winner: {"mezo": MeZO-SGD on its layout, with both update tasks
    of a block (update_task_s: MeZO-SGD's, estimator_update_task_s: the winner's)}."""
    if result.mezo is None:
        return {}
    entry = baseline_entry(result.mezo)
    entry["update_task_s"] = _t(known(result.mezo.costs).update_s)
    entry["estimator_update_task_s"] = _t(known(result.winner.costs).update_s)
    return {"mezo": entry}


def _world(axes: Axes) -> int:
    return axes["pertp"] * axes["ddp"]


def _pruned_entry(p: Pruned) -> dict[str, Any]:
    entry: dict[str, Any] = {"layout": p.layout, "update": p.update, "reason": p.reason}
    if p.resident:
        entry["resident_blocks"] = p.resident
    return entry


def scaling(win: Candidate, req: Request) -> dict[str, Any]:
    """The winner's scaling against one node (zoplan.sim.nodes: the per-node plan and
    batch held), and a sweep of node counts."""
    internode = known(win.costs).internode_s
    one = one_node_step_s(known(win.node_step_s), internode)
    per_node_tokens = win.workload.tokens_per_step / win.layout.nodes
    sweep: list[dict[str, Any]] = []
    for nodes in sweep_counts(win.layout.nodes):
        node_step = one + internode_allreduce_s(req.profile, nodes)
        step = job_step_s(req.profile, nodes, node_step)
        sweep.append({"nodes": nodes, "gpus": nodes * win.layout.local_ranks,
                      "batch": win.workload.batch // win.layout.nodes * nodes,
                      "step_time_s": _t(step),
                      "tokens_per_s": round(nodes * per_node_tokens / step, 6),
                      "efficiency": round(scaling_efficiency(one_node_s=one, step_s=step), 6)})
    return {"nodes": win.layout.nodes, "one_node_step_s": _t(one),
            "efficiency": round(scaling_efficiency(one_node_s=one,
                                                   step_s=known(win.step_time_s)), 6),
            "node_spread": node_spread(req.profile),
            "basis": "weak scaling: the same per-node layout and per-node batch on one node",
            "sweep": sweep}


def bottleneck(bounds: StepBounds, step_time_s: float) -> tuple[str, float]:
    """The resource (or buffer chain) busiest in the step, and its busy fraction."""
    name = bounds.binding
    busy = bounds.chain_s if name not in bounds.resources else bounds.resources[name]
    return name, busy / step_time_s


def predicted(win: Candidate, req: Request) -> dict[str, Any]:
    t, node_step, bounds = known(win.step_time_s), known(win.node_step_s), known(win.bounds)
    name, _ = bottleneck(bounds, node_step)
    wait = t - node_step   # the slowest node's lead, at the end-of-step barrier
    return {
        "step_time_s": _t(t),
        "tokens_per_s": round(win.tokens_per_s, 6),
        "gpu_mem_bytes": int(win.memory.gpu_bytes),
        "host_mem_bytes": int(win.memory.host_bytes),
        "bottleneck": name,
        "lower_bound_s": _t(win.lower_bound_s),
        "serial_upper_bound_s": _t(bounds.serial_s + wait),
        "utilisation": {k: round(v, 6) for k, v in bounds.utilisation(t).items()},
        "memory": {"gpu": _rounded_parts(win.memory.gpu_parts),
                   "gpu_usable_bytes": int(win.memory.gpu_limit_bytes),
                   "gpu_headroom_bytes": int(win.memory.gpu_limit_bytes - win.memory.gpu_bytes),
                   "resident_margin_bytes": int(resident_margin_bytes(req.memory_profile)),
                   "resident_margin": RESIDENT_MARGIN,
                   "host": _rounded_parts(win.memory.host_parts),
                   "host_bytes_limit": int(win.memory.host_limit_bytes)},
        "simulated_ranks": list(range(win.layout.local_ranks)),
        "internode_allreduce_s": _t(known(win.costs).internode_s),
        "node_step_s": _t(node_step),
        "straggler_s": _t(wait),
        "resident_blocks": win.num_resident,
        "spans": [_span_dict(s, wait) for s in known(win.sim).spans],
    }


def _rounded_parts(parts: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in parts.items()}


def _span_dict(span: Span, wait: float = 0.0) -> dict[str, Any]:
    """A span of the plan; the all-reduce that ends the step also waits `wait` for the
    slowest node."""
    start, end = _t(span.start_s), _t(span.end_s + (wait if span.kind == "allreduce" else 0.0))
    return {"kind": span.kind, "rank": span.rank, "block": span.block, "step": span.step,
            "lane": span.lane, "start_s": start, "dur_s": _t(end - start)}


def candidate_entry(cand: Candidate) -> dict[str, Any]:
    name, util = bottleneck(known(cand.bounds), known(cand.node_step_s))
    return {"layout": cand.layout.to_dict(), "label": cand.label, "update": cand.update,
            "step_time_s": _t(known(cand.step_time_s)), "tokens_per_s": round(cand.tokens_per_s, 6),
            "gpu_mem_bytes": int(cand.memory.gpu_bytes),
            "host_mem_bytes": int(cand.memory.host_bytes), "bottleneck": name,
            "bottleneck_utilisation": round(util, 6),
            "lower_bound_s": _t(cand.lower_bound_s), "method": cand.method,
            "resident_blocks": cand.num_resident,
            "gpu_headroom_bytes": int(cand.memory.gpu_limit_bytes - cand.memory.gpu_bytes)}


def baseline_entry(cand: Candidate | None, reason: str = "") -> dict[str, Any]:
    if cand is None:
        return {"step_time_s": None, "layout": None, "reason": reason}
    entry = candidate_entry(cand)
    entry["fits"] = cand.memory.reason is None
    if cand.memory.reason:
        entry["reason"] = cand.memory.reason
    entry["workload"] = cand.workload.to_dict()
    if cand.program is not None:   # priced as its own code runs (zoplan.pricing.baselines)
        entry["bottleneck"] = cand.program.bound
        entry["bottleneck_utilisation"] = 1.0
        entry["program"] = {"name": cand.program.name,
                            "parts": {k: _t(v) for k, v in cand.program.parts.items()}}
    return entry
