"""Block forwards and zo maths of zoexec's own code, timed: the compute grid, the
update task, z draws and the cost of one z chunk (CPU), z draws and the zo passes
(GPU).

Points carry their work (GEMM FLOPs, attention FLOPs, element-wise outputs, weight
bytes: zoplan.models' formulas) so the planner side fits them without a model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from zoexec.maths import zo
from zoexec.maths.zo import apply_update, perturb_into, z_block
from zoexec.model.families import ModelParts, bind_block, torch_dtype
from zoexec.profiler.budget import MIN_PASSES
from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import ACTIVE_GUARD, summarize, time_samples
from zoexec.store.loading import build_parts
from zoplan.execrules import z_draw_calls, z_makespan
from zoplan.models import block_forward_work, dtype_bytes, one_block_config


def build_block(hidden: int, seq: int, *, dtype: str, device: Any, family: str = "opt") -> ModelParts:
    """zoexec's ModelParts of one block, on `device` in `dtype` (zoexec's own code)."""
    parts, flats = build_parts(one_block_config(hidden, seq, family), param_dtype=dtype,
                               compute_dtype=dtype)
    parts.to(device)
    bind_block(parts, flats[0].to(device=device, dtype=parts.dtype))
    return parts


def forward_point(hidden: int, batch: int, seq: int, stats: dict[str, Any], *, dtype_bytes: int,
                  family: str = "opt", split: bool = True) -> dict[str, Any]:
    """A timed forward (`stats`) with its work (zoplan.models.block_forward_work)."""
    return {**block_forward_work(hidden, batch, seq, dtype_bytes=dtype_bytes, family=family,
                                 split=split), **stats}


# A forward shorter than this is timed after one untimed call of the same shape: right
# after a different, larger shape it runs cold (caches, allocator, sleeping threads),
# while in a run a forward follows the same block's other stream or a block of the
# same shape (docs/measurements.md).
WARM_VISIT_BELOW_S = 0.05


def forward_grid(settings: Settings, *, dtype: str, device: Any, sync: Callable[[], Any] | None = None,
                 tick: Callable[[str], None] | None = None,
                 between: Callable[[], Any] | None = None,
                 shapes: list[tuple[str, int, int, int]] | None = None,
                 precision: str | None = None) -> list[dict[str, Any]]:
    """Timed forwards over `shapes` (default settings.forward_grid; one block built per
    family and hidden size). The shapes are timed in turn, one sample each per pass, so a
    machine whose speed drifts for some seconds slows every shape alike instead of a few
    (which would bend the fit); short shapes are warmed by an untimed call of their own
    first (WARM_VISIT_BELOW_S). `between` runs after each timed pass (the CPU's speed
    probes). Points carry their GEMM FLOPs, attention FLOPs and element-wise outputs
    apart, and `precision` (default: dtype; on GPUs "tf32" for fp32 forwards with TF32
    allowed, which the caller sets)."""
    grid = list(shapes or settings.forward_grid)
    blocks: dict[tuple[str, int], ModelParts] = {}
    jobs: list[Callable[[], Any]] = []
    longest = max(s for *_, s in grid)
    with torch.no_grad():   # as runs do (zoexec.launch.rank), not inference_mode
        for family, hidden, batch, seq in grid:
            if (family, hidden) not in blocks:
                blocks[(family, hidden)] = build_block(hidden, longest, dtype=dtype,
                                                       device=device, family=family)
            parts = blocks[(family, hidden)]
            ids = torch.randint(0, 64, (batch, seq), device=device)
            hid, ctx = parts.embed(ids)
            jobs.append(partial(parts.block_forward, hid, ctx))
        samples: list[list[float]] = [[] for _ in jobs]
        warm = [0] * len(jobs)   # untimed calls ahead of each sample (set by the first pass)
        for rep in range(settings.repeats + 1):   # the first pass warms up
            for index, (job, out) in enumerate(zip(jobs, samples)):
                if rep:
                    out += time_samples(job, repeats=1, warmup=warm[index], sync=sync)
                else:
                    first = time_samples(job, repeats=1, warmup=0, sync=sync)[0]
                    warm[index] = int(first < WARM_VISIT_BELOW_S)
            if rep and between:
                between()
            if tick:
                tick(f"block forwards{' in ' + precision if precision else ''}: pass "
                     f"{rep + 1}/{settings.repeats + 1} over {len(jobs)} shapes")
            if _late(rep, settings.repeats, f"forwards {precision or dtype}"):
                break
    points: list[dict[str, Any]] = []
    for (family, hidden, batch, seq), times in zip(grid, samples):
        stats = summarize(times)
        points.append({**forward_point(hidden, batch, seq, stats, dtype_bytes=dtype_bytes(dtype),
                                       family=family), "precision": precision or dtype})
    return points


def _late(timed: int, repeats: int, what: str) -> bool:
    """Past the time budget's deadline (the active guard's) with MIN_PASSES timed passes
    done: the grid stops there (noted as a cut stage)."""
    guard = ACTIVE_GUARD[0] if ACTIVE_GUARD else None
    if guard is None or timed < MIN_PASSES or timed >= repeats or guard.in_time():
        return False
    guard.cut.append(what)
    return True


def zo_steps(hidden: int, *, device: Any, dtype: Any = None) -> tuple[dict[str, Any], int]:
    """The parts of zoexec's update task on one real OPT block (its tensor specs, so
    z_block's chunks and threads are as in a run): z, apply_update, perturb_into."""
    parts, _ = build_parts(one_block_config(hidden, 64, "opt"))
    specs, n = parts.block_specs, parts.block_numel
    theta, z, work = (torch.randn(n, dtype=dtype or torch.float32, device=device)
                      for _ in range(3))
    steps: dict[str, Any] = {
        "z": lambda: z_block(1, 0, specs, out=z),
        "update": lambda: apply_update(theta, z, lr=1e-9, g=1.0, weight_decay=0.0,
                                       decay_mask_or_specs=specs),
        "perturb": lambda: perturb_into(work, theta, z, 1e-3),
    }
    steps["task"] = lambda: [steps[k]() for k in ("z", "update", "z", "perturb")]
    steps["numels"] = [s.numel for s in specs]
    return steps, n


def zo_costs(settings: Settings, *, device: Any, sync: Callable[[], Any] | None = None, dtype: Any = None) -> dict[str, Any]:
    """The update task of zoexec's engine (z for the deferred update, apply_update, z
    for the new perturbation, perturb_into) and each part alone; ns per block parameter.
    On the CPU also z draws of smaller blocks (-> the z model: a fixed cost per draw
    and a cost per element of the busiest thread)."""
    steps, n = zo_steps(settings.zo_hidden, device=device, dtype=dtype)
    numels = steps.pop("numels")
    out: dict[str, Any] = {"block_params": n, "hidden": settings.zo_hidden}
    for name, fn in steps.items():
        out[name] = summarize(time_samples(fn, repeats=settings.repeats, sync=sync))
    out["ns_per_param"] = out["task"]["median_s"] / n * 1e9
    if settings.device == "cpu":
        threads = torch.get_num_threads()
        kick = torch.ones(1 << 20)
        draws: list[dict[str, Any]] = []
        for hidden in settings.z_hiddens:
            # in a run a z draw follows a copy or a pass (torch's OpenMP threads still
            # spinning on the cores the z threads need): time it so, not cold
            fn, sizes = steps["z"], numels
            if hidden != settings.zo_hidden:
                small, _ = zo_steps(hidden, device=device, dtype=dtype)
                fn, sizes = small["z"], small["numels"]
            stats = summarize(time_samples(fn, repeats=settings.repeats,
                                           before=lambda: kick.mul_(1.0)))
            busiest, chunks = z_makespan(sizes, threads)
            draws.append({"hidden": hidden, "threads": threads, "busiest_elems": busiest,
                          "busiest_chunks": chunks, **stats})
        out["z_draws"] = draws
        out["z_chunk"] = z_chunk_cost(repeats=settings.repeats)
        out["pass_ns"] = (out["update"]["median_s"] + out["perturb"]["median_s"]) / 2 / n * 1e9
    return out


def z_chunk_cost(*, repeats: int, tensors: int = 256) -> dict[str, Any]:
    """The fixed cost of one z chunk (seeding a generator, slicing, the call): a z draw
    over `tensors` tiny tensors on one thread, per tensor."""
    specs = [(16 * i, 16) for i in range(tensors)]
    out = torch.empty(16 * tensors)
    stats = summarize(time_samples(lambda: z_block(3, 0, specs, out=out, num_threads=1),
                                   repeats=repeats, warmup=2))
    return {"tensors": tensors, **stats, "us_per_chunk": stats["median_s"] / tensors * 1e6}


class _Spec:
    """A tensor of a synthetic block (what zoexec.maths.zo reads of a TensorSpec)."""

    def __init__(self, offset: int, numel: int) -> None:
        self.offset, self.numel, self.decay = offset, numel, False


def gpu_zo_costs(settings: Settings, *, device: Any, sync: Callable[[], Any], dtype: str = "bf16") -> dict[str, Any]:
    """The zo maths of zoexec's update task on a GPU, in the run's 16-bit dtype `dtype`:
    z draws (zoexec.maths.zo.z_block, one generator launch per tensor on CUDA) of a block of a
    few large tensors and one of many small ones (-> a cost per launch and per element,
    the fit is zoplan.profiling.fits.fit_gpu_z); the update and perturb passes
    (apply_update, perturb_into) over the large block with a 16-bit store (plain,
    stochastic) and an fp32 one (master masters); the stochastic update
    (apply_update_stochastic) where zoexec has it. Samples carry their sizes: the planner
    side turns the passes into bytes (zoplan.pricing.zo.zo_pass_bytes)."""
    half = torch_dtype(dtype)
    out: dict[str, Any] = {"dtype": dtype, "z_draws": [], "passes": []}
    for tensors, numel in settings.z_gpu_blocks:
        specs: list[Any] = [(i * numel, numel) for i in range(tensors)]   # (offset, numel) pairs
        z = torch.empty(tensors * numel, dtype=half, device=device)
        stats = summarize(time_samples(lambda: zo.z_block(1, 0, specs, out=z),
                                       repeats=settings.repeats, warmup=2, sync=sync))
        out["z_draws"].append({"tensors": tensors, "numel": numel, "elems": tensors * numel,
                               "launches": z_draw_calls([numel] * tensors, "cuda"), **stats})
        del z
    tensors, numel = settings.z_gpu_blocks[0]
    n = tensors * numel
    z = torch.randn(n, dtype=half, device=device)
    work = torch.empty(n, dtype=half, device=device)
    for param in (dtype, "fp32"):
        theta = torch.randn(n, dtype=torch_dtype(param), device=device)
        update = summarize(time_samples(
            lambda: zo.apply_update(theta, z, lr=1e-9, g=1.0, weight_decay=0.0,
                                    decay_mask_or_specs=False),
            repeats=settings.repeats, sync=sync))
        perturb = summarize(time_samples(lambda: zo.perturb_into(work, theta, z, 1e-3),
                                         repeats=settings.repeats, sync=sync))
        out["passes"].append({"param_dtype": param, "compute_dtype": dtype, "elems": n,
                              "update": update, "perturb": perturb})
        del theta
    stochastic = getattr(zo, "apply_update_stochastic", None)
    if stochastic is not None:
        theta = torch.randn(n, dtype=half, device=device)
        specs = [_Spec(i * numel, numel) for i in range(tensors)]
        out["stochastic"] = {"elems": n, **summarize(time_samples(
            lambda: stochastic(theta, z, lr=1e-9, g=1.0, weight_decay=0.0, specs=specs,
                               seed=1, block=0),
            repeats=settings.repeats, sync=sync))}
    return out
