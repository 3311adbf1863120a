"""Which implementation of the ZO maths a run uses (`--zo-kernel`): "torch" (zoexec.maths.zo
and .estimators: z from torch's generators into buffers, the CPU's default), "counter"
(zoexec.maths.counter: the counter-based z in plain torch, any device) or "fused"
(zoexec.maths.fused: the same maths as one Triton pass, CUDA). "counter" and "fused"
are one maths, bit for bit (on the CPU, through Triton's interpreter); "torch" is
another z. run.json records the path a run used (its "z"), and a resume on another
path is refused.

The counter path covers the mezo estimator (any number of directions) on full tuning.
lowrank's U V^T is a product, not an element-wise draw, and sparse's mask needs each
tensor's quantile of the weights the pass is updating (a second pass): neither goes
through one element-wise pass, and LoRA and prefix tuning keep their adapters' own
step (zoexec.train.lora). For those "auto" falls back to torch, saying why in run.json;
"counter" or "fused" named for them is refused.
"""

from __future__ import annotations

from zoplan.errors import ZoError

ZO_KERNELS = ("auto", "torch", "counter", "fused")


def unsupported(*, estimator: str, tuning: str) -> str | None:
    """Why the counter maths cannot run this workload (None: it can)."""
    if estimator != "mezo":
        return f"the {estimator} estimator draws its directions with torch (not element-wise z)"
    if tuning != "full":
        return f"{tuning} tuning keeps its adapters' own step (zoexec.train.lora)"
    return None


def choose(choice: str, *, fused_problem: str | None, estimator: str,
           tuning: str, planned: str = "fused") -> tuple[str, str | None]:
    """(the path a run takes, why "auto" fell back to torch or None) for `--zo-kernel
    choice`; ZoError for a named path that cannot run (`fused_problem`: why the fused
    kernel cannot run on the rank's device, zoexec.runtime.device.fused_zo_problem).
    `planned` is the update kernel the plan priced (its workload's update_kernel): "auto"
    takes the fused pass only where the plan priced it, so the measured step is the one
    predicted; a plan of the torch path runs the torch path unless a kernel is named."""
    if choice not in ZO_KERNELS:
        raise ZoError(f"--zo-kernel {choice!r}: one of {', '.join(ZO_KERNELS)}")
    if choice == "torch":
        return "torch", None
    why = unsupported(estimator=estimator, tuning=tuning)
    if choice == "auto":
        if fused_problem is not None:
            return "torch", None
        if planned != "fused":
            return "torch", None
        return ("torch", why) if why else ("fused", None)
    if why:
        raise ZoError(f"--zo-kernel {choice}: {why}; use --zo-kernel torch (or auto)")
    if choice == "fused" and fused_problem is not None:
        raise ZoError(f"--zo-kernel fused: {fused_problem}; --zo-kernel counter runs the same "
                      f"maths in plain torch")
    return choice, None
