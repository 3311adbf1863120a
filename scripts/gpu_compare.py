"""Stages of scripts/gpu_check.py that compare zoexec with something else on the same
device (run by scripts/gpu_stages.py):

- baselines: MeZO and ZO2 (zoexec.baselines) on the run stages' model, batch and
  precision (OPT-1.3B, 8 x 512, bf16; the dry run: tiny-opt), one build shared by both;
  zoexec's measured step (the run stages' results) over each baseline's, beside the
  same ratio from the planner (the committed plan's predicted step over
  zoplan.pricing.baselines' price of the baseline, on this GPU kind's shipped profile);
- shared-gpu: PertP 2, DDP 2 and the update on 2 slices as two processes sharing the
  one device over gloo (--backend gloo), each run's final weights against a one-rank
  run's: PertP and the slices bit for bit; DDP within float summation order (its
  shards' means differ in the last bits: tests/integration/test_zoexec_layouts.py).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from gpu_check import GPU_KINDS, plan_path

# (model, batch, seq, dtype) of the baselines: the run stages' on a GPU, tiny on the CPU
GPU_SHAPE = ("opt-1.3b", 8, 512, "bf16")
CPU_SHAPE = ("tiny-opt", 2, 32, "bf16")
# A DDP run's weights against one rank's (fp32, a few steps of lr 1e-3): the CPU
# layout tests' bound; PertP and the slices must be equal.
DDP_WEIGHT_TOL = 1e-4


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- MeZO and ZO2 ---------------------------------------------------------------------------
def baselines(args) -> dict:
    """Both baselines timed (MeZO 2 steps for each ZO2 step asked: its steps are short),
    then the ratios measured and predicted."""
    from zoexec.baselines.common import BaselineConfig, build
    from zoexec.baselines.mezo import run_mezo
    from zoexec.baselines.zo2 import run_zo2

    cuda = args.device_kind == "cuda"
    model, batch, seq, dtype = GPU_SHAPE if cuda else CPU_SHAPE
    steps = max(3, args.steps // 6) if cuda else max(2, args.steps // 6)   # the dry run: its path
    out: dict = {"model": model, "batch": batch, "seq": seq, "dtype": dtype}
    base = dict(model=model, batch=batch, seq=seq, dtype=dtype, device=args.device_kind)
    began = time.monotonic()
    parts, flats = build(BaselineConfig(**base))
    out["build_s"] = round(time.monotonic() - began, 1)
    _log(f"built {model} in {out['build_s']} s")
    measured = {}
    for name, runner, count in (("mezo", run_mezo, 2 * steps), ("zo2", run_zo2, steps)):
        cfg = BaselineConfig(**base, steps=count)
        made = (copy.deepcopy(parts), [f.clone() for f in flats]) if name == "mezo" else (parts, flats)
        result, _ = runner(cfg, built=made)
        summary = result.summary()
        (args.folder / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
        measured[name] = summary["step_s_median"]
        out[f"{name}_step_s"] = summary["step_s_median"]
        out[f"{name}_first_step_s"] = summary["step_s"][0]
        out[f"{name}_kinds_s"] = summary["kind_busy_s_median"]
        _log(f"{name}: {summary['step_s_median'] * 1e3:.1f} ms a step")
    out.update(ratios(args, measured, model=model, batch=batch, seq=seq, dtype=dtype))
    return out


def zoexec_steps(work: Path) -> dict[str, float]:
    """zoexec's measured steps from the run stages of this check (those that passed)."""
    got = {}
    for which in ("offload", "resident"):
        path = work / f"run-{which}" / "result.json"
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if result.get("ok") and result.get("measured_step_s"):
            got[which] = float(result["measured_step_s"])
    return got


# zoexec's layout set against each baseline: ZO2 streams blocks as the offloaded plan
# does; MeZO keeps every weight on the GPU as the resident plan does (and against the
# offloaded one: what a model too large for the GPU would leave).
PAIRS = (("offload", "zo2"), ("resident", "mezo"), ("offload", "mezo"))


def ratios(args, measured: dict[str, float], *, model: str, batch: int, seq: int,
           dtype: str) -> dict:
    """zoexec's step over each baseline's: measured (the run stages' figures) and
    predicted (the committed plans against zoplan.pricing.baselines on the GPU kind's
    shipped profile; on the CPU the run stages' plans against the cpu profile)."""
    from zoplan.hardware import load_profile
    from zoplan.models import get_model
    from zoplan.pricing.baselines import mezo_step, zo2_step

    out: dict = {}
    priced, planned = {}, {}
    if args.device_kind == "cuda":     # zoplan prices the baselines on GPUs only
        profile = load_profile(GPU_KINDS[args.gpu_kind][1])
        spec = get_model(model)
        priced = {"mezo": mezo_step(spec, profile, batch=batch, seq=seq, dtype=dtype).step_s,
                  "zo2": zo2_step(spec, profile, batch=batch, seq=seq, dtype=dtype,
                                  pinned=True).step_s}
        out.update({"profile": profile.name, "priced_mezo_step_s": priced["mezo"],
                    "priced_zo2_step_s": priced["zo2"]})
        for which in ("offload", "resident"):
            plan = json.loads(plan_path(args.gpu_kind, which).read_text())
            planned[which] = plan["predicted"]["step_time_s"]
    ran = zoexec_steps(args.work)
    for mine, theirs in PAIRS:
        key = f"zoexec_{mine}_over_{theirs}"
        if mine in ran:
            out[f"{key}_measured"] = ran[mine] / measured[theirs]
        if mine in planned:
            out[f"{key}_predicted"] = planned[mine] / priced[theirs]
    if not ran:
        out["note"] = "no run stage passed in this check: no measured ratio"
    return out


# ---- two ranks on one device -------------------------------------------------------------------
LAYOUT_NAMES = ("pertp2", "ddp2", "pertp2-slices2-update")
# the CPU dry run's (tests/integration/test_gpu_check.py): one two-rank layout, the one
# with the most paths (gloo's all-gathers of PertP and the update on the slices); every
# layout against one rank on the CPU: tests/integration/test_zoexec_layouts.py
CPU_LAYOUT_NAMES = ("one", "pertp2-slices2-update")


def shared_gpu(args) -> dict:
    """A one-rank run and three two-rank runs of the same model, seed and batches on this
    device; their final weights compared."""
    import torch
    from safetensors.torch import load_file

    from zoexec.config import RunConfig
    from zoexec.launch.spawn import run_in_process, spawn_local
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    layouts = {"one": Layout(), "pertp2": Layout(pertp=2), "ddp2": Layout(ddp=2),
               "pertp2-slices2-update": Layout(pertp=2, slices=2, slice_update=True)}
    if args.device_kind != "cuda":   # the dry run: the stage's path once, not every layout
        layouts = {name: layouts[name] for name in CPU_LAYOUT_NAMES}
    wl = Workload(batch=4, seq=64, param_dtype="fp32", compute_dtype="fp32", tf32=False)
    weights, out = {}, {"model": "tiny-opt", "steps": 4, "backend": "gloo"}
    for name, layout in layouts.items():
        plan = hand_plan(model="tiny-opt", layout=layout, workload=wl, device_kind=args.device_kind)
        folder = args.folder / name
        cfg = RunConfig.make(plan=plan.data, steps=4, seed=3, lr=1e-3, eps=1e-3, quiet=True,
                             out=str(folder), speed_checks=False, backend="gloo")
        began = time.monotonic()
        (run_in_process if layout.world_size == 1 else spawn_local)(cfg)
        out[f"{name}_s"] = round(time.monotonic() - began, 1)
        weights[name] = load_file(str(folder / "final" / "model.safetensors"))
        _log(f"{name}: {out[f'{name}_s']} s")
    failed = []
    for name in [n for n in LAYOUT_NAMES if n in layouts]:
        diff = max(float((weights[name][k].double() - v.double()).abs().max())
                   for k, v in weights["one"].items())
        same = all(torch.equal(weights[name][k], v) for k, v in weights["one"].items())
        out[f"{name}_same_bits"], out[f"{name}_max_weight_diff"] = same, diff
        if not (same or (name == "ddp2" and diff <= DDP_WEIGHT_TOL)):
            failed.append(name)
    out["ok"] = not failed
    if failed:
        out["error"] = f"{', '.join(failed)} differ from one rank (max_weight_diff)"
    return out
