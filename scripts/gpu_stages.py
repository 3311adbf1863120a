"""One stage of scripts/gpu_check.py, run as its own process (the conductor kills it at
its ceiling): `python scripts/gpu_stages.py STAGE --work DIR --folder DIR/STAGE`. The
stage writes FOLDER/result.json ({"ok": true, figures...} or {"ok": false, "error"}) and
keeps its plans, traces, logs and profiles in FOLDER. On the CPU (`--device-kind cpu`,
the dry run) the shapes are tiny and the CUDA-only stages say they were skipped."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
PLANS = REPO / "scripts" / "gpu_plans"
MOUNT_POINT = Path("/mnt/zoexec-shm")
REGISTER_CHECK_BYTES = 1 << 30
GIB = 1 << 30


class Failed(Exception):
    """A stage that could not measure what it is for (its result says why)."""


BEGAN = time.monotonic()


def log(message: str) -> None:
    """A progress line in the stage's log (what was reached before a kill)."""
    print(f"[{time.monotonic() - BEGAN:6.1f} s] {message}", flush=True)


def _cuda(args) -> bool:
    return args.device_kind == "cuda"


def _skipped(what: str) -> dict:
    return {"ok": True, "skipped": f"{what} needs a CUDA GPU"}


def command(cmd: list[str], log: Path, *, env: dict | None = None,
            in_process: bool = False) -> float:
    """Run a command of the check (its output in `log`); its wall seconds, or Failed
    with its last line. `in_process`: the CPU dry run's (gpu_cli.in_process)."""
    began = time.monotonic()
    with log.open("w") as handle:
        if in_process:
            from gpu_cli import in_process as run_here
            code = run_here(cmd, handle)
        else:
            code = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                                  env={**os.environ, "COLUMNS": "120", **(env or {})}).returncode
    if code:
        last = (log.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise Failed(f"{' '.join(Path(c).name for c in cmd[2:4])} exited {code}: {last}")
    return round(time.monotonic() - began, 2)


# ---- preflight -------------------------------------------------------------------------------------
def preflight(args) -> dict:
    """Imports, the store's folder (a tmpfs with room: mounted where /dev/shm is too
    small and this is root), the GPU and its compute mode, and whether 1 GiB of a store
    mapping page-locks (if not, the runs go on through the pinned staging ring, labelled)."""
    try:
        import zoexec.train.engine  # noqa: F401
        import zoplan.cli  # noqa: F401
    except ImportError as exc:
        name = getattr(exc, "name", None) or str(exc)
        raise Failed(f"cannot import zoplan.cli and zoexec.train.engine: {name} is missing "
                     f"({exc}); carry the wheels: bash scripts/device_wheels.sh .whl/cp312, "
                     f"then bash scripts/gpu_check.sh --wheels .whl/cp312 --out DIR") from None
    out = store_folder(needed_store_bytes(args))
    if _cuda(args):
        out.update(gpu_facts())
        out.update(page_locking(Path(out["store_dir"])))
    return out


def needed_store_bytes(args) -> int:
    """The run stages' host memory (the plans' figure) and the profiler's buffers."""
    if not _cuda(args):
        return 256 << 20
    plans = [json.loads(p.read_text()) for p in sorted(PLANS.glob("*/*.plan.json"))]
    if not plans:
        raise Failed(f"no committed plans in {PLANS} (python scripts/gpu_check.py --make-plans)")
    return max(p["predicted"]["host_mem_bytes"] for p in plans) + 2 * GIB


def store_folder(needed: int) -> dict:
    """ZOEXEC_SHM_DIR if set, else /dev/shm, else /tmp where it is a tmpfs with room;
    else, as root, a tmpfs of the size needed mounted at MOUNT_POINT."""
    from zoexec.runtime.hostmem import filesystem_type

    given = os.environ.get("ZOEXEC_SHM_DIR")
    seen = []
    for folder in [Path(given)] if given else [Path("/dev/shm"), Path("/tmp")]:
        kind = filesystem_type(folder / "x") if folder.is_dir() else None
        free = shutil.disk_usage(folder).free if folder.is_dir() else 0
        seen.append(f"{folder}: {kind or 'missing'}, {free / GIB:.1f} GiB free")
        if kind == "tmpfs" and free >= needed:
            return {"store_dir": str(folder), "store_free_bytes": free, "mounted": False}
    if given or os.geteuid() != 0:
        raise Failed(f"no tmpfs with {needed / GIB:.1f} GiB free for the block store "
                     f"({'; '.join(seen)}): mount one (mount -t tmpfs -o size=16g tmpfs "
                     f"/mnt/zo) and set ZOEXEC_SHM_DIR to it")
    size_gib = -(-needed // GIB) + 1
    MOUNT_POINT.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_gib}g", "tmpfs",
                           str(MOUNT_POINT)], capture_output=True, text=True)
    if done.returncode:
        raise Failed(f"no tmpfs with room ({'; '.join(seen)}) and mounting one at "
                     f"{MOUNT_POINT} failed: {done.stderr.strip()}")
    print(f"mounted a tmpfs of {size_gib} GiB at {MOUNT_POINT} ({'; '.join(seen)})", flush=True)
    return {"store_dir": str(MOUNT_POINT), "store_free_bytes": size_gib * GIB, "mounted": True}


def gpu_facts() -> dict:
    import torch

    if not torch.cuda.is_available():
        raise Failed(f"no CUDA GPU visible (torch {torch.__version__}, CUDA {torch.version.cuda})")
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    import transformers

    return {"gpu": props.name, "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}", "gpu_total_bytes": total,
            "gpu_free_bytes": free, "compute_mode": compute_mode(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "transformers": transformers.__version__,
            "python": sys.version.split()[0]}


def compute_mode() -> str:
    """The GPU's compute mode (EXCLUSIVE_PROCESS lets one process at a time hold a
    context: the check's stages are sequential children of a parent that holds none)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def page_locking(folder: Path) -> dict:
    """1 GiB of a store mapping in `folder` page-locked and released, as a run's store is."""
    import torch

    from zoexec.runtime.pinning import pin_tensor, unpin_host_memory
    from zoexec.store.blocks import create_store

    path = folder / f"zoexec-gpucheck-{os.getpid()}"
    try:
        store = create_store(path, num_blocks=1, block_numel=REGISTER_CHECK_BYTES,
                             stride=REGISTER_CHECK_BYTES, dtype=torch.uint8)
    finally:
        path.unlink(missing_ok=True)
    began = time.perf_counter()
    pinned = pin_tensor(store.flat, who="gpu_check")
    seconds = time.perf_counter() - began
    if pinned:
        unpin_host_memory(store.flat)
        return {"store_pinned": True, "pin_gbps": REGISTER_CHECK_BYTES / seconds / 1e9}
    print("cudaHostRegister failed: the runs copy through the pinned staging ring", flush=True)
    return {"store_pinned": False}


# ---- the runs ---------------------------------------------------------------------------------------
def run_plan(args, which: str) -> dict:
    """`zoexec run --trace` of a plan, then predicted vs measured: on a GPU the committed
    plan for its kind (scripts/gpu_plans/KIND/, made from that GPU's shipped profile), on
    the CPU one made now for tiny-opt from the cpu profile."""
    from gpu_check import GPU_KINDS, plan_path

    folder = args.folder
    plan, trace = folder / "plan.json", folder / "trace"
    if _cuda(args):
        shutil.copyfile(plan_path(args.gpu_kind, which), plan)
        profile, plan_s = GPU_KINDS[args.gpu_kind][1], 0.0
    else:
        profile = "cpu"
        plan_s = command([sys.executable, "-m", "zoplan.cli", "optimize", "--model", "tiny-opt",
                          "--gpus", "1", "--profile", profile, "--batch", "2", "--seq", "32",
                          "--placement", "host" if which == "offload" else "auto", "-o", str(plan)],
                         folder / "plan.log", in_process=True)
    log("zoexec run")
    run_s = command([sys.executable, "-m", "zoexec.cli", "run", str(plan), "--init", "random",
                     "--steps", str(args.steps), "--lr", "1e-6", "--trace", str(trace), "--quiet"],
                    folder / "run.log", in_process=not _cuda(args))
    log(f"zoexec run took {run_s:.1f} s; calibrating")
    return {**summarise_run(plan, trace, profile), "plan_s": plan_s, "run_wall_s": run_s,
            "plans": args.gpu_kind if _cuda(args) else "made now (cpu)"}


def summarise_run(plan: Path, trace: Path, profile: str) -> dict:
    """Predicted vs measured step and task kinds (zoplan calibrate), planned vs peak
    GPU memory, whether the store was page-locked, the losses."""
    from zoplan.calibrate import calibrate
    from zoplan.trace import read_trace
    from zoplan.views.calibrate import render

    result = calibrate(plan=plan, trace=trace, profile=profile, skip=1, fit=False, output=None)
    cal = result.calibration
    from rich.console import Console
    with (plan.parent / "calibrate.txt").open("w") as handle:
        render(cal, Console(file=handle, width=120))
    meta, _ = read_trace(trace)
    memory = meta["host_memory"][0]
    predicted = json.loads(plan.read_text())["predicted"]
    return {"predicted_step_s": cal.pred_step_s, "measured_step_s": cal.meas_step_s,
            "error_pct": round(cal.error_pct, 1),
            "kinds": {r.kind: {"pred_busy_s": r.pred_busy_s, "meas_busy_s": r.meas_busy_s,
                               "pred_task_s": r.pred_task_s, "meas_task_s": r.meas_task_s}
                      for r in cal.rows},
            "predicted_gpu_mem_bytes": predicted["gpu_mem_bytes"],
            "gpu_peak_allocated_bytes": memory.get("gpu_peak_allocated", 0),
            "gpu_peak_reserved_bytes": memory.get("gpu_peak_reserved", 0),
            "store_pinned": memory.get("store_pinned"),
            "warnings": len(cal.warnings),
            "losses": [r["loss"] for r in meta["records"]]}


def profile(args) -> dict:
    """`zoplan profile --quick` of this machine within its time budget (inside the
    stage's ceiling) and its headline figures."""
    from gpu_check import PROFILE_BUDGET_S

    if not _cuda(args):
        return {"ok": True, "skipped": "the dry run does not profile the CPU (minutes)"}
    out = args.folder / "profile.json"
    cmd = [sys.executable, "-m", "zoplan.cli", "profile", "--quick", "--name",
           f"{args.gpu_kind}-check", "--time-budget", str(PROFILE_BUDGET_S), "-o", str(out)]
    seconds = command(cmd, args.folder / "profile.log")
    prof = json.loads(out.read_text())
    pcie, compute = prof.get("pcie", {}), prof.get("compute", {})
    return {"profile_s": seconds, "h2d_gbps": pcie.get("h2d_gbps"), "d2h_gbps": pcie.get("d2h_gbps"),
            "h2d_duplex_gbps": pcie.get("h2d_duplex_gbps"),
            "d2h_duplex_gbps": pcie.get("d2h_duplex_gbps"),
            "peak_tflops": compute.get("peak_tflops"), "z_ns_per_elem": compute.get("z_ns_per_elem"),
            "hbm_fraction": prof.get("device", {}).get("hbm_fraction")}


# ---- correctness on the device ---------------------------------------------------------------------
def oracle(args) -> dict:
    """zoexec.reference's deferred-update loop on the device against `zoexec run` of a
    one-rank plan (same model, seed, data, steps): losses and final weights."""
    import tempfile

    import torch
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
    dev = torch.device("cuda", 0) if _cuda(args) else torch.device("cpu")
    parts, flats = build_parts(model, seed=seed)
    parts.to(dev)
    flats = [f.to(dev) for f in flats]
    task = SyntheticTask(vocab=parts.config.vocab_size, seed=seed)
    history = zo2_reference_train(parts, flats, lambda s: task.batch(s, wl.batch, wl.seq).to(dev),
                                  seed=seed, lr=lr, eps=eps, weight_decay=0.0, steps=steps)
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
    same = loss_diff == 0 and weight_diff == 0
    return {"ok": same, "steps": steps, "max_loss_diff": loss_diff, "max_weight_diff": weight_diff,
            "same_bits": same, **({} if same else {"error": "zoexec run differs from the oracle"})}


def slices(args) -> dict:
    """The update on the slice on the device: z and update of each of 2 and 8 slices of
    one block are the whole block's bits."""
    from gpu_slices import check_slices

    got = check_slices("opt-1.3b" if _cuda(args) else "tiny-opt", "bf16", args.device_kind)
    same = got["slices2_same_bits"] and got["slices8_same_bits"]
    return {"ok": same, **got, **({} if same else {"error": "a slice's bits differ"})}


# ---- host issue time ------------------------------------------------------------------------------
def issue(args) -> dict:
    """Host issue time of a step: from begin_step (the device idle) to the last task
    queued (end_step's entry, before it waits), against the step's GPU time (its spans'
    extent), for OPT-1.3B-sized blocks (hidden 2048, 4 blocks) and OPT-6.7B-sized ones
    (hidden 4096, 2 blocks): the figures per block. On a GPU torch's sync debug mode
    counts every operation inside that window that makes the host wait for the device
    (there should be none) and where in Python each one was called."""
    cuda = _cuda(args)
    out = {}
    for name, model, layers in (("h2048", "opt-1.3b", 4), ("h4096", "opt-6.7b", 2)):
        if not cuda and name == "h4096":
            continue
        got = issue_of(args, name, "tiny-opt" if not cuda else model, layers)
        out.update({f"{name}_{k}": v for k, v in got.items()})
        log(f"issue {name}: {got}")
    return out


def issue_of(args, name: str, model: str, layers: int) -> dict:
    """IssueWindow over an in-process run of `layers` blocks of `model`, offloaded."""
    from zoexec.config import RunConfig
    from zoexec.launch.spawn import run_in_process
    from zoexec.runtime import lanes
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.models import get_model
    from zoplan.trace import read_trace
    from zoplan.workload import Workload

    cuda = _cuda(args)
    folder = args.folder / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(get_model(model).hf_config,
                                                        num_hidden_layers=layers)))
    wl = Workload(batch=8 if cuda else 2, seq=512 if cuda else 32, param_dtype="bf16",
                  compute_dtype="bf16", update="stochastic")
    plan = hand_plan(model=get_model(str(folder / "config.json")), layout=Layout(prefetch=3),
                     workload=wl, device_kind=args.device_kind)
    window = IssueWindow(lanes.CudaLanes if cuda else lanes.CpuLanes, debug_syncs=cuda)
    with window:
        run_in_process(RunConfig.make(plan=plan.data, steps=8, lr=1e-6,
                                      trace=str(folder / "trace"), quiet=True, speed_checks=False))
    _, spans = read_trace(folder / "trace")
    steps = sorted({s.step for s in spans})[1:]
    gpu = statistics.median(max(s.end_s for s in spans if s.step == t)
                            - min(s.start_s for s in spans if s.step == t) for t in steps)
    host = statistics.median(window.issue_s[1:])
    return {"host_issue_s_per_block": host / layers, "gpu_s_per_block": gpu / layers,
            "host_share": host / gpu,
            **({"syncs_per_step": statistics.median(window.syncs[1:]),
                "sync_sites": window.sites} if cuda else {})}


class IssueWindow:
    """Patches a lanes class's begin_step/end_step to time the host from the device
    being idle to the last task queued, counting (CUDA) the synchronising operations
    torch's sync debug mode warns of inside that window."""

    def __init__(self, kind, *, debug_syncs: bool) -> None:
        self.kind, self.debug_syncs = kind, debug_syncs
        self.issue_s: list[float] = []
        self.syncs: list[int] = []
        self.sites: dict[str, int] = {}

    def __enter__(self):
        import torch

        self.saved = (self.kind.begin_step, self.kind.end_step)
        begin, end = self.saved
        self.caught = warnings.catch_warnings(record=True)
        self.record = self.caught.__enter__()
        warnings.simplefilter("always")
        marks: list[tuple[float, int]] = []

        def timed_begin(lanes, step, *, record=True):
            begin(lanes, step, record=record)
            if record:      # a training step (not the flush or an evaluation)
                if self.debug_syncs:
                    torch.cuda.set_sync_debug_mode("warn")
                marks.append((time.monotonic(), len(self.record)))

        def timed_end(lanes):
            if marks:
                now = time.monotonic()
                if self.debug_syncs:
                    torch.cuda.set_sync_debug_mode("default")
                started, seen = marks.pop()
                self.issue_s.append(now - started)
                new = [w for w in self.record[seen:] if "synchroniz" in str(w.message)]
                self.syncs.append(len(new))
                for w in new:       # where in Python each wait was called
                    site = f"{Path(w.filename).name}:{w.lineno}"
                    self.sites[site] = self.sites.get(site, 0) + 1
            end(lanes)
        self.kind.begin_step, self.kind.end_step = timed_begin, timed_end
        return self

    def __exit__(self, *exc) -> None:
        self.kind.begin_step, self.kind.end_step = self.saved
        self.caught.__exit__(*exc)


# ---- streams side by side ----------------------------------------------------------------------------
def overlap(args) -> dict:
    """A block forward (Llama-8B-sized, 8 x 2048 tokens, bf16) on the compute stream
    beside side work of about the same length on another stream: z + update passes
    (as the update on the slice), then an H2D copy from page-locked memory. Each stream
    timed with CUDA events alone and side by side; slowdown = t_both / t_alone - 1.
    Then the copies of pinned and pageable memory, alone and both ways at once."""
    if not _cuda(args):
        return _skipped("the overlap of two streams")
    import torch

    from zoexec.maths.zo import apply_update, z_block
    from zoexec.profiler.blocks import build_block

    dev = torch.device("cuda", 0)
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    with torch.no_grad():
        parts = build_block(4096, 2048, dtype="bf16", device=dev, family="llama")
        hidden, ctx = parts.embed(torch.randint(0, 64, (8, 2048), device=dev))
        n = parts.block_numel // 8
        theta = torch.randn(n, dtype=torch.bfloat16, device=dev)
        z = torch.empty_like(theta)
        host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty_like(host, device=dev)

        def forward():
            parts.block_forward(hidden, ctx)

        def update():
            z_block(1, 0, [(0, n)], out=z)
            apply_update(theta, z, lr=1e-9, g=1.0, weight_decay=0.0, decay_mask_or_specs=False)

        def copy():
            gpu.copy_(host, non_blocking=True)
        log("overlap: block built")
        t_fwd = _median_ms(lambda: _timed([(main, forward, 1)]))[0]
        out = {"forward_ms": t_fwd}
        log(f"overlap: forward alone {t_fwd:.2f} ms")
        for name, fn in (("update", update), ("h2d", copy)):
            one = _median_ms(lambda: _timed([(side, fn, 1)]))[0]
            reps = max(1, round(t_fwd / one))
            alone = _median_ms(lambda: _timed([(side, fn, reps)]))[0]
            both = _median_ms(lambda: _timed([(side, fn, reps), (main, forward, 1)]))
            out[f"{name}_ms"] = alone
            out[f"{name}_reps"] = reps
            out[f"forward_slowdown_beside_{name}"] = both[1] / t_fwd - 1
            out[f"{name}_slowdown_beside_forward"] = both[0] / alone - 1
            log(f"overlap: {name} done")
    out.update(copies())
    return out


def _timed(work) -> list[float]:
    """Queue each (stream, fn, reps) in turn, timed with events on its stream: ms each,
    then the ms from the first start to the last end (what the host waited for all)."""
    import torch

    torch.cuda.synchronize()
    events = []
    for stream, fn, reps in work:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            for _ in range(reps):
                fn()
            end.record(stream)
        events.append((start, end))
    torch.cuda.synchronize()
    first = events[0][0]
    return [start.elapsed_time(end) for start, end in events] + \
        [max(first.elapsed_time(end) for _, end in events)]


def copies(size: int = 256 << 20) -> dict:
    """H2D and D2H of `size` bytes from page-locked and from pageable host memory, each
    direction alone and both queued at once on two streams (one host thread, as a run
    issues them): GB/s per direction, and both ways' GB/s over their common span. A
    pageable copy is staged by the driver through its own pinned buffer and the host
    waits for it: two of them do not overlap."""
    import torch

    up, down = torch.cuda.Stream(), torch.cuda.Stream()
    out = {}
    for kind, pinned in (("pinned", True), ("pageable", False)):
        host_in = torch.ones(size, dtype=torch.uint8, pin_memory=pinned)
        host_out = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        dev_in, dev_out = torch.empty_like(host_in, device="cuda"), torch.ones_like(host_in, device="cuda")

        def h2d():
            dev_in.copy_(host_in, non_blocking=True)

        def d2h():
            host_out.copy_(dev_out, non_blocking=True)
        alone_h = _median_ms(lambda: _timed([(up, h2d, 1)]))[0]
        alone_d = _median_ms(lambda: _timed([(down, d2h, 1)]))[0]
        both = _median_ms(lambda: _timed([(up, h2d, 1), (down, d2h, 1)]))
        out.update({f"{kind}_h2d_gbps": size / alone_h / 1e6, f"{kind}_d2h_gbps": size / alone_d / 1e6,
                    f"{kind}_duplex_h2d_gbps": size / both[0] / 1e6,
                    f"{kind}_duplex_d2h_gbps": size / both[1] / 1e6,
                    f"{kind}_duplex_both_gbps": 2 * size / both[2] / 1e6})
        log(f"copies: {kind} done")
    return out


def _median_ms(sample, repeats: int = 5, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        sample()
    runs = [sample() for _ in range(repeats)]
    return [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))]


# ---- device memory as NVML reports it --------------------------------------------------------------------
def context(args) -> dict:
    """Device memory NVML reports as used by this process's CUDA context, then with
    cuBLAS's handle and workspace (a bf16 and an fp32 product), against what torch's
    allocator holds: the terms a memory figure "as nvidia-smi shows" adds."""
    if not _cuda(args):
        return _skipped("the CUDA context")
    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def used() -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    before = used()
    torch.cuda.init()
    x = torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    after_context = used()
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(4096, 4096, dtype=dtype, device="cuda")
        (a @ a).sum().item()
        del a
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after_blas = used()
    reserved = torch.cuda.memory_reserved()
    del x
    return {"context_bytes": after_context - before, "blas_bytes": after_blas - after_context,
            "allocator_reserved_bytes": reserved, "used_before_bytes": before}


# the stages of their own modules, imported when they run
def _from(module: str, name: str):
    return lambda args: getattr(__import__(module), name)(args)


STAGES = {"preflight": preflight, "run-offload": lambda a: run_plan(a, "offload"),
          "run-resident": lambda a: run_plan(a, "resident"),
          "baselines": _from("gpu_compare", "baselines"),
          "shared-gpu": _from("gpu_compare", "shared_gpu"),
          "staging": _from("gpu_staging", "staging"), "profile": profile,
          "oracle": oracle, "slices": slices, "issue": issue, "overlap": overlap,
          "context": context}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=list(STAGES))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--device-kind", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--gpu-kind", default="h200", help="whose committed plans (gpu_check.GPU_KINDS)")
    parser.add_argument("--hang", action="store_true", help=argparse.SUPPRESS)  # test hook
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as `zoexec run`, before torch loads
    if args.hang:
        print(f"{args.stage}: hanging (test hook)", flush=True)
        while True:
            time.sleep(60)
    log(f"{args.stage}: started")
    try:
        result = {"ok": True, **STAGES[args.stage](args)}
    except Exception as exc:  # the stage's failure is its result; the conductor goes on
        traceback.print_exc()
        why = str(exc) if isinstance(exc, Failed) else f"{type(exc).__name__}: {exc}"
        result = {"ok": False, "error": (why.splitlines() or ["?"])[0][:500]}
    log(f"{args.stage}: {'done' if result['ok'] else 'failed'}")
    tmp = args.folder / ".result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    os.replace(tmp, args.folder / "result.json")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
