"""What `zoplan optimize` prints: a progress bar while it searches, then the winner, the
baselines and the top candidates, and a short timeline of the winner."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from zoplan.errors import ZoError
from zoplan.hardware import GIB
from zoplan.layout import axes_label
from zoplan.plan import Plan
from zoplan.request import MAX_TOP
from zoplan.search.evaluate import Progress as SearchProgress
from zoplan.search.evaluate import Tick
from zoplan.views.sensitivity import sensitivity_lines


@contextlib.contextmanager
def search_progress(*, enabled: bool) -> Iterator[SearchProgress | None]:
    """Yields `progress(total) -> tick`, drawing a rich bar on stderr (or None). The bar
    starts with the search: a request refused before it prints nothing but its error."""
    if not enabled:
        yield None
        return
    bar = Progress(TextColumn("searching layouts"), BarColumn(), MofNCompleteColumn(),
                   console=Console(stderr=True), transient=True)

    def progress(total: int) -> Tick:
        bar.start()
        task = bar.add_task("search", total=total)
        return lambda: bar.advance(task)
    try:
        yield progress
    finally:
        if bar.live.is_started:
            bar.stop()


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f}"


def _secs(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.3f}" if seconds < 100 else f"{seconds:.1f}"


def check_top(top: int) -> None:
    """--top: the candidates shown, 0..MAX_TOP (check it before searching)."""
    if not 0 <= top <= MAX_TOP:
        raise ZoError(f"--top {top}: show 0..{MAX_TOP} candidates")


def device_word(d: dict[str, Any], count: int | None = None) -> str:
    """What the plan's devices are called: GPU(s), or CPU rank(s) on CPU profiles."""
    word = "CPU rank" if d["profile"]["device_kind"] == "cpu" else "GPU"
    return word if count == 1 else word + "s"


def mem_word(d: dict[str, Any]) -> str:
    return "rank" if d["profile"]["device_kind"] == "cpu" else "GPU"


def _mem_label(d: dict[str, Any]) -> str:
    return "rank memory" if d["profile"]["device_kind"] == "cpu" else "GPU"


def rough_profile_warning(plan: Plan) -> str | None:
    """The one warning of a plan made on the shipped cpu profile (assumed figures)."""
    if not (plan.data.get("search") or {}).get("rough_profile"):
        return None
    return (f"warning: profile {plan.data['profile']['name']!r} is a rough guess of a "
            "generic host, not this machine (in a trial its steps ran 3-4x slower than "
            "planned): measure this machine with `zoplan profile --cpu -o "
            "hwprofiles/NAME.json` and plan with --profile hwprofiles/NAME.json")


def render_optimize(plan: Plan, console: Console, *, top: int, output: Path,
                    profile_arg: str | None, sweep_nodes: bool = False) -> None:
    check_top(top)
    d = plan.data
    console.print(_headline(d, profile_arg), highlight=False)
    shown = min(top, len(d["candidates"]))
    table = Table(title=f"top {shown} of {len(d['candidates'])} simulated layouts "
                        f"(memory in GiB: per {mem_word(d)}, per node's host; rN: N blocks "
                        f"resident on the {device_word(d)})",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  collapse_padding=True)
    for col in ("#", "layout", "update", "step s", "tok/s", "xZO2", mem_word(d), "host",
                "bottleneck"):
        table.add_column(col, justify="left" if col in ("layout", "update", "bottleneck")
                         else "right", no_wrap=col != "bottleneck")
    zo2 = d["baselines"]["zo2"]["step_time_s"]
    for i, cand in enumerate(d["candidates"][:top], 1):
        table.add_row(*_row(str(i), cand, zo2), style="bold green" if i == 1 else None)
    table.add_section()
    for key, title in BASELINE_ROWS:
        base = d["baselines"].get(key) or {}
        if base.get("step_time_s") is not None and base.get("label") != d["candidates"][0]["label"]:
            table.add_row(*_row(title, base, zo2), style="dim")
    console.print(table)
    for line in _summary(d, output):
        console.print(line, highlight=False)
    for line in sensitivity_lines(d):   # zoplan.views.sensitivity
        console.print(line, highlight=False)
    if sweep_nodes:
        console.print(sweep_table(d))


BASELINE_ROWS = (("offloaded", "host"), ("all_devices", "all"), ("zo2", "ZO2"),
                 ("unsliced", "s1"))


def _headline(d: dict[str, Any], profile_arg: str | None) -> str:
    w, s = d["workload"], d["search"]
    prof = d["profile"]["name"] + ("" if profile_arg else " (default profile)")
    nodes = f" ({s['nodes']} nodes)" if s["nodes"] > 1 else ""
    gpus = f"{s['gpus']} {device_word(d, s['gpus'])}"
    priced = (f" (priced at a padded width of {w['priced_seq']:.1f}: --lengths)"
              if "priced_seq" in w else "")
    return (f"[bold]{d['model']['name']}[/] on {gpus}{nodes}, {prof}; "
            f"batch {w['batch']} x seq {w['seq']}{priced}; precision {s['precision']}")


def sweep_table(d: dict[str, Any]) -> Table:
    """Throughput against node count: the winner's per-node layout and batch held."""
    scaling = d.get("scaling") or {}
    table = Table(title="throughput against node count (the winner's per-node layout and "
                        "per-node batch held; efficiency against one node)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("nodes", device_word(d), "batch", "step s", "tok/s", "efficiency"):
        table.add_column(col, justify="right")
    for row in scaling.get("sweep", []):
        table.add_row(f"{row['nodes']:,}", f"{row['gpus']:,}", f"{row['batch']:,}",
                      _secs(row["step_time_s"]), f"{row['tokens_per_s']:,.0f}",
                      f"{row['efficiency']:.1%}",
                      style="bold" if row["nodes"] == scaling.get("nodes") else None)
    return table


UPDATE_SHORT = {"stochastic": "stoch"}   # the table's update column


def _row(first: str, cand: dict[str, Any], zo2: float | None) -> list[str]:
    speed = _ratio(zo2 / cand["step_time_s"]) if zo2 else "-"
    util = cand.get("bottleneck_utilisation")
    neck = cand["bottleneck"] + (f" {util:.0%}" if util is not None else "")
    approx = "~" if cand.get("method") == "extrapolated" else ""
    update = cand.get("update") or (cand.get("workload") or {}).get("update", "")
    return [first, cand["label"] or "", UPDATE_SHORT.get(update, update),
            approx + _secs(cand["step_time_s"]),
            f"{cand['tokens_per_s']:,.0f}", speed, _gib(cand["gpu_mem_bytes"]),
            f"{cand['host_mem_bytes'] / GIB:.0f}", neck]


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _faster(ratio: float) -> str:
    return f"{_ratio(ratio)}x faster" if ratio >= 1 else f"{_ratio(1 / ratio)}x slower"


def _summary(d: dict[str, Any], output: Path) -> list[str]:
    p, base = d["predicted"], d["baselines"]
    mem = p["memory"]
    lines = [f"[bold]winner[/] {d['candidates'][0]['label']}, update {d['workload']['update']}: "
             f"{_secs(p['step_time_s'])} s/step "
             f"(lower bound {_secs(p['lower_bound_s'])} s, bottleneck {p['bottleneck']}), "
             f"{_mem_label(d)} {_gib(p['gpu_mem_bytes'])} of {_gib(mem['gpu_usable_bytes'])} GiB, "
             f"host {_gib(p['host_mem_bytes'])} of {_gib(mem['host_bytes_limit'])} GiB"]
    lines += _placement_lines(d)
    lines += _devices_lines(d)
    one = device_word(d, 1)
    for key, title in (("zo2", f"ZO2 baseline (1 {one}, whole batch)"),
                       ("unsliced", "unsliced baseline (slices 1, every block offloaded)")):
        b = base[key]
        if b.get("step_time_s") is None:
            lines.append(f"{title}: none ({b.get('reason', '')})")
            continue
        note = "" if b.get("fits", True) else " - " + b.get("reason", "")
        lines.append(f"{title}: {b['label']} {_secs(b['step_time_s'])} s/step, winner is "
                     f"{_faster(b['step_time_s'] / p['step_time_s'])}{note}")
    lines += _estimator_lines(d)
    lines += _nodes_lines(d)
    lines.append(f"~ extrapolated from reduced-block simulations (two extrapolations agree "
                 f"within 0.5%); rN = N blocks resident on the {device_word(d)}; su = update on the "
                 f"slice; host = best plan with every block offloaded, all = best on every "
                 f"{one} given (each within 1%); ZO2 = one {one}, whole batch; s1 = best "
                 f"unsliced layout; update: master = fp32 master weights, stoch = 16-bit with "
                 f"stochastic rounding, plain = 16-bit rounded to nearest (docs/precision.md)")
    lines += _pruned_lines(d.get("pruned", []))
    lines.append(f"plan written to {output}")
    return lines


def _placement_lines(d: dict[str, Any]) -> list[str]:
    """Resident blocks: how many, the memory left, and the best all-offloaded plan."""
    p, mem = d["predicted"], d["predicted"]["memory"]
    resident = p.get("resident_blocks") or 0
    if "gpu_headroom_bytes" not in mem:
        return []
    where = f"per {mem_word(d)}"
    blocks = len(d["blocks"])
    which = "every block" if resident == blocks else f"{resident} of {blocks} blocks"
    spread = ", spread among the offloaded ones" if 0 < resident < blocks else ""
    cpu = d["profile"]["device_kind"] == "cpu"
    device = "rank" if cpu else "device"
    how = ("sharded over each slice group" if d["layout"]["slices"] > 1
           else f"a whole copy on each {device}")
    where_kept = "in the ranks' memory" if cpu else "on the devices"
    head = (f"placement: {which} resident {where_kept} ({how}{spread}); memory headroom "
            f"{_gib(mem['gpu_headroom_bytes'])} GiB {where} (resident blocks leave "
            f"{mem['resident_margin']:.0%} of the {device}'s memory, "
            f"{_gib(mem['resident_margin_bytes'])} GiB, free as a safety margin)")
    if d.get("search", {}).get("placement") == "host":
        head = (f"placement: every block offloaded (--placement host); memory headroom "
                f"{_gib(mem['gpu_headroom_bytes'])} GiB {where}")
    lines = [head]
    off = d["baselines"].get("offloaded") or {}
    if resident and off.get("step_time_s") is not None:
        lines.append(f"best plan with every block offloaded: {off['label']}, update "
                     f"{(off.get('workload') or {}).get('update', off.get('update', ''))}: "
                     f"{_secs(off['step_time_s'])} s/step, headroom "
                     f"{_gib(off.get('gpu_headroom_bytes', 0))} GiB {where}; winner is "
                     f"{_faster(off['step_time_s'] / p['step_time_s'])}")
    return lines


def _devices_lines(d: dict[str, Any]) -> list[str]:
    """Say plainly when the winner uses fewer devices than given."""
    s, p = d["search"], d["predicted"]
    used = s.get("used_gpus", s["gpus"])
    if used == s["gpus"]:
        return []
    every = d["baselines"].get("all_devices") or {}
    than = (f": {_faster(every['step_time_s'] / p['step_time_s'])} than the best on all "
            f"{s['gpus']} ({every['label']}, {_secs(every['step_time_s'])} s/step)"
            if every.get("step_time_s") else f"; no layout of all {s['gpus']} fits")
    return [f"[bold]uses {used} of the {s['gpus']} {device_word(d)} given[/]{than}"]


def _estimator_lines(d: dict[str, Any]) -> list[str]:
    """An estimator's winner against MeZO-SGD on its layout (docs/estimators.md)."""
    mezo, wl = d["baselines"].get("mezo") or {}, d["workload"]
    if mezo.get("step_time_s") is None:
        return []
    name = wl.get("estimator", "mezo")
    own = {"lowrank": f" rank {wl.get('lowrank_rank')}, V every {wl.get('lowrank_every')} steps",
           "sparse": f" share {wl.get('sparse_share')}"}.get(name, "")
    more = f", {wl.get('directions')} directions a step" if wl.get("directions", 1) > 1 else ""
    step = d["predicted"]["step_time_s"]
    return [f"estimator {name}{own}{more}: update task "
            f"{mezo['estimator_update_task_s'] * 1e3:.3g} ms a block against MeZO-SGD's "
            f"{mezo['update_task_s'] * 1e3:.3g} ms; MeZO-SGD on the winner's layout "
            f"{_secs(mezo['step_time_s'])} s/step, the estimator's step is "
            f"{_faster(mezo['step_time_s'] / step)} (per step; steps to an accuracy: "
            f"docs/estimators.md)"]


def _nodes_lines(d: dict[str, Any]) -> list[str]:
    """Several nodes: what they cost (scaling efficiency), and what DDP buys, once."""
    lines = []
    scaling, p = d.get("scaling") or {}, d["predicted"]
    if scaling.get("nodes", 1) > 1:
        lines.append(f"{scaling['nodes']:,} nodes: scaling efficiency {scaling['efficiency']:.1%} "
                     f"against one node (the same per-node plan and batch); the slowest node "
                     f"adds {_secs(p.get('straggler_s', 0.0))} s/step (node spread "
                     f"{scaling.get('node_spread', 0):.0%}), the inter-node all-reduce "
                     f"{p.get('internode_allreduce_s', 0.0) * 1e3:.2g} ms")
    if d["layout"]["ddp"] > 1 and (d.get("notes") or {}).get("ddp"):
        lines.append("note: DDP " + str(d["layout"]["ddp"]) + " raises the batch per "
                     "perturbation, not the number of perturbations: tokens/s grows with "
                     "data shards, steps to a given loss need not fall in proportion")
    return lines


def _pruned_lines(pruned: list[dict[str, Any]], *, examples: int = 3) -> list[str]:
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
