"""A hardware profile from the profiler's samples (zoexec.profiler.measure): the fits of
each measurement round, combined into one profile whose figures are the medians over
the rounds, with source notes, the raw samples and the provenance.

The samples' `settings` say what was measured (sizes, shapes, ranks); this module
reads them as attributes and never imports the profiler.
"""

from __future__ import annotations

import json
import re
import statistics
from types import SimpleNamespace
from typing import Any, cast

from zoplan import __version__
from zoplan.execrules import SPEED_CHECK_KINDS
from zoplan.hardware import GIB, HardwareProfile
from zoplan.profiling.fits import (
    collective_figures,
    fabric_from_topology,
    fit_compute,
    fit_figures,
    fit_gpu_compute,
    fit_gpu_z,
    fit_z,
    gbps,
    hbm_from_passes,
    paired_mem_scaling,
    paired_rank_scaling,
    paired_z_scaling,
    rank_jitter,
    round4,
    share_groups,
)
from zoplan.profiling.sources import MIB, SampleSettings, cpu_sources, cuda_sources

THREADS_RULE = "max(1, cores // local_ranks) torch threads per rank (zoexec)"


def build_profile(samples: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """The profile dict (validated) from the samples of every round."""
    # cast: the samples' settings are zoexec.profiler.settings.Settings.to_dict()'s keys,
    # read back from JSON as attributes (SampleSettings names those read here)
    settings = cast(SampleSettings, SimpleNamespace(**samples["settings"]))
    rounds, date, host = samples["rounds"], samples["date"], samples["host"]
    rounds[0]["rejected_samples"] = samples["rejected_samples"]
    name = name or default_name(settings, host["name"], samples["devices"])
    build = cuda_profile if settings.device == "cuda" else cpu_profile
    data = combine_rounds([build(m, settings, name=name, date=date, memory=host)
                           for m in rounds])
    data["provenance"] = provenance(samples)
    data["notes"] = ("Measured on this machine by `zoplan profile`; raw samples, medians and "
                     "IQRs are under measurements.")
    plain: dict[str, Any] = json.loads(json.dumps(data, default=float))  # JSON types only
    data = plain
    HardwareProfile.from_dict(data, origin=f"measured profile {name}")
    return data


def default_name(settings: SampleSettings, hostname: str, devices: list[str]) -> str:
    host = re.sub(r"[^a-z0-9]+", "-", hostname.lower()).strip("-") or "host"
    if settings.device == "cpu":
        return f"{host}-cpu{settings.ranks}"
    gpu = re.sub(r"[^a-z0-9]+", "-", devices[0].lower()).strip("-")
    return f"{host}-{settings.ranks}x-{gpu}"


def provenance(samples: dict[str, Any]) -> dict[str, Any]:
    s, host = samples["settings"], samples["host"]
    return {"tool": "zoplan profile", "date": samples["date"], "host": host["name"],
            "cpu_model": host["cpu_model"], "os": host["os"], "cores": s["cores"],
            "versions": {**samples["versions"], "zoplan": __version__},
            "device_kind": s["device"], "devices": samples["devices"], "ranks": s["ranks"],
            "repeats": s["repeats"], "quick": s["quick"],
            "other_load_pct": round(samples["other_load_pct"], 1),
            "threads_rule": THREADS_RULE, "command": samples["command"],
            **_budget(samples)}


def _budget(samples: dict[str, Any]) -> dict[str, Any]:
    """The time budget and what the load did to the samples (a profile measured before
    the budget existed has none)."""
    budget = samples.get("budget")
    if not budget:
        return {}
    return {"budget": budget,
            "disturbance": disturbance_line(budget, samples["other_load_pct"])}


def disturbance_line(budget: dict[str, Any], other_load_pct: float) -> str:
    """One line: how long the profile took against its budget, the rounds, and how
    disturbed its samples were (retaken, and kept although disturbed)."""
    taken = budget["samples"] + budget["retaken"]
    hit = budget["retaken"] + budget["disturbed_kept"]
    share = 100.0 * hit / taken if taken else 0.0
    over = budget["elapsed_s"] - budget["time_budget_s"]
    when = (f"{_fmt_s(budget['elapsed_s'])} of a {_fmt_s(budget['time_budget_s'])} budget"
            if over <= 0 else f"{_fmt_s(budget['elapsed_s'])}, {_fmt_s(over)} over its "
            f"{_fmt_s(budget['time_budget_s'])} budget (the first round's least work)")
    rounds = f"{budget['rounds']} of {budget['rounds_planned']} rounds"
    if not hit:
        return f"{when}, {rounds}; no sample disturbed by other processes"
    cut = f"; cut short: {', '.join(budget['cut'])}" if budget.get("cut") else ""
    verdict = ("the figures are slower and noisier than this machine's own: re-measure "
               "when it is quiet" if share >= 10 else "a few samples retaken")
    return (f"{when}, {rounds}; other processes used {other_load_pct:.0f}% of the CPUs and "
            f"disturbed {share:.0f}% of {taken} samples ({budget['retaken']} retaken, "
            f"{budget['disturbed_kept']} kept disturbed{cut}): {verdict}")


def _fmt_s(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds}s" if seconds < 60 else f"{seconds // 60}m{seconds % 60:02d}s"


# ---- one round ---------------------------------------------------------------------------
def median_rate(copies: list[dict[str, Any]], key: str) -> float:
    rate: float = statistics.median(c[key] for c in copies)
    return rate


def cpu_profile(m: dict[str, Any], settings: SampleSettings, *, name: str, date: str, memory: dict[str, Any]) -> dict[str, Any]:
    """The profile dict of a CPU host (gloo ranks), from measure_cpu's results."""
    head = next(c for c in m["copy_alone"] if c["bytes"] == settings.copy_bytes)
    h2d, d2h = head["h2d_gbps"], head["d2h_gbps"]
    ranks = m["ranks"]
    together = _cpu_together(ranks, settings) if ranks else None
    mem_bw = max(h2d, d2h, together["copy_gbps"] if together else 0.0)
    fit = fit_compute(m["forward_alone"], mem_gbps=2 * h2d)
    k, threads = settings.ranks, m["threads_alone"]
    zfit = fit_z(m["zo_alone"]["z_draws"], chunk_us=m["zo_alone"]["z_chunk"]["us_per_chunk"])
    scaling = paired_rank_scaling(ranks, overhead_s=fit["overhead_us"] * 1e-6) \
        if ranks else 1.0
    mem_scaling = paired_mem_scaling(ranks, fit=fit, gemm_scaling=scaling) if ranks else 1.0
    z_scaling = paired_z_scaling(ranks, call_s=zfit["z_call_us"] * 1e-6) if ranks else 1.0
    zo_scaling = k * m["zo_alone"]["ns_per_param"] / together["zo_ns_per_param"] \
        if together else 1.0
    coll = together["collective"] if together else _single_rank_collective()
    sources = cpu_sources(settings, threads=threads, fit=fit, date=date,
                           num_forwards=len(m["forward_alone"]))
    if not together:
        for key in ("collective.latency_us", "collective.allreduce_small_us",
                    "collective.allgather_busbw", "fabric.p2p_gbps", "host.mem_bw_gbps",
                    "compute.rank_scaling", "compute.zo_rank_scaling", "compute.z_rank_scaling",
                    "compute.mem_rank_scaling"):
            sources[key] = "[D] one rank: nothing shared, no collectives measured"
    coll_net = coll["allgather_busbw"][-1][1]
    return {
        "schema_version": 1, "name": name, "gpus_per_node": k,
        "description": f"{memory['cpu_model']}: {k} gloo ranks on {settings.cores} cores "
                       f"(measured by zoplan profile {date})",
        "device": {"kind": "cpu", "model": memory["cpu_model"],
                   "memory_gib": round(memory["total_gib"], 2),
                   "reserved_gib": round(memory["used_gib"] + 1.0, 2),
                   "concurrent_engines": False},
        "host": {"memory_gib": round(memory["total_gib"], 2), "mem_bw_gbps": round4(mem_bw),
                 "cores": settings.cores},
        "pcie": {"h2d_gbps": round4(h2d), "d2h_gbps": round4(d2h), "duplex_gbps": round4(max(h2d, d2h)),
                 "pinned": False, "switch_uplink_gbps": round4(mem_bw)},
        "fabric": {"kind": "shm", "p2p_gbps": coll_net},
        "collective": coll,
        "network": {"gbps": coll_net, "latency_us": coll["latency_us"]},
        "compute": {**fit_figures(fit), "mem_gbps": round4(fit["mem_gbps"]),
                    "zo_ns_per_param": round4(m["zo_alone"]["ns_per_param"]),
                    "rank_scaling": round4(scaling), "zo_rank_scaling": round4(zo_scaling),
                    "z_call_us": round(zfit["z_call_us"], 2),
                    "z_chunk_us": round(zfit["z_chunk_us"], 3),
                    "z_ns_per_elem": round4(zfit["z_ns_per_elem"]),
                    "zo_pass_ns": round4(m["zo_alone"]["pass_ns"]),
                    "z_rank_scaling": round4(z_scaling), "mem_rank_scaling": round4(mem_scaling),
                    **({"rank_jitter": round(rank_jitter(ranks), 4)} if ranks else {})},
        "sources": sources,
        "measurements": {**m, "fit": fit, "z_fit": zfit, "together": together},
        "speed_check": m["speed_check"],
    }


def _cpu_together(ranks: dict[str, Any], settings: SampleSettings) -> dict[str, Any]:
    """Figures of the k ranks that ran at once: copy sum, forward and zo medians,
    collectives (rank 0's view)."""
    per = ranks["per_rank"]
    copy = sum(gbps(r["copy_bytes"], r["h2d"]["median_s"]) for r in per)
    return {"copy_gbps": copy,
            "forward_s": statistics.median(r["forward"]["together"]["median_s"] for r in per),
            "zo_ns_per_param": statistics.median(r["zo"]["ns_per_param"] for r in per),
            "collective": collective_figures(per[0]["allgather"], per[0]["allreduce"],
                                             settings.ranks)}


def _single_rank_collective() -> dict[str, Any]:
    return {"latency_us": 1.0, "allreduce_small_us": 1.0, "allgather_busbw": [[MIB, 100.0]]}



def cuda_profile(m: dict[str, Any], settings: SampleSettings, *, name: str, date: str, memory: dict[str, Any]) -> dict[str, Any]:
    """The profile dict of a CUDA machine, from measure_cuda's results."""
    n = settings.ranks
    h2d, d2h = median_rate(m["h2d"], "per_copy_gbps"), median_rate(m["d2h"], "per_copy_gbps")
    alone = [c["per_copy_gbps"] for c in m["h2d"]]
    pairs = {tuple(int(x) for x in key.split(",")): v["per_copy_gbps"]
             for key, v in m["pairs"].items()}
    groups = share_groups(n, alone, pairs)
    uplink = max([h2d] + [len(g) * min(pairs[(g[0], g[1])], h2d) for g in groups if len(g) > 1])
    pcie = {"h2d_gbps": round4(h2d), "d2h_gbps": round4(d2h), **duplex_figures(m, groups, uplink),
            "pinned": True, "switch_groups": groups, "switch_uplink_gbps": round4(uplink)}
    host_bw = max(m["all"]["total_gbps"], m["all_duplex"]["total_gbps"], h2d, d2h)
    fabric = fabric_from_topology(n, m["topology"])
    fabric["p2p_gbps"] = round4(m["p2p"]["gbps"]) if "p2p" in m else round4(h2d)
    hbm = hbm_from_passes(m["zo_alone"]["passes"])
    fit = fit_gpu_compute(m["forward_alone"], hbm_gbps=hbm["hbm_gbps"])
    zfit = fit_gpu_z(m["zo_alone"]["z_draws"])
    coll = collective_figures(m["nccl"]["allgather"], m["nccl"]["allreduce"], n) \
        if m["nccl"] else _single_rank_collective()
    total_gib = statistics.median(t for _, t in m["memory"]) / GIB
    used_gib = max(t - f for f, t in m["memory"]) / GIB
    sources = cuda_sources(settings, fit=fit, date=date, num_forwards=len(m["forward_alone"]),
                           uplink_duplex="uplink_h2d_duplex_gbps" in pcie)
    return {
        "schema_version": 1, "name": name, "gpus_per_node": n,
        "description": f"{n}x {m['devices'][0]} on {memory['cpu_model']} "
                       f"(measured by zoplan profile {date})",
        "device": {"kind": "cuda", "model": m["devices"][0], "memory_gib": round(total_gib, 2),
                   "reserved_gib": round(used_gib + 2.0, 2), "concurrent_engines": True,
                   "hbm_gbps": round4(hbm["hbm_gbps"]), **stage_pass_figures(hbm["passes"])},
        "host": {"memory_gib": round(memory["total_gib"], 2), "mem_bw_gbps": round4(host_bw),
                 "cores": settings.cores},
        "pcie": pcie,
        "fabric": fabric,
        "collective": coll,
        "network": {"gbps": 50.0, "latency_us": 20.0},
        "compute": {**fit_figures(fit), "rank_scaling": 1.0,
                    "z_launch_us": round(zfit["z_launch_us"], 2),
                    "z_ns_per_elem": round4(zfit["z_ns_per_elem"])},
        "sources": sources,
        "measurements": {**m, "fit": fit, "z_fit": zfit, "hbm": hbm},
    }


def stage_pass_figures(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """device.update16_gbps, perturb16_gbps, update32_gbps, perturb32_gbps: each timed zo
    pass's rate by its store (16-bit or fp32; zoplan.profiling.fits.hbm_from_passes), all
    four or none (a stage that timed fewer writes none)."""
    figures = {f"{r['pass']}{'32' if r['param_dtype'] == 'fp32' else '16'}_gbps": round4(r["gbps"])
               for r in passes}
    return figures if len(figures) == 4 else {}


def duplex_figures(m: dict[str, Any], groups: list[list[int]], uplink: float) -> dict[str, Any]:
    """pcie.h2d_duplex_gbps / d2h_duplex_gbps: each direction of one GPU's link with
    both running (median over GPUs); where GPUs share a switch uplink, the uplink's
    per-direction rates with every GPU copying both ways at once (a group's sum, median
    over groups; never above the uplink alone; the host ceiling may hold them lower)."""
    out = {f"{d}_duplex_gbps": round4(statistics.median(c["per_direction_gbps"][d]
                                                        for c in m["duplex"]))
           for d in ("h2d", "d2h")}
    shared = [g for g in groups if len(g) > 1]
    if shared:
        jobs = m["all_duplex"]["per_job"]
        for d in ("h2d", "d2h"):
            sums = [sum(j["gbps"] for j in jobs if j["device"] in g and j["direction"] == d)
                    for g in shared]
            out[f"uplink_{d}_duplex_gbps"] = round4(min(uplink, statistics.median(sums)))
    return out


# ---- rounds combined ---------------------------------------------------------------------
def combine_rounds(datas: list[dict[str, Any]]) -> dict[str, Any]:
    """One profile from the profiles of several measurement rounds: each measured
    figure (and each all-gather table entry) is the median over the rounds, so a
    machine whose speed drifts for a minute does not set the figures."""
    data: dict[str, Any] = json.loads(json.dumps(datas[0]))
    if len(datas) == 1:
        return data
    for section in ("device", "host", "pcie", "fabric", "collective", "compute"):
        for key, value in data[section].items():
            if isinstance(value, float):
                data[section][key] = round4(statistics.median(d[section][key] for d in datas))
    table = data["collective"]["allgather_busbw"]
    for i, entry in enumerate(table):
        entry[1] = round4(statistics.median(d["collective"]["allgather_busbw"][i][1] for d in datas))
    _refit_rounds(data, datas)
    if all("speed_check" in d for d in datas):
        for name in SPEED_CHECK_KINDS:
            data["speed_check"][name]["median_s"] = statistics.median(
                d["speed_check"][name]["median_s"] for d in datas)
        data["speed_check"]["probes"] = sum(d["speed_check"].get("probes", 0) for d in datas)
    for key, note in data["sources"].items():
        if note.startswith("[M]"):
            data["sources"][key] = f"{note} (median of {len(datas)} rounds)"
    data["measurements"] = {"rounds": [d["measurements"] for d in datas],
                            "per_round": [{s: d[s] for s in ("pcie", "host", "collective",
                                                             "compute")} for d in datas],
                            "fit": data.pop("measurements_fit")}
    return data


def _refit_rounds(data: dict[str, Any], datas: list[dict[str, Any]]) -> None:
    """The compute fit's figures belong together: fit once on each shape's median
    time over the rounds (not a median of each fitted figure); the same for z."""
    grids = [d["measurements"]["forward_alone"] for d in datas]
    points = [dict(p, median_s=statistics.median(g[i]["median_s"] for g in grids))
              for i, p in enumerate(grids[0])]
    if data["device"]["kind"] == "cuda":
        fit = fit_gpu_compute(points, hbm_gbps=data["device"]["hbm_gbps"])
    else:
        fit = fit_compute(points, mem_gbps=data["compute"]["mem_gbps"])
    data["compute"].update(fit_figures(fit))
    data["measurements_fit"] = fit
    draws = [d["measurements"].get("zo_alone", {}).get("z_draws") for d in datas]
    if all(draws):   # the z model's figures belong together too
        chunk = statistics.median(d["measurements"]["zo_alone"]["z_chunk"]["us_per_chunk"]
                                  for d in datas)
        zfit = fit_z([dict(p, median_s=statistics.median(g[i]["median_s"] for g in draws))
                      for i, p in enumerate(draws[0])], chunk_us=chunk)
        data["compute"].update(z_call_us=round(zfit["z_call_us"], 2),
                               z_ns_per_elem=round4(zfit["z_ns_per_elem"]),
                               z_chunk_us=round(zfit["z_chunk_us"], 3))

