"""The stages of scripts/gpu_check.py: each returns a dict of what it measured (plain
numbers, seconds and bytes) or raises; `report` turns them into summary.txt. On the CPU
(`--device-kind cpu`, the dry run) the shapes are tiny and the CUDA-only stages say so."""

from __future__ import annotations

import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from zoexec.profiler.timing import summarize, time_samples

# the run's shapes: OPT-1.3B and Llama-3-8B blocks at 4k and 16k tokens per forward
FORWARD_SHAPES = {"cuda": [("opt", 2048, 8, 512), ("opt", 2048, 8, 2048),
                           ("llama", 4096, 8, 512), ("llama", 4096, 8, 2048)],
                  "cpu": [("opt", 64, 2, 16), ("llama", 64, 2, 16)]}
COPY_MB = {"cuda": (100, 200, 400), "cpu": ()}
Z_BLOCKS = {"cuda": [(6, 4 << 20), (96, 64 << 10)], "cpu": [(4, 4096), (32, 256)]}
BUDGETS_S = {"env": 20, "pcie": 50, "forward": 60, "zo": 40, "overlap": 30, "context": 30,
             "profile": 90, "run": 80, "issue": 45, "oracle": 45, "slices": 20, "fit": 30}


def budgets(device_kind: str) -> dict:
    """Seconds each stage may take; the CPU dry run's shapes are tiny but its processes
    start slowly on a busy machine: three times as long."""
    scale = 1 if device_kind == "cuda" else 3
    return {name: seconds * scale for name, seconds in BUDGETS_S.items()}


def _device(args) -> torch.device:
    return torch.device("cuda", 0) if args.device_kind == "cuda" else torch.device("cpu")


def _sync(args):
    return torch.cuda.synchronize if args.device_kind == "cuda" else None


def _needs_cuda(args, what: str) -> dict | None:
    return None if args.device_kind == "cuda" else {"skipped": f"{what} needs a CUDA GPU"}


# ---- environment ---------------------------------------------------------------------------
def environment(args, work: Path) -> dict:
    import transformers

    import zoexec.store.shmfiles as shm

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": torch.version.cuda,
           "shm": _disk(Path("/dev/shm")), "store_dir": _disk(shm.SHM_DIR)}
    if args.device_kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        out.update(gpu=props.name, sm_count=props.multi_processor_count,
                   gpu_total_bytes=total, gpu_free_bytes=free,
                   nccl=".".join(map(str, torch.cuda.nccl.version())),
                   capability=f"{props.major}.{props.minor}")
    (work / "environment.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def _disk(folder: Path) -> dict:
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return {"path": str(folder), "missing": True}
    return {"path": str(folder), "total_bytes": usage.total, "free_bytes": usage.free}


# ---- copies ------------------------------------------------------------------------------------
def pcie(args) -> dict:
    """h2d, d2h, duplex at each size from cudaHostAlloc buffers and the registered store."""
    skipped = _needs_cuda(args, "PCIe copies")
    if skipped:
        return skipped
    from zoexec.profiler.cuda import cuda_copy

    out = {}
    for mb in COPY_MB[args.device_kind]:
        size = mb * 10**6
        for host in ("alloc", "store"):
            for name, dirs in (("h2d", ("h2d",)), ("d2h", ("d2h",)), ("duplex", ("h2d", "d2h"))):
                got = cuda_copy([0], size, dirs, 5, host=host)
                if host == "store" and got["host"] != "store":
                    raise RuntimeError("the store mapping could not be page-locked")
                out[f"{name}_{host}_{mb}MB_gbps"] = got["per_direction_gbps"] if name == "duplex" \
                    else got["per_copy_gbps"]
    return out


# ---- compute -------------------------------------------------------------------------------------
def forward(args) -> dict:
    from zoexec.profiler.blocks import forward_grid

    shapes = FORWARD_SHAPES[args.device_kind]
    dtype = "bf16" if args.device_kind == "cuda" else "fp32"
    points = forward_grid(SimpleNamespace(forward_grid=shapes, repeats=3), dtype=dtype,
                          device=str(_device(args)), sync=_sync(args), shapes=shapes)
    return {f"{f}_h{h}_{b}x{s}_s": p["median_s"] for (f, h, b, s), p in zip(shapes, points)}


def zo(args) -> dict:
    """z per block and per element, the update and perturb passes, stochastic rounding."""
    from zoexec.profiler.blocks import gpu_zo_costs

    settings = SimpleNamespace(z_gpu_blocks=Z_BLOCKS[args.device_kind], repeats=5)
    got = gpu_zo_costs(settings, device=str(_device(args)), sync=_sync(args) or (lambda: None),
                       dtype="bf16")
    out = {}
    for draw in got["z_draws"]:
        key = f"z_{draw['tensors']}x{draw['numel']}"
        out[f"{key}_s"] = draw["median_s"]
        out[f"{key}_ps_per_elem"] = draw["median_s"] / draw["elems"] * 1e12
    for p in got["passes"]:
        out[f"update_{p['param_dtype']}_ps_per_elem"] = p["update"]["median_s"] / p["elems"] * 1e12
        out[f"perturb_{p['param_dtype']}_ps_per_elem"] = p["perturb"]["median_s"] / p["elems"] * 1e12
    if "stochastic" in got:
        sr = got["stochastic"]
        out["stochastic_update_ps_per_elem"] = sr["median_s"] / sr["elems"] * 1e12
    return out


def overlap(args) -> dict:
    """A slice update (z draw + update of 1/8 of a Llama-8B block) on a second stream
    beside a block forward: each alone, then both; the slowdown of each."""
    skipped = _needs_cuda(args, "the overlap of two streams")
    if skipped:
        return skipped
    from zoexec.maths.zo import apply_update, z_block
    from zoexec.profiler.blocks import build_block

    dev = _device(args)
    with torch.no_grad():
        parts = build_block(4096, 2048, dtype="bf16", device=dev, family="llama")
        hidden, ctx = parts.embed(torch.randint(0, 64, (8, 2048), device=dev))
        n = parts.block_numel // 8
        theta = torch.randn(n, dtype=torch.bfloat16, device=dev)
        z = torch.empty_like(theta)
        side = torch.cuda.Stream()

        def fwd():
            parts.block_forward(hidden, ctx)

        def upd():
            with torch.cuda.stream(side):
                z_block(1, 0, [(0, n)], out=z)
                apply_update(theta, z, lr=1e-9, g=1.0, weight_decay=0.0, decay_mask_or_specs=False)

        def sync():
            torch.cuda.synchronize()
        alone_f = summarize(time_samples(fwd, repeats=5, warmup=2, sync=sync))["median_s"]
        alone_u = summarize(time_samples(upd, repeats=5, warmup=2, sync=sync))["median_s"]
        both = summarize(time_samples(lambda: (upd(), fwd()), repeats=5, warmup=2,
                                      sync=sync))["median_s"]
    return {"forward_s": alone_f, "slice_update_s": alone_u, "both_s": both,
            "serial_s": alone_f + alone_u, "slowdown_of_longer": both / max(alone_f, alone_u)}


def context(args) -> dict:
    """The CUDA context's device bytes: a fresh process's total - free right after
    CUDA starts (the GPU otherwise idle: this check's own process holds its context too,
    so the figure is the difference of two readings)."""
    skipped = _needs_cuda(args, "the CUDA context")
    if skipped:
        return skipped
    import subprocess

    code = ("import torch; torch.cuda.init(); torch.empty(1, device='cuda'); "
            "f, t = torch.cuda.mem_get_info(); print(t - f)")
    before_free, total = torch.cuda.mem_get_info(0)
    used_with_child = int(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                         text=True, check=True, timeout=60).stdout.split()[-1])
    return {"context_bytes": used_with_child - (total - before_free),
            "used_by_this_process_bytes": total - before_free}


# ---- runs ----------------------------------------------------------------------------------------
def profile(args, work: Path, command) -> dict:
    if args.device_kind != "cuda":
        return {"profile": "cpu", "measured": False}
    out = work / "profile.json"
    command([sys.executable, "-m", "zoplan.cli", "profile", "--quick", "--name", "h200-check",
             "-o", str(out)], work / "profile.log", timeout_s=BUDGETS_S["profile"] - 5)
    return {"profile": str(out), "measured": True}


def run_mode(args, work: Path, mode: str, results: dict, command, *, budget_s: float) -> dict:
    """Plan, run (traced) and calibrate one update mode on the measured profile."""
    prof = results.get("profile", {})
    if not prof.get("ok"):
        raise RuntimeError("no measured profile (stage profile failed): nothing to plan on")
    folder = work / f"run-{mode}"
    folder.mkdir()
    model = args.model if args.device_kind == "cuda" else "tiny-opt"
    plan, trace = folder / "plan.json", folder / "trace"
    command([sys.executable, "-m", "zoplan.cli", "optimize", "--model", model, "--gpus", "1",
             "--profile", prof["profile"], "--batch", str(args.batch), "--seq", str(args.seq),
             "--precision", args.precision, "--update", mode, "--placement", "host",
             "-o", str(plan)], folder / "plan.log", timeout_s=0.15 * budget_s)
    command([sys.executable, "-m", "zoexec.cli", "run", str(plan), "--init", "random",
             "--steps", str(args.steps), "--lr", str(args.lr), "--trace", str(trace), "--quiet"],
            folder / "run.log", timeout_s=0.6 * budget_s)
    command([sys.executable, "-m", "zoplan.cli", "calibrate", str(plan), str(trace),
             "--profile", prof["profile"]], folder / "calibrate.log", timeout_s=0.2 * budget_s)
    summary = summarise_run(plan, trace)
    if args.device_kind == "cuda" and not summary["store_pinned"]:
        raise RuntimeError("the run's store was not page-locked (its copies went through "
                           "the staging slots): its times are not the pinned path's")
    return {"plan": str(plan), "trace": str(trace), **summary}


def summarise_run(plan: Path, trace: Path) -> dict:
    """Predicted vs measured step time and GPU memory of a traced run."""
    from zoplan.trace import read_trace

    meta, spans = read_trace(trace)
    steps = sorted({s.step for s in spans})[1:] or [0]
    measured = [max(s.end_s for s in spans if s.step == t) - min(s.start_s for s in spans
                                                               if s.step == t) for t in steps]
    data = json.loads(plan.read_text())
    memory = meta["host_memory"][0]
    return {"predicted_step_time_s": data["predicted"]["step_time_s"],
            "step_time_s": statistics.median(measured),
            "predicted_gpu_mem_bytes": data["predicted"]["gpu_mem_bytes"],
            "gpu_peak_allocated_bytes": memory.get("gpu_peak_allocated", 0),
            "gpu_peak_reserved_bytes": memory.get("gpu_peak_reserved", 0),
            "store_pinned": memory.get("store_pinned"),
            "losses": [r["loss"] for r in meta["records"]]}


def issue_time(args, work: Path, results: dict) -> dict:
    """Host issue time per step (begin_step to end_step's entry: the host enqueuing the
    four lanes' tasks) against the step's GPU time (its spans' extent), in a run of the
    first mode's plan in this process."""
    from zoexec.launch.spawn import run_in_process
    from zoexec.options import build_config
    from zoexec.runtime import lanes

    first = next((r for k, r in results.items() if k.startswith("run-") and r.get("ok")), None)
    if first is None:
        raise RuntimeError("no run stage succeeded: no plan to time")
    marks: list[float] = []
    issue: list[float] = []
    kind = lanes.CudaLanes if args.device_kind == "cuda" else lanes.CpuLanes
    begin, end = kind.begin_step, kind.end_step

    def timed_begin(self, *a, **k):
        begin(self, *a, **k)
        marks.append(time.monotonic())

    def timed_end(self):
        issue.append(time.monotonic() - marks[-1])
        end(self)
    kind.begin_step, kind.end_step = timed_begin, timed_end
    try:
        cfg = build_config(plan=Path(first["plan"]), init="random", steps=max(4, args.steps // 2),
                           lr=args.lr, trace=work / "issue-trace", quiet=True)
        run_in_process(cfg)
    finally:
        kind.begin_step, kind.end_step = begin, end
    gpu = summarise_run(Path(first["plan"]), work / "issue-trace")["step_time_s"]
    host = statistics.median(issue[1:] or issue)
    return {"host_issue_s_per_step": host, "gpu_step_s": gpu, "host_share": host / gpu}


def oracle(args) -> dict:
    """zoexec.reference's deferred-update loop on the device against `zoexec run` of a
    one-rank plan (same model, seed, data, steps): losses and final weights."""
    from safetensors.torch import load_file

    from zoexec.config import RunConfig
    from zoexec.data.text import SyntheticTask
    from zoexec.launch.spawn import run_in_process
    from zoexec.model.export import export_weights
    from zoexec.reference import zo2_reference_train
    from zoexec.store.loading import build_parts
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    model, seed, steps, lr, eps = "tiny-opt", 3, 4, 1e-3, 1e-3
    wl = Workload(batch=4, seq=64, param_dtype="fp32", compute_dtype="fp32", tf32=False)
    dev = _device(args)
    parts, flats = build_parts(model, seed=seed)
    parts.to(dev)
    flats = [f.to(dev) for f in flats]
    task = SyntheticTask(vocab=parts.config.vocab_size, seed=seed)
    history = zo2_reference_train(parts, flats, lambda s: task.batch(s, wl.batch, wl.seq).to(dev),
                                  seed=seed, lr=lr, eps=eps, weight_decay=0.0, steps=steps)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        parts.to("cpu")
        export_weights(parts, [f.cpu() for f in flats], Path(tmp) / "ref")
        want = load_file(str(Path(tmp) / "ref" / "model.safetensors"))
        plan = hand_plan(model=model, layout=Layout(), workload=wl, device_kind=args.device_kind)
        records = run_in_process(RunConfig.make(plan=plan.data, steps=steps, seed=seed, lr=lr,
                                                eps=eps, quiet=True, out=str(Path(tmp) / "run"),
                                                speed_checks=False))
        got = load_file(str(Path(tmp) / "run" / "final" / "model.safetensors"))
    loss_diff = max(abs(r.loss_plus - h[0]) for r, h in zip(records, history))
    weight_diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    return {"steps": steps, "max_loss_diff": loss_diff, "max_weight_diff": weight_diff,
            "same_bits": loss_diff == 0 and weight_diff == 0}


def slices(args) -> dict:
    """The update on the slice on the device: z and update of each of 2 and 8 slices
    of one block are the whole block's bits (gpu_check's earlier check, kept)."""
    from gpu_slices import check_slices

    model = args.model if args.device_kind == "cuda" else "tiny-opt"
    return check_slices(model, args.precision, args.device_kind)


def fit(args, work: Path, results: dict, command) -> dict:
    """`zoplan calibrate --fit` of the first run: the profile refitted to what ran."""
    first = next((r for k, r in results.items() if k.startswith("run-") and r.get("ok")), None)
    if first is None:
        raise RuntimeError("no run stage succeeded: nothing to fit")
    out = work / "fitted-profile.json"
    command([sys.executable, "-m", "zoplan.cli", "calibrate", first["plan"], first["trace"],
             "--profile", results["profile"]["profile"], "--fit", "-o", str(out)],
            work / "fit.log", timeout_s=BUDGETS_S["fit"] - 5)
    if not out.is_file():
        raise RuntimeError("calibrate --fit wrote no profile")
    return {"fitted_profile": out.name}


# ---- the report ----------------------------------------------------------------------------------
def report(summary: dict) -> str:
    """summary.txt: one line per stage, its figures or why it failed."""
    lines = [f"gpu_check on {summary['device_kind']} ({summary['model']})"]
    for name, result in summary["stages"].items():
        if not result.get("ok"):
            lines.append(f"{name:10s} FAILED: {result.get('error')}")
            continue
        figures = {k: v for k, v in result.items() if k not in ("ok", "losses", "plan", "trace")}
        lines.append(f"{name:10s} " + ", ".join(f"{k}={_fmt(v)}" for k, v in figures.items()))
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)
