"""A profile refitted to a measurement (`zoplan calibrate --fit`).

The profile's constants are scaled so that the plan's tasks would take their measured
times: the forward model's terms (or the rank scaling with several CPU ranks), the z
model's figures or zo_ns_per_param (update), copy bandwidths (h2d, d2h), the all-gather
table and latency, and the small all-reduce; each changed figure gets a
"[M] zoplan calibrate ..." note.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Any

from zoplan.calibrate.compare import Calibration
from zoplan.hardware import HardwareProfile
from zoplan.plan import Plan
from zoplan.pricing.collectives import allgather_busbw_factor
from zoplan.pricing.compute import gemm_rate_key, has_z_model
from zoplan.pricing.lora import lora_task_times
from zoplan.pricing.tasks import task_times
from zoplan.pricing.zo import update_figures
from zoplan.sim import costs as sim_costs
from zoplan.sim import graph
from zoplan.sim.nodes import job_step_s
from zoplan.sim.simulate import simulate


@dataclass(kw_only=True)
class Refit:
    """A profile being refitted: its JSON data and the changes made."""

    data: dict[str, Any]
    date: str
    trace: str
    changes: list[tuple[str, float, float, str]] = field(default_factory=list)

    def set(self, path: str, value: float, why: str) -> None:
        section, key = path.split(".", 1)
        old = self.data[section].get(key, 0.0)
        value = float(f"{value:.4g}")
        if old == value:
            return
        self.data[section][key] = value
        self.changes.append((path, old, value, why))
        self.data["sources"][path] = f"[M] zoplan calibrate {self.date} {why} (trace {self.trace})"

    @property
    def profile(self) -> HardwareProfile:
        return HardwareProfile.from_dict(self.data, origin="refitted profile")


def _task_times(plan: Plan, profile: HardwareProfile) -> dict[str, Any]:
    """The plan's per-task times on `profile` (zoplan.pricing.tasks.task_times; LoRA's
    zoplan.pricing.lora.lora_task_times)."""
    lay, wl = plan.layout, plan.workload
    times = lora_task_times if wl.frozen_base else task_times
    return times(model=plan.model, profile=profile, workload=wl,
                 tokens=wl.priced_tokens(lay.ddp),
                            streams=2 if lay.pertp == 1 else 1, local_ranks=lay.local_ranks)


def refit_forward(fit: Refit, plan: Plan, measured_task_s: float,
                  predicted_span_s: float = 0.0) -> None:
    """Scale the compute model so the forward task takes its measured time:
    compute.rank_scaling with several CPU ranks, else every term of the forward model
    (on GPUs: the GEMM rate of the plan's precision and the HBM bandwidth).
    `predicted_span_s` (GPU plans): the plan's own span of the task, which the host
    lane and the shared GPU may stretch beyond its device time: the ratio is taken
    against it."""
    hw, lay, wl = fit.profile, plan.layout, plan.workload
    t_pred = _task_times(plan, hw)["forward_s"]
    ratio = measured_task_s / (predicted_span_s or t_pred)
    c = fit.data["compute"]
    why = f"forward task {measured_task_s * 1e3:.3f} ms measured vs {t_pred * 1e3:.3f} ms"
    if hw.is_cpu and lay.local_ranks > 1:
        fit.set("compute.rank_scaling", c["rank_scaling"] / ratio,
                f"{why} with {lay.local_ranks} ranks")
        return
    rate = gemm_rate_key(hw, wl.compute_dtype, wl.tf32)
    for key in dict.fromkeys((rate, "mem_gbps", "attn_tflops")):
        if key in c:
            fit.set(f"compute.{key}", c[key] / ratio, why)
    if not hw.is_cpu:
        fit.set("device.hbm_gbps", fit.data["device"]["hbm_gbps"] / ratio, why)
    for key in ("overhead_us", "rope_overhead_us", "elem_ns"):
        if key in c:
            fit.set(f"compute.{key}", c[key] * ratio, why)


def plan_costs(plan: Plan, profile: HardwareProfile) -> sim_costs.StepCosts:
    """The plan's step costs on `profile`: its layout and its blocks' placement."""
    resident = tuple(b["placement"] == "resident" for b in plan.data["blocks"])
    return sim_costs.step_costs(model=plan.model, profile=profile, workload=plan.workload,
                            layout=plan.layout, resident=resident, period=0)


def refit_update(fit: Refit, plan: Plan, measured_task_s: float,
                 predicted_span_s: float = 0.0) -> None:
    """Scale the zo cost so the update task takes its measured time: the z model's
    figures (or zo_ns_per_param; on GPUs the z launch and element costs) for one rank
    per device, the z (zo) rank scaling for several CPU ranks. On GPUs the passes are
    HBM time: the forward's refit (run first) has set the bandwidth. The update task is
    the plan's (with slice_update, the perturbation alone; resident blocks' own)."""
    hw, lr = fit.profile, plan.layout.local_ranks
    costs = plan_costs(plan, hw)
    t_pred = statistics.median(costs.update_task_s(b) for b in range(costs.num_blocks))
    ratio = measured_task_s / (predicted_span_s or t_pred)   # see refit_forward
    why = f"update task {measured_task_s * 1e3:.3f} ms measured vs {t_pred * 1e3:.3f} ms"
    c = fit.data["compute"]
    if hw.is_cpu and lr > 1:
        z_model = has_z_model(hw)
        key = "z_rank_scaling" if z_model else "zo_rank_scaling"
        now = c.get(key, 1.0 if z_model else c["rank_scaling"])
        fit.set(f"compute.{key}", now / ratio, f"{why} with {lr} ranks")
        return
    for key in update_figures(hw):
        fit.set(f"compute.{key}", c[key] * ratio, why)


def refit_copies(fit: Refit, cal: Calibration, plan: Plan) -> None:
    """Scale h2d / d2h bandwidth (and the host ceiling when ranks share it) by
    predicted / measured task time."""
    ratios = []
    for kind, key in (("h2d", "pcie.h2d_gbps"), ("d2h", "pcie.d2h_gbps")):
        row = cal.row(kind)
        if not row or row.meas_task_s <= 0 or row.pred_task_s <= 0:
            continue
        q = row.pred_task_s / row.meas_task_s
        ratios.append(q)
        section, name = key.split(".")
        fit.set(key, fit.data[section][name] * q,
                f"{kind} task {row.meas_task_s * 1e3:.3f} ms measured vs {row.pred_task_s * 1e3:.3f} ms")
    if not ratios:
        return
    q = statistics.geometric_mean(ratios)
    pcie = fit.data["pcie"]
    if plan.layout.local_ranks > 1:
        fit.set("host.mem_bw_gbps", fit.data["host"]["mem_bw_gbps"] * q,
                f"copies of {plan.layout.local_ranks} ranks at once: x{q:.3g}")
    if fit.profile.is_cpu:
        fit.set("pcie.duplex_gbps", max(pcie["h2d_gbps"], pcie["d2h_gbps"]),
                "a CPU rank copies one way at a time: max of the two directions")
    else:
        for key in ("h2d_duplex_gbps", "d2h_duplex_gbps", "switch_uplink_gbps",
                    "uplink_h2d_duplex_gbps", "uplink_d2h_duplex_gbps"):
            if key in pcie:
                fit.set(f"pcie.{key}", pcie[key] * q, f"copies x{q:.3g}")
    fit.set("pcie.switch_uplink_gbps", max(pcie["switch_uplink_gbps"], pcie["h2d_gbps"]),
            "not below one rank's link")
    fit.set("host.mem_bw_gbps", max(fit.data["host"]["mem_bw_gbps"], pcie["h2d_gbps"],
                                    pcie["d2h_gbps"]), "not below one rank's link")


def refit_collectives(fit: Refit, cal: Calibration, plan: Plan) -> None:
    ar = cal.row("allreduce")
    if ar and ar.meas_task_s > 0:
        fit.set("collective.allreduce_small_us", ar.meas_task_s * 1e6,
                "loss all-reduce (from the last member's arrival), median")
    ag = cal.row("allgather")
    if not ag or ag.meas_task_s <= 0:
        return
    factor = allgather_busbw_factor(fit.profile, predicted_s=ag.pred_task_s,
                                    measured_s=ag.meas_task_s)
    if factor is None:
        fit.set("collective.latency_us", ag.meas_task_s * 1e6, "all-gather shorter than the latency")
        return
    coll = fit.data["collective"]
    table = [[size, float(f"{bw * factor:.4g}")] for size, bw in coll["allgather_busbw"]]
    coll["allgather_busbw"] = table
    fit.changes.append(("collective.allgather_busbw", 1.0, factor, "table scaled"))
    fit.data["sources"]["collective.allgather_busbw"] = (
        f"[M] zoplan calibrate {fit.date} all-gather {ag.meas_task_s * 1e3:.3f} ms measured vs "
        f"{ag.pred_task_s * 1e3:.3f} ms: table x{factor:.3g} (trace {fit.trace})")


def refit_profile(profile: HardwareProfile, plan: Plan, cal: Calibration, *,
                  trace: str, date: str) -> Refit:
    """A copy of `profile` whose constants make the plan's tasks take their measured times."""
    data = copy.deepcopy(profile.to_dict())
    fit = Refit(data=data, date=date, trace=trace)
    fwd, upd = cal.row("forward"), cal.row("update")
    gpu = not profile.is_cpu   # spans that the host lane and the shared GPU stretch
    if fwd and fwd.meas_task_s > 0:
        refit_forward(fit, plan, fwd.meas_task_s, fwd.pred_task_s if gpu else 0.0)
    if upd and upd.meas_task_s > 0:
        refit_update(fit, plan, upd.meas_task_s, upd.pred_task_s if gpu else 0.0)
    refit_copies(fit, cal, plan)
    refit_collectives(fit, cal, plan)
    if cal.node_spread is not None:
        fit.set("compute.node_spread", min(cal.node_spread, 1.0),
                f"spread of the {plan.layout.nodes} nodes' own step times over "
                f"{len(cal.steps_used)} steps")
    prov = dict(data.get("provenance") or {})
    prov["calibrated"] = {"date": date, "trace": trace, "plan": cal.plan_label,
                          "step_error_pct_before": round(cal.error_pct, 2),
                          "changes": [list(c) for c in fit.changes]}
    data["provenance"] = prov
    return fit


def resimulate(plan: Plan, profile: HardwareProfile) -> float:
    """The plan's layout and placement simulated again on `profile` (one node, at the
    pace of the slowest of the plan's nodes)."""
    costs = plan_costs(plan, profile)
    node = simulate(graph.build_step_graph(costs), record_spans=False).step_time_s
    return job_step_s(profile, plan.layout.nodes, node)
