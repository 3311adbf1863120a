"""Which ZO maths path a rank takes (`--zo-kernel`, zoexec.maths.paths, on the rank's device:
zoexec.runtime.device.fused_zo_problem) and what run.json's "z" records of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from zoexec.config import RunConfig
from zoexec.maths import paths as zpaths
from zoexec.maths.counter import Perturb, Term, counter_pass
from zoexec.model.families import TensorSpec
from zoexec.runtime.device import fused_zo_problem


class ZoPass(Protocol):
    """A counter path's pass over a flat range (zoexec.maths.counter.counter_pass,
    zoexec.maths.fused.fused_pass): the pending `terms`, then `perturb`."""

    def __call__(self, theta: torch.Tensor, *, specs: Sequence[TensorSpec], block: int,
                 terms: Sequence[Term], perturb: Perturb | None = ..., start: int = ...,
                 kind: str = ...) -> object: ...


def zo_kernel_of(cfg: RunConfig, device: torch.device) -> tuple[str, str | None]:
    """The ZO maths' path of a rank (zoexec.maths.paths: --zo-kernel on this device and
    workload) and why "auto" fell back to torch (None: it did not)."""
    wl = cfg.workload
    return zpaths.choose(cfg.runtime.zo_kernel, fused_problem=fused_zo_problem(device),
                         estimator=wl.estimator_spec.estimator, tuning=wl.tuning,
                         planned=wl.update_kernel)


def zo_kernel_record(cfg: RunConfig, device: torch.device) -> dict[str, str]:
    """What run.json's "z" records of the path (zoexec.run.verify: a resume must agree)."""
    path, note = zo_kernel_of(cfg, device)
    out: dict[str, str] = {"zo_kernel": path}
    if note:
        out["zo_kernel_fallback"] = note
    if path == "fused":
        import triton
        out["triton"] = triton.__version__
    return out


def zo_pass_fn(path: str) -> ZoPass | None:
    """The pass of a counter path (None: the torch path)."""
    if path == "fused":
        from zoexec.maths.fused import fused_pass
        return fused_pass
    return counter_pass if path == "counter" else None
