"""What each priced term costs the winning plan, beside its physical bound.

    .venv/bin/python benchmarks/planner/cost_table.py [--model opt-175b] [--gpus 8]
        [--profile dgx-a100-80gb] [--batch 16] [--seq 512]

Runs the search (`zoplan optimize`'s), then prints two tables for the winner:
1. its step's components, per rank and step: each lane's work as the simulator prices
   it, beside a physical bound (FLOPs over the datasheet's peak, bytes over the spec
   HBM or NVLink bandwidth, launches at the fastest 5 us);
2. the priced physics term by term: the winner's layout and placement simulated again
   with that one term turned back to neutral (its profile figure reset), and the step
   it adds. Terms overlap, so the added seconds need not sum to the total.
Figures in docs/costs.md are pasted from this script's output.
"""

from __future__ import annotations

import argparse
import copy

from zoplan.hardware import HardwareProfile
from zoplan.search import resolve_request, search
from zoplan.search.evaluate import estimate_step_s
from zoplan.sim.bounds import host_lane_s, step_bounds
from zoplan.sim.costs import step_costs
from zoplan.sim.nodes import job_step_s

# Datasheet figures the bounds use (docs/sources.md: a100-ds, h100-ds); 5 us: a fast launch
# from Python (docs/sources.md: launch).
SPEC = {"dgx-a100-80gb": {"tflops": 312, "hbm_gbps": 2039, "nvlink_gbps": 300},
        "dgx-h100": {"tflops": 989, "hbm_gbps": 3350, "nvlink_gbps": 450},
        "hgx-h200": {"tflops": 989, "hbm_gbps": 4800, "nvlink_gbps": 450}}
FASTEST_LAUNCH_S = 5e-6

# Each term and how to make it neutral: (label, section, key, neutral value or a function
# of the profile giving it).
TERMS = (
    ("host lane (launches, events, z reseeds, layer calls, batch)", "compute", "launch_us", 0.0),
    ("shared SMs and HBM between the streams", "compute", "overlap_slowdown", 0.0),
    ("z arithmetic-bound (was 4 B / spec HBM)", "compute", "z_ns_per_elem",
     lambda hw: 4 / hw.figures().device.hbm_gbps),
    ("memory-bound work at an achievable HBM fraction", "device", "hbm_fraction", 1.0),
    ("slowest GPU of the node (rank jitter)", "compute", "rank_jitter", 0.0),
)


def _step(req, win, hw: HardwareProfile) -> float:
    costs = step_costs(model=req.model, profile=hw, workload=win.workload, layout=win.layout,
                       resident=win.costs.resident, period=win.costs.period)
    seconds, _, _ = estimate_step_s(costs)
    node = max(seconds, step_bounds(costs).lower_bound_s)
    return job_step_s(hw, win.layout.nodes, node)


def _neutral(hw: HardwareProfile, section: str, key: str, value) -> HardwareProfile:
    data = copy.deepcopy(hw.to_dict())
    data[section][key] = value(hw) if callable(value) else value
    if key == "launch_us":   # the whole host lane: its other figures too
        data["compute"]["z_launch_us"] = data["compute"]["overhead_us"] = 0.0
        data["host"].pop("batch_us", None)
    if key == "overlap_slowdown":   # every interference figure (zoplan.pricing.overlap)
        for other in ("overlap_gemm_slowdown", "overlap_side_slowdown"):
            if other in data["compute"]:
                data["compute"][other] = 0.0
    return HardwareProfile.from_dict(data)


def components(req, win, spec: dict) -> list[tuple[str, float, float, str]]:
    """(component, priced seconds per rank and step, bound seconds, what bounds it)."""
    c, m = win.costs, req.model
    blocks, res = c.num_blocks, c.num_resident()
    tokens = c.tokens_per_rank * c.streams
    flops = blocks * tokens * m.block_gemm_flops_per_token()
    gather_bytes = blocks * c.block_bytes * (win.layout.slices - 1) / win.layout.slices
    split = win.layout.slice_update and win.layout.slices > 1
    # a profile without datasheet figures (a user's): no bound (0.0, shown as '-')
    peak, hbm = spec.get("tflops", 0.0) * 1e12, spec.get("hbm_gbps", 0.0) * 1e9
    link = spec.get("nvlink_gbps", 0.0) * 1e9
    bound = lambda work, rate: work / rate if rate else 0.0
    # bytes per parameter (fp16): z written 2 and the perturbation pass 6 (docs/precision.md),
    # once per block on the compute lane; the slice update's z 2 + rounding SR_BYTES 42
    update_bytes = blocks * m.block_params * ((2 + 6) if split else 2 * (2 + 6))
    slice_bytes = blocks * m.block_params / win.layout.slices * (2 + 42) if split else 0.0
    rows = [("forward (compute lane)", blocks * c.forward_s, bound(flops, peak),
             "GEMM FLOPs / spec peak"),
            ("update + perturbation (compute lane)",
             res * c.resident_update_s + (blocks - res) * c.update_s,
             bound(update_bytes, hbm), "z + pass bytes / spec HBM"),
            ("slice updates (collective lane)", blocks * c.slice_s(0), bound(slice_bytes, hbm),
             "z + rounding bytes / spec HBM"),
            ("all-gathers (collective lane)", blocks * c.allgather_alone_s(0),
             bound(gather_bytes, link), "bytes / spec NVLink"),
            ("embed + head", c.embed_s + c.head_s, 0.0, "-"),
            ("host lane (rank 0)", host_lane_s(c, 0, blocks), 0.0, "-")]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="opt-175b")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--profile", default="dgx-a100-80gb")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    args = ap.parse_args()
    req = resolve_request(model=args.model, gpus=args.gpus, profile=args.profile,
                          batch=args.batch, seq=args.seq)
    win = search(req).winner
    print(f"{args.model} x {args.gpus} on {args.profile}, batch {args.batch} x {args.seq}: "
          f"{win.label} {win.update}, {win.step_time_s:.3f} s/step "
          f"(overlap factors compute x{win.costs.overlap[0]:.3f}, "
          f"slice update x{win.costs.overlap[1]:.3f}, all-gather x{win.costs.overlap[2]:.3f})")
    spec = SPEC.get(args.profile)
    if spec is None:
        print(f"(no datasheet figures for {args.profile}: the bounds are left out; "
              f"known: {', '.join(SPEC)})")
    print("\n| component (per rank, per step) | priced s | bound s | bound |")
    print("|---|---|---|---|")
    for name, priced, bound, what in components(req, win, spec or {}):
        print(f"| {name} | {priced:.3f} | {bound:.3f} | {what} |" if spec and bound else
              f"| {name} | {priced:.3f} | - | {what} |")
    print("\n| term (reset to neutral) | step without it s | it adds s |")
    print("|---|---|---|")
    full = _step(req, win, req.profile)
    for label, section, key, value in TERMS:
        if key not in req.profile.to_dict()[section]:
            continue
        without = _step(req, win, _neutral(req.profile, section, key, value))
        print(f"| {label} | {without:.3f} | {full - without:+.3f} |")
    print(f"| all terms as priced | {full:.3f} | |")


if __name__ == "__main__":
    main()
