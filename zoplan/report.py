"""What `zoplan optimize` produces from a search: the plan object (plan.json) and the
rich tables of the winner, the baselines and the top candidates.

Plans are deterministic: no timestamps, times rounded to the nanosecond, fractions to
1e-6, lists in a fixed order; the same inputs give the same bytes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from zoplan.bounds import StepBounds
from zoplan.hardware import GIB
from zoplan.io import sha256_json
from zoplan.layout import axes_label
from zoplan.plan import PLAN_SCHEMA_VERSION, Plan, tool_info
from zoplan.search import UNSLICED_TOLERANCE, Candidate, SearchResult
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


# ---- the plan ----------------------------------------------------------------------
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
        "pruned": [{"layout": p.layout, "reason": p.reason} for p in result.pruned],
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
    return {"layout": cand.layout.to_dict(), "label": cand.label,
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


# ---- progress ------------------------------------------------------------------------
@contextlib.contextmanager
def search_progress(*, enabled: bool):
    """Yields `progress(total) -> tick`, drawing a rich bar on stderr (or None)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("searching layouts"), BarColumn(), MofNCompleteColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        def progress(total: int):
            task = bar.add_task("search", total=total)
            return lambda: bar.advance(task)
        yield progress


# ---- tables --------------------------------------------------------------------------
def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f}"


def _secs(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.3f}" if seconds < 100 else f"{seconds:.1f}"


def render_optimize(plan: Plan, console, *, top: int, output: Path,
                    profile_arg: str | None) -> None:
    from rich import box
    from rich.table import Table

    d = plan.data
    console.print(_headline(d, profile_arg), highlight=False)
    shown = min(top, len(d["candidates"]))
    table = Table(title=f"top {shown} of {len(d['candidates'])} simulated layouts "
                        "(memory in GiB: per GPU, per node's host)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  collapse_padding=True)
    for col in ("#", "layout", "step s", "tok/s", "xZO2", "GPU", "host", "bottleneck"):
        table.add_column(col, justify="left" if col in ("layout", "bottleneck") else "right",
                         no_wrap=col != "bottleneck")
    zo2 = d["baselines"]["zo2"]["step_time_s"]
    for i, cand in enumerate(d["candidates"][:top], 1):
        table.add_row(*_row(str(i), cand, zo2), style="bold green" if i == 1 else None)
    table.add_section()
    for key, title in (("zo2", "ZO2"), ("unsliced", "s1")):
        base = d["baselines"][key]
        if base.get("step_time_s") is not None:
            table.add_row(*_row(title, base, zo2), style="dim")
    console.print(table)
    for line in _summary(d, output):
        console.print(line, highlight=False)


def _headline(d: dict, profile_arg: str | None) -> str:
    w, s = d["workload"], d["search"]
    prof = d["profile"]["name"] + ("" if profile_arg else " (default profile)")
    nodes = f" ({s['nodes']} nodes)" if s["nodes"] > 1 else ""
    gpus = f"{s['gpus']} GPU" + ("s" if s["gpus"] != 1 else "")
    return (f"[bold]{d['model']['name']}[/] on {gpus}{nodes}, {prof}; "
            f"batch {w['batch']} x seq {w['seq']}; precision {s['precision']}")


def _row(first: str, cand: dict, zo2: float | None) -> list[str]:
    speed = _ratio(zo2 / cand["step_time_s"]) if zo2 else "-"
    util = cand.get("bottleneck_utilisation")
    neck = cand["bottleneck"] + (f" {util:.0%}" if util is not None else "")
    approx = "~" if cand.get("method") == "extrapolated" else ""
    return [first, cand["label"], approx + _secs(cand["step_time_s"]),
            f"{cand['tokens_per_s']:,.0f}", speed, _gib(cand["gpu_mem_bytes"]),
            f"{cand['host_mem_bytes'] / GIB:.0f}", neck]


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _faster(ratio: float) -> str:
    return f"{_ratio(ratio)}x faster" if ratio >= 1 else f"{_ratio(1 / ratio)}x slower"


def _summary(d: dict, output: Path) -> list[str]:
    p, base = d["predicted"], d["baselines"]
    lines = [f"[bold]winner[/] {d['candidates'][0]['label']}: {_secs(p['step_time_s'])} s/step "
             f"(lower bound {_secs(p['lower_bound_s'])} s, bottleneck {p['bottleneck']}), "
             f"GPU {_gib(p['gpu_mem_bytes'])} of {_gib(p['memory']['gpu_usable_bytes'])} GiB, "
             f"host {_gib(p['host_mem_bytes'])} of {_gib(p['memory']['host_bytes_limit'])} GiB"]
    for key, title in (("zo2", "ZO2 baseline (1 GPU, whole batch)"),
                       ("unsliced", "unsliced baseline (slices 1)")):
        b = base[key]
        if b.get("step_time_s") is None:
            lines.append(f"{title}: none ({b.get('reason', '')})")
            continue
        note = "" if b.get("fits", True) else " - " + b.get("reason", "")
        lines.append(f"{title}: {b['label']} {_secs(b['step_time_s'])} s/step, winner is "
                     f"{_faster(b['step_time_s'] / p['step_time_s'])}{note}")
    lines.append("~ extrapolated from reduced-block simulations (two extrapolations agree "
                 "within 0.5%); ZO2 = one GPU, whole batch; s1 = best unsliced layout")
    lines += _pruned_lines(d.get("pruned", []))
    lines.append(f"plan written to {output}")
    return lines


def _pruned_lines(pruned: list[dict], *, examples: int = 3) -> list[str]:
    """Counts of pruned layouts by reason, and the first few reasons that are not the
    bound (those say what does not fit or is invalid, with the numbers)."""
    kinds: dict[str, int] = {}
    for p in pruned:
        kind = p["reason"].split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return ["pruned: none"]
    lines = ["pruned: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))]
    shown: set[str] = set()
    for p in pruned:
        if p["reason"].startswith("bound") or p["reason"] in shown or len(shown) == examples:
            continue
        shown.add(p["reason"])
        lines.append(f"  {axes_label(p['layout'])}: {p['reason']}")
    return lines
