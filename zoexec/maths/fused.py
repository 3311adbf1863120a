"""The fused pass (`--zo-kernel fused`): zoexec.maths.counter's maths as one Triton kernel
launch per range (a block or a slice of it) and update term. A launch reads theta once,
regenerates z (and the rounding's noise) from the counter in registers, applies the
term with its rounding, writes theta, and with the last term also writes the next
perturbation: no z buffer, no scratch. Each element finds its tensor in the block's
table (spec_table: the tensors' offsets and decay, on the device once per layout) and
computes its tensor's key from the (seed, block) hash chain. zoexec.maths.counter says what is computed; this module only how,
in the same order of operations (tests/unit/test_fused_zo.py: bit for bit the same
under TRITON_INTERPRET=1).

The kernel is zoexec.maths.fused_kernels' (Triton's language, untyped for the type
checker); this module launches it through a typed face (_Kernel). Only Triton APIs
present in 3.6 (the GPU image's) and 3.9 (the CPU tests'): tl.load,
tl.store, tl.arange, tl.program_id, tl.static_range, tl.where, tl.full, tl.umulhi,
tl.sqrt_rn, tl.div_rn, .to() with bitcast. Imported only where the fused path runs
(zoexec.train.engine) or is tested: triton is the `cuda` extra's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import triton

from zoexec.maths import counter as cm
from zoexec.maths import fused_kernels, zo
from zoexec.maths.counter import Perturb, Term


class _Kernel(Protocol):
    """A Triton kernel as it is launched: kernel[grid](arguments, constants, options)."""

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]: ...


_zo_pass: _Kernel = fused_kernels._zo_pass   # triton.jit's (untyped): the launch's typed face
BLOCK = 1024   # elements a program computes

# the dtypes a kernel reads and writes: fp32, bf16 (passed as its int16 bits), fp16
F32, BF16, F16 = 0, 1, 2
_KIND = {torch.float32: F32, torch.bfloat16: BF16, torch.float16: F16}


def _i32(word: int) -> int:
    """A uint32 as the int32 of the same bits (one kernel signature for every key)."""
    return word - (1 << 32) if word >= 1 << 31 else word


def _as_kernel(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _halves(seed: int, block: int) -> tuple[int, int]:
    """The key hash after (seed, block) (zoexec.maths.zo.mix_seed's chain) as two int32."""
    h = 0x5A4F5A4F5A4F5A4F
    for part in (seed, block):
        h = zo._splitmix64(h ^ (int(part) & zo._MASK64))
    return _i32(h & cm.MASK32), _i32(h >> 32)


_TABLES: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def spec_table(specs: Sequence[Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's tensor table on `device` (each tensor's first offset, then the block's
    end: int64; each tensor's decay: int8), made once per block layout and device (the
    specs never change during a run, so no step copies it)."""
    fields = tuple((int(s.offset), int(s.numel), bool(getattr(s, "decay", False)))
                   for s in specs)
    key = (device, fields)
    if key not in _TABLES:
        stop = 0
        for offset, numel, _ in fields:
            if offset != stop:
                raise ValueError(f"the fused pass needs a block's tensors back to back: one "
                                 f"starts at {offset}, the one before ends at {stop}")
            stop = offset + numel
        starts = [offset for offset, _, _ in fields] + [stop]
        _TABLES[key] = (torch.tensor(starts, dtype=torch.int64, device=device),
                        torch.tensor([d for _, _, d in fields], dtype=torch.int8, device=device))
    return _TABLES[key]


def fused_pass(theta: torch.Tensor, *, specs: Sequence[Any], block: int, terms: Sequence[Term],
               perturb: Perturb | None = None, start: int = 0,
               kind: str = "stochastic", block_elems: int = BLOCK) -> int:
    """zoexec.maths.counter.counter_pass as Triton launches over the whole range (every
    tensor it meets): one a term (the last also writes `perturb`), or one perturbation
    alone without terms; `block_elems` elements a program (a power of two; never
    changes a bit). Returns the launches made."""
    assert kind in cm.KINDS, kind
    count = min(theta.numel(), max(0, (specs[-1].offset + specs[-1].numel if specs else 0)
                                   - start))
    if count <= 0 or (not terms and perturb is None):
        return 0
    table, decays = spec_table(specs, theta.device)
    theta_k = _as_kernel(theta)
    work_k = _as_kernel(perturb.out) if perturb is not None else theta_k
    ph = _halves(perturb.seed, block) if perturb is not None else (0, 0)
    grid = (triton.cdiv(count, block_elems),)
    jobs: list[Term | None] = list(terms) or [None]
    for number, term in enumerate(jobs):
        last = number == len(jobs) - 1
        uh = _halves(term.seed, block) if term is not None else (0, 0)
        _zo_pass[grid](
            theta_k, work_k, count, start, table, decays, len(specs), uh[0], uh[1],
            term.alpha if term is not None else 0.0, term.shrink if term is not None else 1.0,
            ph[0], ph[1], perturb.scale if perturb is not None else 0.0,
            UPDATE=term is not None, DECAY=bool(term is not None and term.decays),
            STEP=bool(term is not None and term.alpha), PERTURB=last and perturb is not None,
            THETA=_KIND[theta.dtype],
            WORK=_KIND[perturb.out.dtype] if perturb is not None else 0,
            STOCHASTIC=kind == "stochastic", N=block_elems, enable_fp_fusion=False)
    return len(jobs)
