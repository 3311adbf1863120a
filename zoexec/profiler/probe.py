"""The speed check: is this machine as fast now as when it was profiled?

A GEMM-bound and a memory-bound block forward (a shared machine's memory-bound work
drifts far more than its GEMMs) and a z draw, built once and timed on demand.
`zoplan profile` stores a check in the profile (with one-sample probes between its
forward grid's passes); `zoexec run --trace` takes one before and after its steps and a
probe between steps (zoexec.train.speed); `zoplan calibrate` compares them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from zoexec.model.adapter import Context
from zoexec.model.families import ModelParts
from zoexec.profiler.blocks import build_block, zo_steps
from zoexec.profiler.timing import summarize, time_samples

# The speed check's reference work, one entry per zoplan.execrules.SPEED_CHECK_KINDS.
SPEED_CHECKS = {"gemm": {"hidden": 512, "batch": 4, "seq": 128},
                "memory": {"hidden": 128, "batch": 8, "seq": 512},
                "z": {"hidden": 256}}


class SpeedProbe:
    """The speed check's work (SPEED_CHECKS), built once and timed on demand: a
    GEMM-bound and a memory-bound block forward and a z draw, with this process's
    threads. `check` is the speed check (medians of `repeats` samples, under a second):
    `zoplan profile` stores one in the profile, `zoexec run --trace` takes one before
    and after its steps (rank 0 alone, all cores). `sample` is one sample of each,
    cheap enough (about 0.1 s) to take every few seconds through a profile or a run,
    so that the machine's speed is known over their whole length and not only at one
    moment. `zoplan calibrate` compares them, to tell a machine that got slower from a
    wrong prediction."""

    def __init__(self) -> None:
        self.jobs: dict[str, Callable[[], Any]] = {}
        for name, shape in SPEED_CHECKS.items():
            if name == "z":
                steps, _ = zo_steps(shape["hidden"], device="cpu")
                self.jobs[name] = steps["z"]
                continue
            parts = build_block(shape["hidden"], shape["seq"], dtype="fp32", device="cpu")
            with torch.no_grad():
                hidden, ctx = parts.embed(torch.randint(0, 64, (shape["batch"], shape["seq"])))
            self.jobs[name] = partial(self._forward, parts, hidden, ctx)

    @staticmethod
    def _forward(parts: ModelParts, hidden: torch.Tensor, ctx: Context) -> None:
        with torch.no_grad():
            parts.block_forward(hidden, ctx)

    def check(self, *, repeats: int = 5) -> dict[str, Any]:
        out: dict[str, Any] = {"threads": torch.get_num_threads()}
        for name, job in self.jobs.items():
            stats = summarize(time_samples(job, repeats=repeats, warmup=2 if name == "z" else 1))
            out[name] = {**SPEED_CHECKS[name], "median_s": stats["median_s"]}
        return out

    def sample(self) -> dict[str, float]:
        """{"gemm": s, "memory": s, "z": s}: one timed call of each after an untimed one."""
        return {name: time_samples(job, repeats=1, warmup=1)[0] for name, job in self.jobs.items()}


def merge_probes(check: Mapping[str, Any], probes: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """A speed check whose medians also count one-sample probes taken around it (each
    probe one value per kind, the check's median one more)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in check.items()}
    for name in SPEED_CHECKS:
        values = [check[name]["median_s"]] + [p[name] for p in probes if name in p]
        out[name]["median_s"] = statistics.median(values)
    out["probes"] = len(probes)
    return out
