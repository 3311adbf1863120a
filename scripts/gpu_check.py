"""GPU check: what one H200 (or any single CUDA GPU) must tell about zoexec, in about 8
minutes (docs/gpu.md). Started by scripts/gpu_check.sh, which puts the carried wheels on
PYTHONPATH first.

preflight  (stops the check with one `error:` line) zoplan.cli and zoexec.train.engine
           import; a tmpfs with room holds the block store (ZOEXEC_SHM_DIR); CUDA:
           1 GiB of a tmpfs mapping page-locks (cudaHostRegister)
stages     (each with a time budget; one that fails or overruns is recorded and the
           rest go on; a stage whose input failed is skipped, never replaced):
  env        versions, GPU, SM count, memory, /dev/shm and the store's folder
  pcie       h2d, d2h and duplex at 100-400 MB, cudaHostAlloc buffers and the
             registered store (zoexec.profiler.cuda.cuda_copy)
  forward    block forwards under no_grad, OPT-1.3B- and Llama-8B-sized blocks at 4k
             and 16k tokens, bf16 (zoexec.profiler.blocks.forward_grid)
  zo         z per block and per element, the update and perturb passes, stochastic
             rounding (gpu_stages.zo_costs)
  overlap    a slice update on another stream beside a forward: each alone and both
  context    the CUDA context's bytes (a fresh process: total - free after init)
  profile    `zoplan profile --quick` of this machine
  run-MODE   (--modes, default master) plan OPT-1.3B for one GPU on that profile, `zoexec run --trace`, calibrate
  issue      host issue time per step against the GPU's time (an in-process run)
  oracle     zoexec.reference on the device against `zoexec run`: losses and weights
  slices     the update on the slice's z and update: the whole block's bits
  fit        `zoplan calibrate --fit` of the first run: a measured profile
Out (--out DIR): summary.txt, summary.json and gpu_check-files.tar.gz (logs, plans,
traces, profiles): three files, no folder. `--device-kind cpu`: the dry run CI runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
NEEDED_SHM_BYTES = 8 << 30     # the OPT-1.3B store and the copy buffers, with room
REGISTER_CHECK_BYTES = 1 << 30


class Failed(Exception):
    """A stage that could not measure what it is for (its summary says why)."""


class StageTimeout(Failed):
    pass


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


# ---- preflight -------------------------------------------------------------------------
def check_imports() -> None:
    """zoplan's CLI and zoexec's engine import here, or one line naming what is missing."""
    try:
        import zoexec.train.engine  # noqa: F401
        import zoplan.cli  # noqa: F401
    except ImportError as exc:
        name = getattr(exc, "name", None) or str(exc)
        fail(f"cannot import zoplan.cli and zoexec.train.engine: {name} is missing "
             f"({exc}); carry the wheels: bash scripts/device_wheels.sh .whl/cp312, then "
             f"bash scripts/gpu_check.sh --wheels .whl/cp312 --out DIR")


def choose_store_dir() -> Path:
    """A tmpfs with NEEDED_SHM_BYTES free for the block store (ZOEXEC_SHM_DIR if set,
    else /dev/shm, else /tmp where it is a tmpfs): a store that is a regular file
    cannot be page-locked on current kernels, so there is no disk fallback."""
    from zoexec.runtime.hostmem import filesystem_type

    given = os.environ.get("ZOEXEC_SHM_DIR")
    candidates = [Path(given)] if given else [Path("/dev/shm"), Path("/tmp")]
    seen = []
    for folder in candidates:
        kind = filesystem_type(folder / "x") if folder.is_dir() else None
        free = shutil.disk_usage(folder).free if folder.is_dir() else 0
        seen.append(f"{folder}: {kind or 'missing'}, {free / 2**30:.1f} GiB free")
        if kind == "tmpfs" and free >= NEEDED_SHM_BYTES:
            return folder
    fail(f"no tmpfs with {NEEDED_SHM_BYTES / 2**30:.0f} GiB free for the block store "
         f"({'; '.join(seen)}): mount one (mount -t tmpfs -o size=16g tmpfs /mnt/zo) and "
         f"set ZOEXEC_SHM_DIR to it")


def check_page_locking(folder: Path) -> None:
    """1 GiB of a tmpfs mapping page-locked and released, as a run's store is."""
    import torch

    from zoexec.runtime.pinning import pin_tensor, unpin_host_memory
    from zoexec.store.blocks import create_store

    if not torch.cuda.is_available():
        fail(f"no CUDA GPU visible (torch {torch.__version__}, CUDA {torch.version.cuda})")
    path = folder / f"zoexec-gpucheck-{os.getpid()}"
    try:
        store = create_store(path, num_blocks=1, block_numel=REGISTER_CHECK_BYTES,
                             stride=REGISTER_CHECK_BYTES, dtype=torch.uint8)
    finally:
        path.unlink(missing_ok=True)
    if not pin_tensor(store.flat, who="gpu_check"):
        fail(f"cudaHostRegister of 1 GiB of a mapping in {folder} failed (the line above "
             f"says why): a run's store would not be page-locked")
    unpin_host_memory(store.flat)


# ---- stages ----------------------------------------------------------------------------
def run_stage(name: str, budget_s: float, fn, results: dict) -> None:
    """Run `fn()` within `budget_s` (SIGALRM); record its result or its failure."""
    print(f"== {name} (budget {budget_s:.0f} s)", flush=True)

    def expired(signum, frame):
        raise StageTimeout(f"over its budget of {budget_s:.0f} s")
    began = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        results[name] = {"ok": True, **fn()}
    except Exception as exc:  # a stage's failure is recorded, the rest go on
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        traceback.print_exc()
        results[name] = {"ok": False, "error": reason}
        print(f"stage {name} failed: {reason}", flush=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    results[name]["seconds"] = round(time.monotonic() - began, 2)


def command(cmd: list[str], log: Path, *, timeout_s: float) -> None:
    """A command of the check (its output in `log`); Failed with its last line if it fails."""
    print("$", " ".join(cmd), flush=True)
    with log.open("w") as handle:
        try:
            done = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                                  env={**os.environ, "COLUMNS": "120"}, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise Failed(f"{' '.join(cmd[2:4])} ran over {timeout_s:.0f} s (see {log.name})") from None
    if done.returncode:
        last = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
        raise Failed(f"{' '.join(cmd[2:4])} exited {done.returncode}: {last}")


def stages(args, work: Path, results: dict) -> None:
    import gpu_stages as gs

    budget = gs.budgets(args.device_kind)
    run_stage("env", budget["env"], lambda: gs.environment(args, work), results)
    for name in ("pcie", "forward", "zo", "overlap", "context"):
        run_stage(name, budget[name], lambda name=name: getattr(gs, name)(args), results)
    run_stage("profile", budget["profile"], lambda: gs.profile(args, work, command), results)
    for mode in args.modes.split(","):
        run_stage(f"run-{mode}", budget["run"],
                  lambda mode=mode: gs.run_mode(args, work, mode, results, command,
                                                budget_s=budget["run"]), results)
    run_stage("issue", budget["issue"], lambda: gs.issue_time(args, work, results), results)
    run_stage("oracle", budget["oracle"], lambda: gs.oracle(args), results)
    run_stage("slices", budget["slices"], lambda: gs.slices(args), results)
    run_stage("fit", budget["fit"], lambda: gs.fit(args, work, results, command), results)


def finish(args, work: Path, results: dict) -> None:
    """summary.json, summary.txt and one tarball of the work folder into --out."""
    import gpu_stages as gs

    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"device_kind": args.device_kind, "model": args.model, "stages": results}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    text = gs.report(summary)
    (args.out / "summary.txt").write_text(text + "\n")
    with tarfile.open(args.out / "gpu_check-files.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu_check")
    print(text, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the three results")
    parser.add_argument("--model", default="opt-1.3b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--precision", default="bf16", help="compute precision of the runs")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--modes", default="master",
                        help="update modes to run, comma-separated (each adds up to 80 s)")
    parser.add_argument("--device-kind", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the dry run of this script (tiny shapes, the cpu profile)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as `zoexec run`, before torch loads
    folder = choose_store_dir()       # before zoexec.store reads ZOEXEC_SHM_DIR
    os.environ["ZOEXEC_SHM_DIR"] = str(folder)
    check_imports()
    if args.device_kind == "cuda":
        check_page_locking(folder)
    results: dict = {"preflight": {"ok": True, "store_dir": str(folder)}}
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = Path(tmp)
        stages(args, work, results)
        finish(args, work, results)
    failed = [name for name, r in results.items() if not r.get("ok")]
    if failed:
        print(f"stages that failed: {', '.join(failed)}", flush=True)


if __name__ == "__main__":
    main()
