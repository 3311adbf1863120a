"""GPU check: profile this machine's first CUDA GPU, then plan, run and measure an
OPT-1.3B-sized model with random weights in each update mode (docs/precision.md).

0. profile   `zoplan profile --quick -o RESULTS/profile.json` (default --profile measure;
             on failure the shipped hgx-h200 profile is used and the log says so).
1. per update mode (master, stochastic, plain):
   plan      `zoplan optimize --model M --gpus 1 --update MODE --precision P
             --placement host` (every block streamed: the transfers are measured)
   run       `zoexec run plan.json --steps N --trace DIR` (random init)
   calibrate `zoplan calibrate plan.json trace`: predicted vs measured per task kind
2. resident  the first mode's plan again with every other block resident on the device
             (plan placement "resident": no h2d/d2h, updated in place), run in this
             process (zoexec.launch.spawn.run_in_process, traced): its losses must be the
             offloaded run's bit for bit; its step time beside the offloaded one
3. slice     the update on the slice on the device (Layout.slice_update's maths, which
             one GPU cannot run as a layout: it needs a slice group): for 2 and 8
             slices of one block, z_range and the update of each slice (plain and
             stochastic rounding) give exactly the whole block's bits, timed
4. z         one block's z draw timed on the device (zoexec.maths.zo.z_block, the run's rule)
5. report    per mode: predicted vs measured step time, planned vs peak GPU memory,
             tokens/s, the first update's changed and lost shares (rank 0, block 0),
             and the overlap of transfers with compute; the resident run and the
             slice checks; z time per block.
Everything lands in the results folder (RESULTS/<mode>/plan.json, trace/, *.log,
RESULTS/summary.json, RESULTS/summary.txt). `--device-kind cpu` is the dry run of this
script that CI runs (tiny model, the shipped cpu profile).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPUTE_KINDS = ("embed", "update", "forward", "head")
TRANSFER_KINDS = ("h2d", "d2h")
MODES = ("master", "stochastic", "plain")


def _run(cmd: list[str], log: Path, *, check: bool = True) -> int:
    print("$", " ".join(cmd), flush=True)
    with log.open("w") as handle:
        done = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                              env={**os.environ, "COLUMNS": "120"})
    print(log.read_text()[-3000:], flush=True)
    if check and done.returncode:
        sys.exit(f"command failed with exit code {done.returncode}: see {log}")
    return done.returncode


def measure_profile(args, folder: Path) -> str:
    """--profile measure: profile this GPU; fall back to a shipped profile on failure."""
    if args.profile != "measure":
        return args.profile
    out = folder / "profile.json"
    code = _run([sys.executable, "-m", "zoplan.cli", "profile", "--quick", "--name",
                 "gpu-check", "-o", str(out)], folder / "profile.log", check=False)
    if code or not out.exists():
        print("zoplan profile failed: planning with the shipped hgx-h200 profile instead")
        return "hgx-h200"
    return str(out)


def check_mode(args, mode: str, profile: str, folder: Path) -> dict:
    """Plan, run and calibrate one update mode; its summary."""
    folder.mkdir(parents=True, exist_ok=True)
    plan, trace = folder / "plan.json", folder / "trace"
    _run([sys.executable, "-m", "zoplan.cli", "optimize", "--model", args.model, "--gpus", "1",
          "--profile", profile, "--batch", str(args.batch), "--seq", str(args.seq),
          "--precision", args.precision, "--update", mode, "--placement", "host", "-o", str(plan)],
         folder / "plan.log")
    _run([sys.executable, "-m", "zoexec.cli", "run", str(plan), "--init", "random", "--steps",
          str(args.steps), "--lr", str(args.lr), "--trace", str(trace), "--quiet"],
         folder / "run.log")
    _run([sys.executable, "-m", "zoplan.cli", "calibrate", str(plan), str(trace), "--profile",
          profile], folder / "calibrate.log", check=False)
    return summarise(mode, plan, trace)


def overlap(spans) -> tuple[float, float]:
    """(transfer seconds, seconds of it under a compute span) for one rank and step."""
    busy = sorted((s.start_s, s.end_s) for s in spans if s.kind in COMPUTE_KINDS)
    moved = hidden = 0.0
    for s in spans:
        if s.kind not in TRANSFER_KINDS:
            continue
        moved += s.dur_s
        hidden += sum(max(0.0, min(s.end_s, b) - max(s.start_s, a)) for a, b in busy)
    return moved, hidden


def summarise(mode: str, plan: Path, trace: Path) -> dict:
    from zoplan.trace import read_trace

    meta, spans = read_trace(trace)
    records = meta["records"][1:] or meta["records"]
    steps = sorted({s.step for s in spans})[1:] or [0]
    moved = hidden = 0.0
    for step in steps:
        a, b = overlap([s for s in spans if s.step == step and s.rank == 0])
        moved, hidden = moved + a, hidden + b
    memory = meta["host_memory"][0]
    plan_data = json.loads(plan.read_text())
    measured = [max(s.end_s for s in spans if s.step == t) - min(s.start_s for s in spans
                                                               if s.step == t) for t in steps]
    first = meta.get("first_update") or {}
    return {"update": mode, "workload": meta["workload"], "steps": meta["steps"],
            "predicted_step_time_s": plan_data["predicted"]["step_time_s"],
            "step_time_s": statistics.median(measured),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records),
            "predicted_gpu_mem_gib": plan_data["predicted"]["gpu_mem_bytes"] / 2**30,
            "gpu_peak_allocated_gib": memory.get("gpu_peak_allocated", 0) / 2**30,
            "gpu_peak_reserved_gib": memory.get("gpu_peak_reserved", 0) / 2**30,
            "first_update_changed_share": first.get("changed_share"),
            "first_update_lost_share": first.get("lost_share"),
            "transfer_s_per_step": moved / len(steps),
            "overlap_fraction": hidden / moved if moved else 0.0,
            "store_pinned": memory.get("store_pinned"),
            "losses": [r["loss"] for r in meta["records"]]}


def check_resident(args, mode: dict, folder: Path) -> dict:
    """The mode's plan with every other block resident, run here (traced, like the
    offloaded run: same seed, data and steps); the losses must be the same bits."""
    from zoexec.launch.spawn import run_in_process
    from zoexec.options import build_config
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.models import ModelSpec
    from zoplan.plan import Plan
    from zoplan.workload import Workload

    data = Plan.load(folder.parent / mode["update"] / "plan.json").data
    spec = ModelSpec.from_dict(data["model"]["spec"])
    resident = tuple(range(0, spec.num_layers, 2))
    plan = hand_plan(model=spec, layout=Layout.from_dict(data["layout"]),
                     workload=Workload.from_dict(data["workload"]), device_kind=args.device_kind,
                     profile_name=data["profile"]["name"], resident=resident)
    folder.mkdir(parents=True, exist_ok=True)
    plan.save(folder / "plan.json")
    cfg = build_config(plan=folder / "plan.json", init="random", steps=args.steps, lr=args.lr,
                       trace=folder / "trace", quiet=True)
    print(f"$ zoexec run {folder / 'plan.json'} (in this process: {len(resident)} of "
          f"{spec.num_layers} blocks resident)", flush=True)
    records = run_in_process(cfg)
    losses = [r.loss for r in records]
    summary = summarise(mode["update"], folder / "plan.json", folder / "trace")
    return {"update": mode["update"], "resident_blocks": len(resident),
            "num_blocks": spec.num_layers, "losses": losses,
            "same_losses": losses == mode["losses"],
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses, mode["losses"])),
            "step_time_s": summary["step_time_s"],
            "offloaded_step_time_s": mode["step_time_s"],
            "gpu_peak_allocated_gib": summary["gpu_peak_allocated_gib"]}


def check_slices(args) -> dict:
    """The update on the slice's maths on the device, for one block of the model: z of
    each slice (zoexec.maths.zo.z_range, cut chunks through one chunk of scratch) and the
    slice's update in the 16-bit stored precision (round to nearest and stochastic)
    equal the whole block's, bit for bit; times of the whole block and a slice."""
    import torch

    from zoexec.maths.zo import apply_update, apply_update_stochastic, z_block, z_range
    from zoexec.model.families import torch_dtype
    from zoexec.store.loading import build_parts
    from zoplan.execrules import z_chunk
    from zoplan.memory import store_stride
    from zoplan.models import get_model

    spec = get_model(args.model)
    config = {k: v for k, v in spec.hf_config.items() if k != "layer_types"}
    parts, flats = build_parts({**config, "num_hidden_layers": 1}, param_dtype=args.precision,
                               compute_dtype=args.precision)
    device = torch.device("cuda" if args.device_kind == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    specs, numel, dtype = parts.block_specs, parts.block_numel, torch_dtype(args.precision)
    whole = z_block(7, 0, specs, out=torch.empty(numel, dtype=dtype, device=device))
    update = dict(lr=1e-3, g=3.0, weight_decay=0.1, seed=7, block=0)
    theta0 = flats[0].to(device=device, dtype=dtype)
    expect = {"plain": apply_update(theta0.clone(), whole, lr=1e-3, g=3.0, weight_decay=0.1,
                                    decay_mask_or_specs=specs),
              "stochastic": apply_update_stochastic(theta0.clone(), whole, specs=specs, **update)}
    edge = torch.empty(min(z_chunk(device.type), max(s.numel for s in specs)), dtype=dtype,
                       device=device)
    out = {"block_params": numel, "slices": {}}
    for slices in (2, 8):
        size = store_stride(numel, slices=slices, local_ranks=slices) // slices
        same, times = True, []
        for index in range(slices):
            start, stop = index * size, min(numel, (index + 1) * size)
            sync()
            began = time.perf_counter()
            z = z_range(7, 0, specs, start, stop, out=torch.empty(stop - start, dtype=dtype,
                                                                  device=device), scratch=edge)
            sync()
            times.append(time.perf_counter() - began)
            same &= torch.equal(z, whole[start:stop])
            for name, want in expect.items():
                piece = theta0[start:stop].clone()
                if name == "plain":
                    apply_update(piece, z, lr=1e-3, g=3.0, weight_decay=0.1,
                                 decay_mask_or_specs=specs, start=start)
                else:
                    apply_update_stochastic(piece, z, specs=specs, start=start, **update)
                same &= torch.equal(piece, want[start:stop])
        out["slices"][str(slices)] = {"same_bits": bool(same), "z_s_per_slice": max(times)}
    return out


def z_per_block(args) -> dict:
    """One block's z draw on the device, as a run draws it (median of 10, after 2)."""
    import torch

    from zoexec.maths.zo import z_block
    from zoexec.model.families import torch_dtype
    from zoexec.store.loading import build_parts
    from zoplan.execrules import z_draw_calls
    from zoplan.models import get_model

    spec = get_model(args.model)
    config = {k: v for k, v in spec.hf_config.items() if k != "layer_types"}
    parts, _ = build_parts({**config, "num_hidden_layers": 1}, param_dtype=args.precision, compute_dtype=args.precision)
    device = torch.device("cuda" if args.device_kind == "cuda" else "cpu")
    out = torch.empty(parts.block_numel, dtype=torch_dtype(args.precision), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for index in range(12):
        sync()
        start = time.perf_counter()
        z_block(index, 0, parts.block_specs, out=out)
        sync()
        if index >= 2:
            times.append(time.perf_counter() - start)
    numels = [s.numel for s in parts.block_specs]
    return {"block_params": parts.block_numel, "draw_calls": z_draw_calls(numels, device.type),
            "z_s_per_block": statistics.median(times)}


def report(summary: dict) -> str:
    lines = [f"{summary['model']} on {summary['device']}: batch {summary['batch']} x seq "
             f"{summary['seq']}, {summary['steps']} steps, compute {summary['precision']}"]
    z = summary["z"]
    lines.append(f"z per block: {z['z_s_per_block'] * 1e3:.2f} ms ({z['block_params']:,} "
                 f"values, {z['draw_calls']} draw calls)")
    for m in summary["modes"]:
        lines.append(
            f"{m['update']:10s} step {m['step_time_s']:.3f} s (predicted "
            f"{m['predicted_step_time_s']:.3f}, error "
            f"{100 * (m['predicted_step_time_s'] - m['step_time_s']) / m['step_time_s']:+.1f}%), "
            f"{m['tokens_per_s']:,.0f} tokens/s, GPU memory peak "
            f"{m['gpu_peak_allocated_gib']:.2f} GiB allocated / {m['gpu_peak_reserved_gib']:.2f} "
            f"reserved vs {m['predicted_gpu_mem_gib']:.2f} planned, first update: "
            f"{_first_update(m)}, {100 * m['overlap_fraction']:.0f}% of transfers under compute")
    r = summary["resident"]
    lines.append(f"resident  {r['resident_blocks']} of {r['num_blocks']} blocks on the device "
                 f"({r['update']}): step {r['step_time_s']:.3f} s vs {r['offloaded_step_time_s']:.3f} "
                 f"offloaded, GPU memory peak {r['gpu_peak_allocated_gib']:.2f} GiB, losses "
                 + ("the same bits" if r["same_losses"] else
                    f"DIFFER (max {r['max_loss_diff']:.3g})"))
    for k, c in summary["slice_update"]["slices"].items():
        lines.append(f"slice update, {k} slices: z and update of each slice "
                     + ("the whole block's bits" if c["same_bits"] else "DIFFER from the whole block's")
                     + f", z {c['z_s_per_slice'] * 1e3:.2f} ms a slice")
    return "\n".join(lines)


def _first_update(mode: dict) -> str:
    """What the first update did to the stored weights of block 0 (rank 0)."""
    lost, changed = mode["first_update_lost_share"], mode["first_update_changed_share"]
    if lost is None:
        return "not measured"
    if mode["update"] == "stochastic":
        return f"{changed:.0%} of the weights moved (none lost in expectation)"
    return f"{lost:.0%} of it lost"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-1.3b")
    parser.add_argument("--profile", default="measure",
                        help="'measure' (zoplan profile this GPU), or a profile name/path")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--precision", default="fp16", help="compute precision")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--results", type=Path, required=True, help="output folder")
    parser.add_argument("--device-kind", default="cuda", help="cpu: dry run of this script")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from zoexec.runtime.hostenv import quiet_openmp

    quiet_openmp()   # as `zoexec run` does, before this process loads torch (check_resident)
    args.results.mkdir(parents=True, exist_ok=True)
    profile = measure_profile(args, args.results)
    modes = [check_mode(args, mode, profile, args.results / mode)
             for mode in args.modes.split(",")]
    summary = {"model": args.model, "device": args.device_kind, "profile": profile,
               "batch": args.batch, "seq": args.seq, "steps": args.steps,
               "precision": args.precision, "z": z_per_block(args), "modes": modes,
               "resident": check_resident(args, modes[0], args.results / "resident"),
               "slice_update": check_slices(args)}
    (args.results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = report(summary)
    (args.results / "summary.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
